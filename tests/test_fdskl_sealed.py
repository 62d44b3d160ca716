"""FDSKL's sealed protocol (issue 35, ``vfltorch/kernels/sealed.py``) over real processes (Q = 3 and a dealer).

* It trains the model its centralised twin trains: momentum SGD on the same random features, the same public
  batches and the same averaged iterate, written here from the equations in floating point.
* Each role receives exactly the messages ``sealed.ROLES`` lists: the active party A, per iteration, a D-vector
  and a B-vector from H and from the dealer (masked shares of alpha and of f) and, once, the trained
  coefficients; the dealer only V - M1 once per row, nothing per iteration.
* The gradient attack (``fdskl_view``) has nothing to solve: A is opened no gradient sum.
* ``check_sealed`` refuses a run whose opened model could determine the passive values, and the attack on the
  opened model shows why (slow: it rebuilds the passive columns of a few rows from the model alone, and finds
  nothing beyond the own-column regression on a real run).
"""

import math
import warnings

import numpy as np
import pytest
import torch

from fdskl_view import (column_r2, momentum_weights, own_column_baseline, public_view, record_active_view,
                        solve_batch)
from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.kernels import Circle, FDSKLClassifier, FourierSampler, LeakWarning, get_loss
from vfltorch.kernels.random_features import counter_words, derive_key
from vfltorch.kernels.sealed import MU_NUM, MU_SHIFT, check_sealed
from vfltorch.kernels.trainer import TRAIN_PHASE, BatchSampler
from conftest import as_torch

CONFIG = DataConfig(dataset="breast_cancer", scale="minmax", seed=0)
PARAMS = dict(protocol="sealed", epochs=3, random_state=4)
MONITOR = 100                                        # held-out rows whose f the active party is opened per epoch
SQRT2 = math.sqrt(2.0)


def sealed_job(fed, params):
    view = {}
    if fed.is_active:
        record_active_view(view)
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    est = FDSKLClassifier(fed, **params)
    start = len(fed.transcript.messages)
    if data is None:
        est.fit(None, monitor=(torch.zeros(MONITOR, 0), None))
        out = {}
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est.fit(data.X_train, data.y_train, columns=data.columns,
                    monitor=(data.X_test[:MONITOR], None if data.y_test is None else data.y_test[:MONITOR]))
        out = {"X": torch.as_tensor(data.X_train), "columns": [int(c) for c in est.columns_],
               "leak_warnings": [str(w.message) for w in caught if issubclass(w.category, LeakWarning)]}
        if fed.is_active:
            mine = set(out["columns"])
            passive = [c for c in range(est.n_columns_total_) if c not in mine]
            out.update(alpha=as_torch(est.alpha_), sigma=est.sigma_, view=public_view(view, passive), passive=passive,
                       history=est.history_, comm={"total": est.comm_["train_bytes_sent_total"],
                                                   "iterations": est.n_iter_},
                       accuracy=float((np.asarray(est.predict(data.X_test)) == np.asarray(data.y_test)).mean()))
        else:
            est.decision_function(data.X_test)
    if data is None:
        est.decision_function()
    out["sent"] = [(m.src, m.dst, str(m.tensor.dtype), m.tensor.numel(), m.phase)
                   for m in fed.transcript.messages[start:]]
    return out


@pytest.fixture(scope="module")
def run():
    return launch(sealed_job, 3, args=(PARAMS,), coordinator=True, record_transcript=True)


def twin(run):
    """The centralised model: the same features, batches and steps in float64 (sealed.py, steps 2-4)."""
    full = load_party_data(Federation.local(), CONFIG)
    X = torch.as_tensor(full.X_train, dtype=torch.float64)
    A = run[0]
    y = A["view"]["y"].to(torch.float64)                # the labels as the estimator encodes them (+1 / -1)
    est = FDSKLClassifier(**PARAMS)
    D = est._n_blocks() * est.features_per_step
    features = torch.arange(D)
    W = FourierSampler(est.kernel, A["sigma"], est.random_state).omega(torch.arange(X.shape[1]), features)
    b = Circle(16).decode(counter_words(derive_key(est.random_state, 0xB0B), features, 16))
    phi = SQRT2 * torch.cos(X @ W + b)
    cfg = est._config(get_loss("logistic"), X.shape[0], 16.0 / D)
    sampler = BatchSampler(X.shape[0], cfg.batch_size, cfg.seed)
    T = math.ceil(PARAMS["epochs"] * sampler.per_epoch - 1e-9)
    mu = MU_NUM / 2 ** MU_SHIFT
    alpha, m, total = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), 0.0
    for t in range(T):
        rows = sampler.next()
        f = phi[rows] @ alpha
        g = phi[rows].T @ cfg.loss.derivative(f, y[rows])
        m = mu * m + g + cfg.lam * sampler.batch_size * alpha      # (the weight decay: lambda B alpha in the sums)
        alpha = alpha - cfg.gamma / sampler.batch_size * m
        if t >= T // 2:
            total = total + alpha
    return total / (T - T // 2), phi, W, b


def test_sealed_trains_the_centralised_twin(run):
    A = run[0]
    alpha_twin, _, _, _ = twin(run)
    err = float((A["alpha"] - alpha_twin).norm() / alpha_twin.norm())
    print(f"\nsealed against its float twin: relative error of alpha {err:.4f}")
    assert err < 0.05, err                        # fixed point: 8 / 6-bit cosines, 8-bit L', the rounded step
    assert A["accuracy"] > 0.95, A["accuracy"]


def test_each_role_receives_what_the_protocol_lists(run):
    """Training messages by receiver (sealed.ROLES): A gets the masked phases once per row, the A-D seed, a D-vector
    and a B-vector from H and from the dealer each iteration, and one D-vector from each at the end; H gets seeds, U
    (2D words per row) and k - M2 (D per row) once, and L' + P with A's gradient share (B + D) each iteration; the
    dealer gets V - M1 (D words per row) and nothing per iteration."""
    A, H, P2, dealer = 0, 1, 2, 3
    sent = [m for r in run for m in r["sent"] if m[4].startswith(TRAIN_PHASE)]
    n = len(run[0]["X"])
    est = FDSKLClassifier(**PARAMS)
    B, D = est._batch_size(n), est._n_blocks() * est.features_per_step
    T = run[0]["comm"]["iterations"]
    from vfltorch.kernels.sealed import setup_rows

    def got(dst, src):
        return sorted(m[3] for m in sent if m[1] == dst and m[0] == src)

    step = setup_rows(D, est.max_elements)
    chunks = [min(step, n - at) for at in range(0, n, step)]           # the setup's chunks of rows
    per_row = [c * D for c in chunks]
    # the dealer: V - M1 from H, D words per row, nothing else
    assert got(dealer, H) == sorted(per_row) and got(dealer, A) == [] and got(dealer, P2) == []
    # A: each passive party's masked phases once per row; the dealer's seed; per iteration a D + B message from H
    # and from the dealer; the opened average (D) from each at the end
    assert got(A, P2) == sorted(per_row)
    assert got(A, H) == sorted(per_row + [D + B] * T + [D])
    assert got(A, dealer) == sorted([2] + [D + B] * T + [D])
    # H: A's pair seed, U (2D words per row), L' + P and A's gradient share per iteration; the dealer's seeds
    # (the star's: 6 words per chunk; the H-D pair seed: 2) and k - M2 (D per row)
    assert got(H, A) == sorted([2] + [2 * c for c in per_row] + [B + D] * T)
    assert got(H, dealer) == sorted([2] + [6] * len(chunks) + per_row)
    assert got(P2, A) == [] and got(P2, H) == [] and got(P2, dealer) == [2] * len(chunks)


def test_the_curve_opens_f_on_the_monitor_rows_once_per_epoch(run):
    """Held-out points at the three epoch ends (the current iterate's accuracy); in the monitor phase the active
    party receives the monitor rows' masked phases once, and per epoch a D + m message from H and from the dealer
    (their masked shares of alpha and of f on the monitor rows), nothing per feature of a row."""
    A = run[0]
    scored = [p for p in A["history"] if "test_accuracy" in p]
    per_epoch = len(A["X"]) / FDSKLClassifier(**PARAMS)._batch_size(len(A["X"]))     # 427 / 32 iterations
    assert [p["iteration"] for p in scored] == [math.ceil(k * per_epoch - 1e-9) for k in (1, 2, 3)]
    assert scored[-1]["test_accuracy"] > 0.9 and all(p["bytes"] > 0 for p in A["history"])
    D = FDSKLClassifier(**PARAMS)._n_blocks() * FDSKLClassifier(**PARAMS).features_per_step
    to_a = [m for r in run for m in r["sent"] if m[4] in ("fdskl/monitor", "fdskl/monitor/star-sum") and m[1] == 0]
    assert sorted(m[3] for m in to_a if m[0] == 1) == sorted([MONITOR * D] + [D + MONITOR] * 3)
    assert sorted(m[3] for m in to_a if m[0] == 3) == [D + MONITOR] * 3
    assert sorted(m[3] for m in to_a if m[0] == 2) == [MONITOR * D]


def test_training_bytes_follow_the_formula_a_long_run_announces(run):
    """Every rank's training bytes (the meter) are the setup, T times ``traffic.iteration_bytes('sealed', ...)``
    and the once-per-run seeds and opened alpha, exactly (docs/fdskl.md, *Cost*)."""
    from vfltorch.kernels.sealed import setup_rows
    from vfltorch.kernels.traffic import iteration_bytes, sealed_once_bytes, sealed_setup_bytes

    est = FDSKLClassifier(**PARAMS)
    n = len(run[0]["X"])
    B, D = est._batch_size(n), est._n_blocks() * est.features_per_step
    T = run[0]["comm"]["iterations"]
    setup = sealed_setup_bytes(n, 3, D, setup_rows(D, est.max_elements))
    assert run[0]["comm"]["total"] == setup + T * iteration_bytes("sealed", 3, B, D, D) + sealed_once_bytes(D)
    assert iteration_bytes("sealed", 3, B, D, D) == 24 * (B + D)
    chunks = -(-n // setup_rows(D, est.max_elements))
    assert setup == 32 * 2 * chunks + n * D * 36          # (2 (Q - 1) + 32) D bytes per row


def test_the_gradient_attack_has_nothing_to_solve(run):
    view = run[0]["view"]
    assert view["steps"] == []                    # no gradient sum was opened to the active party
    assert len(view["f"]) == len(view["lprime"]) > 0


def protocol_job(fed, protocol):
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    est = FDSKLClassifier(fed, epochs=1, **({} if protocol is None else {"protocol": protocol}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(None) if data is None else est.fit(data.X_train, data.y_train, columns=data.columns)
    return {"protocol": est.protocol, "warnings": [str(w.message) for w in caught if issubclass(w.category, LeakWarning)]}


def test_the_default_is_sealed_and_shared_warns_the_label_holder(run):
    default = launch(protocol_job, 2, args=(None,), coordinator=True)
    assert [r["protocol"] for r in default] == ["sealed"] * 3
    assert all(r["warnings"] == [] for r in default)
    assert all(r.get("leak_warnings", []) == [] for r in run)
    warned = launch(protocol_job, 2, args=("shared",), coordinator=True)
    assert len(warned[0]["warnings"]) == 1 and "issue 35" in warned[0]["warnings"][0]
    assert "sealed" in warned[0]["warnings"][0]
    assert warned[1]["warnings"] == [] and warned[2]["warnings"] == []


def test_check_sealed_counts_the_passive_values():
    """The opened model (D coefficients) against the n d_P passive values; the f values (what the loss needs) only
    warn."""
    assert check_sealed(455, 20, 1536, 32, 4) is None     # 9,100 values, 1,536 coefficients, 1,824 f values
    with pytest.raises(VFLInputError, match="n_components <= 4000"):
        check_sealed(1000, 8, 4096, 32, 1)                # 8,000 values: at most 4,000 coefficients
    with pytest.raises(VFLInputError, match="n_components <= 1152"):
        check_sealed(576, 4, 1536, 32, 4)                 # pima at Q = 2 at the defaults (576 training rows)
    note = check_sealed(576, 4, 1024, 32, 4)              # 2,304 values: 4 epochs of f values are as many
    assert note is not None and "2304 passive values" in note and "fewer epochs" in note
    assert check_sealed(576, 4, 1024, 32, 3) is None
    # The width selection's f values count with training's: 5,000 rows x 2 passive columns, 40 steps of 128 rows
    # (5,120 f values) are below the 10,000 values alone, not with the four candidates' 4 x (1.5 x 4,000 + 1,000)
    from vfltorch.kernels.selection import selection_openings

    chosen = selection_openings(5000, (0.5, 1.0, 1.5, 2.0), lambda rows: min(256, max(32, rows // 128)))
    assert chosen == 4 * (188 * 32 + 1000)                # (ceil(1.5 x 4,000 / 32) steps of 32 rows)
    assert check_sealed(5000, 2, 1024, 128, 1.0) is None
    note = check_sealed(5000, 2, 1024, 128, 1.0, selection_f=chosen)
    assert note is not None and "width selection" in note and "sigma_grid=(1.0,)" in note
    assert selection_openings(4999, (0.5, 1.0), lambda rows: 32) == 0 == selection_openings(9000, (1.0,), len)


@pytest.mark.slow
def test_the_opened_model_gives_nothing_on_a_real_run_and_rows_when_few(run):
    """The attacker's strongest use of the opened alpha: it knows every weight C_i (its own L' and the public
    step rule), so alpha_j = sum_i C_i sqrt2 cos(x_i^A w_j^A + x_i^P w_j^P + b_j) in the n d_P passive values."""
    A = run[0]
    view = A["view"]
    n = len(A["X"])
    _, C = momentum_weights(view["lprime"], view["batches"], n, view["gamma"], view["batch_size"],
                            MU_NUM / 2 ** MU_SHIFT, view["lam"])
    columns = run[1]["columns"] + run[2]["columns"]
    truth = torch.cat([run[1]["X"], run[2]["X"]], 1)[:, [columns.index(c) for c in A["passive"]]].double()
    base = (view["X_A"] @ view["W_A"] + view["b"]).numpy()
    W_P = view["W_P"].numpy()
    # The real run: 9,100 unknowns against 1,536 numbers.
    Z, res, _ = solve_batch(base, W_P, C.numpy(), view["alpha"].numpy(), starts=2, iters=300)
    r2 = column_r2(torch.from_numpy(Z), truth)
    baseline = own_column_baseline(view["X_A"], truth)
    print(f"\nopened alpha, all {n} rows: residual {res:.2e}, R^2 median {float(r2.median()):.3f}; own columns "
          f"{float(baseline.median()):.3f}")
    assert float(r2.median()) < float(baseline.median()), (r2, baseline)
    # The model weighs few rows much (the rows with large L'): the attacker solves for those alone, the rest as noise.
    for k in (24, 76):
        top = torch.argsort(C.abs(), descending=True)[:k]
        Zk, resk, _ = solve_batch(base[top], W_P, C[top].numpy(), view["alpha"].numpy(), starts=3, iters=300,
                                  floor=1e-3)
        r2_top = column_r2(torch.from_numpy(Zk), truth[top])
        own_top = own_column_baseline(view["X_A"][top], truth[top])
        print(f"the {k} rows of largest |C_i| ({float(C[top].abs().sum() / C.abs().sum()):.2f} of sum |C|): residual "
              f"{resk:.2e}, R^2 median {float(r2_top.median()):.3f}; own columns {float(own_top.median()):.3f}")
        assert float(r2_top.median()) < float(own_top.median()), (k, r2_top, own_top)
    # The same equations from those 24 rows alone (480 unknowns, no other row's term): what check_sealed refuses.
    rows = torch.argsort(C.abs(), descending=True)[:24]      # (the rows the model weighs most)
    alpha_few = torch.from_numpy(SQRT2 * (C[rows].numpy()[:, None] * np.cos(base[rows] + truth[rows].numpy() @ W_P)).sum(0))
    Z, res, _ = solve_batch(base[rows], W_P, C[rows].numpy(), alpha_few.numpy(), starts=8, floor=1e-8)
    r2_few = column_r2(torch.from_numpy(Z), truth[rows])
    print(f"24 rows: residual {res:.2e}, R^2 median {float(r2_few.median()):.3f}")
    assert float(r2_few.median()) > 0.9, r2_few


def test_sealed_refuses_what_it_cannot_run():
    from vfltorch.kernels.checks import check_shared

    with pytest.raises(VFLInputError, match="n_components"):
        check_shared(FDSKLClassifier(protocol="sealed", n_components=None))


def budget_job(fed, params):
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    est = FDSKLClassifier(fed, protocol="sealed", random_state=4, **params)
    if data is None:
        est.fit(None, monitor=(torch.zeros(MONITOR, 0), None))
        est.decision_function()
        return None
    est.fit(data.X_train, data.y_train, columns=data.columns,
            monitor=(data.X_test[:MONITOR], data.y_test[:MONITOR] if fed.is_active else None))
    p = est.predict(data.X_test)
    if not fed.is_active:
        return None
    return {"n_iter": est.n_iter_, "train_seconds": est.train_seconds_, "history": est.history_,
            "accuracy": float((np.asarray(p) == np.asarray(data.y_test)).mean()), "rows": len(data.X_train)}


@pytest.mark.parametrize("params", [dict(epochs=None, max_time=1.5), dict(epochs=200, max_time=1.0)])
def test_a_time_budget_stops_every_party_and_opens_the_average(params):
    """The active party's stop flag (one per iteration down the control tree) ends the run for every rank; the
    opened model is the average from the first epoch on (or the whole run's end before 200 epochs)."""
    A = launch(budget_job, 3, args=(params,), coordinator=True)[0]
    print(f"\n{params}: {A['n_iter']} iterations in {A['train_seconds']:.2f} s, accuracy {A['accuracy']:.4f}")
    B = FDSKLClassifier(**PARAMS)._batch_size(A["rows"])
    steps_200 = math.ceil(200 * A["rows"] / B - 1e-9)
    assert 1 <= A["n_iter"] < steps_200
    assert params["max_time"] <= A["train_seconds"] < params["max_time"] + 5.0
    last = A["history"][-1]
    assert last["iteration"] == A["n_iter"] and "test_accuracy" in last      # the closing point, with the monitor
    assert A["accuracy"] > 0.9, A


def test_the_holders_refuse_what_their_memory_cannot_hold():
    """H and the dealer keep Qd (rows x D words of 8 bytes): a run that would not fit is refused with the sizes and
    the fixes, before the setup, instead of the operating system killing a party halfway through it."""
    from vfltorch.kernels.sealed import available_memory, check_memory

    check_memory(32561, 1536, None)                          # (unknown: no check)
    check_memory(32561, 1536, 10 ** 10)                      # a9a: 0.40 GB of 10 GB
    with pytest.raises(VFLInputError, match=r"32561 rows x 1536 features x 8 bytes = 0.40 GB.*lower n_components"):
        check_memory(32561, 1536, 4 * 10 ** 8)
    assert available_memory() is None or available_memory() > 0
