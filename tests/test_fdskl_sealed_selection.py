"""The kernel width chosen under the sealed protocol (issue 40, ``selection.select_width_sealed``), over real processes
(Q = 3 and the dealer).

* Each candidate is a sealed run on the selection rows: its held-out f, opened to the active party, is f of the
  averaged model its float twin trains (momentum SGD on the same features, batches and steps), and the scores and
  the pick follow from it; every rank (the dealer too) trains the final model at the chosen width.
* The bytes every rank sends in the selection are ``traffic.sealed_selection_bytes``, exactly.
* No candidate's coefficients are opened: per candidate the active party receives training's messages (a D / 2 +
  B vector from H and from the dealer per iteration) and, once, a D / 2 + |H| vector from each with f on the
  held-out rows; the passive parties and the dealer get the winner's index (one small JSON message) beyond the
  candidates' uniform training messages.
"""

import math
import warnings

import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import Circle, FDSKLClassifier, FourierSampler, get_loss, selection
from vfltorch.kernels.random_features import counter_words, derive_key
from vfltorch.kernels.sealed import MU_NUM, MU_SHIFT
from vfltorch.kernels.trainer import BatchSampler

CONFIG = DataConfig(dataset="breast_cancer", scale="minmax", seed=0)
GRID = (1.0, 0.02)                     # a width 50x too narrow memorises the selection rows
PARAMS = dict(protocol="sealed", sigma_grid=GRID, n_components=64, features_per_step=16, epochs=2, random_state=3)
SQRT2 = math.sqrt(2.0)


def job(fed):
    warnings.simplefilter("ignore")
    selection.SELECT_MIN_ROWS = 100           # breast_cancer's 427 training rows: run the selection anyway
    selection.SELECT_EPOCHS = 1.0
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    est = FDSKLClassifier(fed, **PARAMS)
    start = len(fed.transcript.messages)
    if data is None:
        est.fit(None)
    else:
        est.fit(data.X_train, data.y_train, columns=data.columns)
    sent = {k: v["bytes_sent"] for k, v in fed.meter.as_dict().items() if k.startswith(selection.SELECT_PHASE + "/")}
    out = {"multiplier": est.sigma_multiplier_, "scores": est.sigma_scores_, "sigma": est.sigma_,
           "select_bytes": sum(sent.values()),
           "sent": [(m.src, m.dst, m.tensor.numel(), m.phase) for m in fed.transcript.messages[start:]]}
    if fed.is_active:
        out["y"] = torch.as_tensor(est._encode_targets(data.y_train, len(data.y_train)), dtype=torch.float64)
        out["accuracy"] = est.score(data.X_test, data.y_test)
    elif fed.is_data_party:
        est.decision_function(data.X_test)
    if data is None:
        est.decision_function()
    return out


@pytest.fixture(scope="module")
def run():
    return launch(job, 3, coordinator=True, record_transcript=True)


def candidate_twin(X, y, sigma, c, est):
    """f on the held-out rows of candidate c's averaged model, in float64 (sealed.py's steps, no fixed point)."""
    rows, held = selection.selection_rows(X.shape[0], derive_key(est.random_state, 0x5E1))
    Dh = est._n_blocks() // 2 * est.features_per_step
    features = torch.arange(Dh)
    W = FourierSampler(est.kernel, sigma * c, est.random_state).omega(torch.arange(X.shape[1]), features)
    b = Circle(16).decode(counter_words(derive_key(est.random_state, 0xB0B), features, 16))
    phi = SQRT2 * torch.cos(X @ W + b)
    cfg = est._config(get_loss("logistic"), len(rows), 16.0 / Dh)
    sampler = BatchSampler(len(rows), cfg.batch_size, cfg.seed)
    T = math.ceil(1.0 * sampler.per_epoch - 1e-9)
    mu = MU_NUM / 2 ** MU_SHIFT
    alpha, m, total = torch.zeros(Dh, dtype=torch.float64), torch.zeros(Dh, dtype=torch.float64), 0.0
    P, yS = phi[rows], y[rows]
    for t in range(T):
        batch = sampler.next()
        g = P[batch].T @ cfg.loss.derivative(P[batch] @ alpha, yS[batch])
        m = mu * m + g
        alpha = alpha - cfg.gamma / sampler.batch_size * m
        if t >= T // 2:
            total = total + alpha
    return phi[held] @ (total / (T - T // 2)), y[held], T, len(held), sampler.batch_size


def test_sealed_selection_picks_what_its_twin_picks_at_every_rank(run):
    A = run[0]
    assert [r["multiplier"] for r in run] == [1.0] * 4            # the dealer too
    X = torch.as_tensor(load_party_data(Federation.local(), CONFIG).X_train, dtype=torch.float64)
    est = FDSKLClassifier(**PARAMS)
    sigma = A["sigma"] / A["multiplier"]                           # the median width
    by = {s["multiplier"]: s for s in A["scores"]}
    for c in GRID:
        f, y_held, _, h, _ = candidate_twin(X, A["y"], sigma, c, est)
        acc = float(((f >= 0).to(torch.float64) * 2 - 1 == y_held).to(torch.float64).mean())
        loss = float(get_loss("logistic").value(f, y_held).mean())
        print(f"\ncandidate {c}: sealed accuracy {by[c]['accuracy']:.4f} loss {by[c]['loss']:.4f}; "
              f"twin {acc:.4f} {loss:.4f}")
        assert abs(by[c]["accuracy"] - acc) <= 2 / h + 1e-9
        assert by[c]["loss"] == pytest.approx(loss, rel=0.05, abs=0.01)
    assert by[1.0]["accuracy"] > by[0.02]["accuracy"] + 0.1
    assert A["accuracy"] > 0.9


def test_no_candidate_model_is_opened(run):
    A, H, P2, dealer = 0, 1, 2, 3
    X = torch.as_tensor(load_party_data(Federation.local(), CONFIG).X_train, dtype=torch.float64)
    est = FDSKLClassifier(**PARAMS)
    Dh = est._n_blocks() // 2 * est.features_per_step
    for k, c in enumerate(GRID):
        _, _, T, h, B = candidate_twin(X, run[0]["y"], 1.0, c, est)
        phase = f"{selection.SELECT_PHASE}/{k}"
        sent = [m for r in run for m in r["sent"] if m[3].startswith(phase)]

        def got(dst, src, within=None):
            return sorted(m[2] for m in sent if m[1] == dst and m[0] == src
                          and (within is None or m[3] == within or m[3].startswith(within + "/")))

        # A, in the candidate's training: per iteration one Dh + B vector from H and from the dealer, and no
        # Dh-vector at the end (the coefficients stay in shares); once, f on the held-out rows from each
        train = [m for m in sent if m[3] == phase]
        assert sorted(m[2] for m in train if m[:2] == (dealer, A)) == sorted([2] + [Dh + B] * T)
        assert [m for m in train if m[:2] == (H, A) and m[2] == Dh] == []
        assert got(A, dealer, f"{phase}/held-out") == [Dh + h]
        assert got(A, H, f"{phase}/held-out") == sorted([h * Dh, Dh + h])    # the rows' masked phases, then f
        assert got(P2, A) == [] and got(dealer, A) == []
    # beyond the candidates' messages, the other ranks get the index from A: one small message each
    # (a JSON broadcast: its length, then its bytes)
    for rank in (H, P2, dealer):
        index = [m for r in run for m in r["sent"] if m[3] == selection.SELECT_PHASE and m[1] == rank]
        assert len(index) == 2 and all(m[0] == A for m in index) and sum(m[2] for m in index) < 64


def test_the_selection_bytes_follow_the_formula(run):
    from vfltorch.kernels.sealed import setup_rows, steps_of
    from vfltorch.kernels.traffic import sealed_selection_bytes

    X = load_party_data(Federation.local(), CONFIG).X_train
    est = FDSKLClassifier(**PARAMS)
    rows, held = selection.selection_rows(len(X), derive_key(est.random_state, 0x5E1))
    Dh = est._n_blocks() // 2 * est.features_per_step
    B = est._batch_size(len(rows))
    expected = sealed_selection_bytes(3, Dh, len(rows), len(held), B, steps_of(len(rows), B, 1.0),
                                      setup_rows(Dh, est.max_elements), est.max_elements // Dh, len(GRID))
    assert sum(r["select_bytes"] for r in run) == expected
    # chunked: 3,000 held-out rows at D / 2 = 768 take five setup chunks and one f message per holder
    one = sealed_selection_bytes(2, 768, 6000, 3000, 46, 196, setup_rows(768, 2 ** 22), 2 ** 22 // 768, 1)
    assert one == (32 * (9 + 5) + 9000 * 768 * 34) + 196 * 24 * (46 + 768) + 48 + 16 * (768 + 3000)
