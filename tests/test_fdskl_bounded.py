"""FDSKL's bounded model (D random features) and one-vs-rest multi-class, over real processes (Q = 3 + a dealer).

* federated == centralised for the bounded model under the default shared
  protocol and the paper's (alpha to the 16-bit angle rounding);
* training bytes per iteration equal the analysis 2 (2Q - 2) B D under the
  paper's protocol (constant in t: an epoch costs O(n D)), and scoring m rows
  sends 2 (2Q - 2) m D bytes, whatever the number of iterations;
* one-vs-rest on wine (3 classes) under the shared protocol equals its
  centralised twin;
* the active party's attack on what it receives while *training* the bounded
  model (the phases, or masked phases, of every batch it evaluates, pooled
  over an epoch): least squares with phase unwrapping rebuilds the passive
  columns under the paper's protocol and fails under the default.
"""

import math
import warnings

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import FDSKLClassifier
from vfltorch.kernels.budget import DEALER_WINDOW, leak_limit
from vfltorch.kernels.shared import TRAIN_BITS
from vfltorch.kernels.sealed import setup_rows
from vfltorch.kernels.traffic import announce, iteration_bytes, sealed_once_bytes, sealed_setup_bytes
from vfltorch.kernels.trainer import phase_totals
from conftest import as_torch

BOUNDED = dict(protocol="shared", batch_size=32, epochs=2, random_state=3, n_components=128, features_per_step=16)
# product_bits=32 (both training products in Z_2^32): the compressed and one-vs-rest runs are compared with their
# centralised twins closely; the default's Z_2^20 / Z_2^16 precision is tested on BOUNDED.
# Prune to the 48 of the 128 features with the largest |alpha| (the label-dependent support, kept selectable; the
# default public support has tests/test_fdskl_compress.py) and refit by one epoch.
COMPRESSED = dict(BOUNDED, compress_to=48, product_bits=32, compress_support="alpha")
WINE = dict(protocol="shared", batch_size=16, epochs=4, random_state=1, n_components=128, features_per_step=16, product_bits=32,
            predict_bits=32)   # the twin compares decision values: training and prediction both in Z_2^32
WINE_COLUMNS = [range(0, 5), range(5, 9), range(9, 13)]


def wine(part=None):
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order], y[order].astype(np.float64)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    cut = 134
    cols = list(range(13)) if part is None else list(WINE_COLUMNS[part])
    return X[:cut, cols], y[:cut], X[cut:, cols], y[cut:]


def arr(x):
    return torch.as_tensor(x).detach().cpu().double().numpy()


def bc(fed):
    return load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0))


ATTACK = dict(protocol="shared", batch_size=32, epochs=1, random_state=3, sigma=1.0, n_components=448, features_per_step=16)


def spy_on_training(fed):
    """Record, at the active party, the outputs of Algorithm 3 it receives during training (test instrumentation:
    the same values the protocol hands it; nothing is changed)."""
    import vfltorch.kernels.budget as budget
    from vfltorch.kernels.protocol import FederatedFeatureMap

    seen = []
    # Under shared the masked phases S reach A in ``star_send`` (the messages of a star whose local part
    # ``star_local`` made, possibly a round ahead).
    dealt, phases = budget.star_send, FederatedFeatureMap.phases

    def dealt_spy(*args, **kwargs):
        ph = dealt(*args, **kwargs)
        if fed.is_active:
            seen.append(ph.S.clone())
        return ph

    def phases_spy(self, X, blocks):
        theta = phases(self, X, blocks)
        if fed.is_active:
            seen.append(theta.clone())
        return theta

    budget.star_send = dealt_spy
    FederatedFeatureMap.phases = phases_spy

    def stop():
        budget.star_send, FederatedFeatureMap.phases = dealt, phases
        return seen
    return stop


def attack_fits(fed, data):
    """Train the bounded model once per protocol with the spy on; return the active party's pooled view."""
    out = {}
    # shared_delay1: the pipelined iteration (f_delay=1), whose phase messages carry the keeper's shares too.
    for name, protocol, extra in (("paper", "paper", {}), ("shared", "shared", {}),
                                  ("shared_delay1", "shared", {"f_delay": 1})):
        if fed.is_coordinator and protocol == "paper":
            continue
        stop = spy_on_training(fed)
        est = FDSKLClassifier(fed, **extra, **dict(ATTACK, protocol=protocol))
        if data is None:
            est.fit(None)
        else:
            est.fit(data.X_train, data.y_train, columns=data.columns)
        seen = stop()
        if fed.is_active:
            out[name] = {"batches": seen, "omega": est.feature_map_.omega.clone(), "sigma": est.sigma_}
    return out


def job(fed):
    warnings.simplefilter("ignore")
    out = {}
    data = bc(fed) if fed.is_data_party else None
    # The default (shared) protocol, bounded model.
    est = FDSKLClassifier(fed, **BOUNDED)
    if data is None:
        est.fit(None)
        before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
        est.decision_function()
        out["shared_predict_bytes"] = phase_totals(fed, "fdskl/predict")["bytes_sent"] - before
    else:
        est.fit(data.X_train, data.y_train, columns=data.columns, monitor=(data.X_test, data.y_test))
        before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
        f = est.decision_function(data.X_test)
        out["shared_predict_bytes"] = phase_totals(fed, "fdskl/predict")["bytes_sent"] - before
        out["shared"] = {"alpha": as_torch(est.alpha_), "f": f, "comm": est.comm_, "history": est.history_,
                         "n_iter": est.n_iter_}
    # The shared protocol with f_delay=1: f from the coefficients before the last step, the iteration pipelined.
    est = FDSKLClassifier(fed, f_delay=1, **BOUNDED)
    if data is None:
        est.fit(None)
    else:
        est.fit(data.X_train, data.y_train, columns=data.columns)
        out["shared_delay1"] = {"alpha": as_torch(est.alpha_), "comm": est.comm_, "n_iter": est.n_iter_}
    # The shared protocol with Z_2^32 training products (product_bits=32): the precise, larger option.
    est = FDSKLClassifier(fed, product_bits=32, **BOUNDED)
    if data is None:
        est.fit(None)
    else:
        est.fit(data.X_train, data.y_train, columns=data.columns)
        out["shared32"] = {"alpha": as_torch(est.alpha_), "comm": est.comm_, "n_iter": est.n_iter_}
    # The paper's protocol (the dealer sits it out): bytes of training and of prediction.
    if data is not None:
        est = FDSKLClassifier(fed, mask_seed="seed", **dict(BOUNDED, protocol="paper"))
        est.fit(data.X_train, data.y_train, columns=data.columns)
        before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
        f = est.decision_function(data.X_test)
        out["paper"] = {"alpha": as_torch(est.alpha_), "f": f, "comm": est.comm_, "n_iter": est.n_iter_,
                        "predict_bytes": phase_totals(fed, "fdskl/predict")["bytes_sent"] - before,
                        "rows": data.X_test.shape[0], "features": est.n_random_features_}
    # The compressed model (prune + distil, compress.py) under both protocols: prediction on D' features.
    for protocol in ("shared", "paper"):
        if fed.is_coordinator and protocol == "paper":
            continue
        est = FDSKLClassifier(fed, mask_seed="seed" if protocol == "paper" else "random",
                              **dict(COMPRESSED, protocol=protocol))
        if data is None:
            est.fit(None)
        else:
            est.fit(data.X_train, data.y_train, columns=data.columns)
        before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
        f = est.decision_function(None if data is None else data.X_test)
        out[f"compressed_{protocol}"] = {"support": as_torch(est.support_), "alpha": as_torch(est.alpha_), "f": f,
                                         "info": est.compress_,
                                         "predict_bytes": phase_totals(fed, "fdskl/predict")["bytes_sent"] - before}
    # One-vs-rest on wine under the shared protocol.
    ovr = FDSKLClassifier(fed, **WINE)
    if fed.is_coordinator:
        ovr.fit(None)
        ovr.decision_function()
    else:
        Xtr, ytr, Xte, yte = wine(fed.parties.index(fed.rank))
        cols = list(WINE_COLUMNS[fed.parties.index(fed.rank)])
        ovr.fit(torch.tensor(Xtr), ytr if fed.is_active else None, columns=cols)
        out["ovr"] = {"f": ovr.decision_function(torch.tensor(Xte)), "n_models": len(ovr.estimators_)}
        if fed.is_active:
            out["ovr"]["classes"] = ovr.classes_
    out["attack"] = attack_fits(fed, data)
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(job, 3, coordinator=True)


def centralised(**kw):
    data = bc(Federation.local())
    est = FDSKLClassifier(**kw).fit(data.X_train, data.y_train)
    return est, data


def test_bounded_model_federated_equals_centralised(runs):
    ref_delay0, data = centralised(**BOUNDED)          # the default (f_delay 'auto': 0), the paper's algorithm
    ref_delay1, _ = centralised(f_delay=1, **BOUNDED)  # the pipelined shared iteration's twin: f_delay 1 at Q = 1 too
    assert as_torch(ref_delay1.alpha_).shape == (128,) and ref_delay1.n_random_features_ == 128
    # The two delays are different models (so the twins below tell them apart): 51% of the norm apart here.
    a1, a0 = as_torch(ref_delay1.alpha_), as_torch(ref_delay0.alpha_)
    assert float((a1 - a0).norm() / a0.norm()) > 0.2
    for protocol in ("shared", "paper", "shared_delay1"):
        ref = ref_delay1 if protocol == "shared_delay1" else ref_delay0
        got = runs[0][protocol]
        assert got["alpha"].shape == (128,) and got["n_iter"] == ref.n_iter_ == math.ceil(2 * 427 / 32)
        # 16-bit angles against float features; under shared also the products' fixed point: training's in
        # Z_2^20 (f) and Z_2^16 (gradient sums), each row dot exact to about 2**-8 of the sum of its terms'
        # magnitudes (issue 11), so alpha follows the centralised run to about 1.5% of its norm (measured:
        # max |diff| 0.02-0.055 at max |alpha| 1.38; f 0.15-0.19 at max |f| 39; prediction's f in Z_2^24 adds about
        # 1e-3 of max |f|).
        a, a_ref = got["alpha"].double(), as_torch(ref.alpha_).double()
        if protocol == "paper":
            torch.testing.assert_close(a, a_ref, rtol=0, atol=2e-3)
        else:
            assert float((a - a_ref).norm() / a_ref.norm()) < 0.04
            torch.testing.assert_close(a, a_ref, rtol=0, atol=0.1 * float(a_ref.abs().max()))
        if "f" not in got:
            continue
        f, f_ref = arr(got["f"]), arr(ref.decision_function(data.X_test))
        np.testing.assert_allclose(f, f_ref, rtol=0, atol=2e-2 if protocol == "paper" else 1e-2 * np.abs(f_ref).max())
        assert np.mean(np.sign(f) == np.sign(f_ref)) > 0.97
        assert np.mean(np.where(f >= 0, 1, -1) == data.y_test.numpy()) > 0.93
    # Passive parties hold no model and get no decision values.
    assert all(runs[p][k]["alpha"] is None and runs[p][k]["f"] is None for p in (1, 2) for k in ("shared", "paper"))
    # Under shared the held-out rows are opened once per epoch (and at the end), not at every log point.
    opened = [h for h in runs[0]["shared"]["history"] if "test_accuracy" in h]
    assert 1 <= len(opened) <= 3


def test_bytes_are_linear_in_rows_and_prediction_costs_m_times_d(runs):
    got = runs[0]["paper"]
    Q, B, D = 3, 32, 128
    # Training: 2 (2Q - 2) B D bytes per iteration (16-bit angles), the same at every iteration: O(n D) per epoch.
    assert got["comm"]["bytes_per_iteration"] == 2 * (2 * Q - 2) * B * D == iteration_bytes("paper", Q, B, D, D)
    # The shared protocol (docs/fdskl.md, *Where the bytes go*): phases in a star into the active party
    # ((Q - 1) 2 B D), f's product in Z_2^20 (2 B D words of 2.5 bytes: 5 B D), the gradient's in Z_2^16
    # (2 B G words of 2 bytes: 4 B G, G = D gradient sums for adam), the dealer's corrections and the
    # openings (B words of 2.5 bytes and G of 2, twice: 5 B + 4 G) and 128-bit seeds (32 Q - 16); the dealer's
    # messages of up to DEALER_WINDOW iterations travel together, each window with an 8-byte length to each of
    # its Q recipients (the keeper, the other passive party, the active party).
    # The same bytes with f pipelined one step behind (f_delay 1) and without (f_delay 0, the default).
    assert TRAIN_BITS == (20, 16)
    for key in ("shared", "shared_delay1"):
        G, T = D, runs[0][key]["n_iter"]
        shared = runs[0][key]["comm"]["bytes_per_iteration"]
        formula = 2 * (Q - 1) * B * D + 5 * B * D + 4 * B * G + 5 * B + 4 * G + 32 * Q - 16
        assert formula == iteration_bytes("shared", Q, B, D, G)     # (the formula a long run announces)
        extra = round(shared * T) - T * formula
        windows = extra // (8 * Q)
        assert extra % (8 * Q) == 0 and math.ceil(T / DEALER_WINDOW) <= windows <= T, (key, extra)
    assert shared <= 3 * got["comm"]["bytes_per_iteration"]        # at most 3x the paper's (here 1.63x)
    # At Q = 2 (the paper: 4 B D) the same formula gives 11 B D + O(B + D): 2.76x at B = 64, D = 1024.
    assert (11 * 64 * 1024 + 5 * 64 + 4 * 1024 + 48) / (4 * 64 * 1024) < 2.8
    # Prediction: the m rows on the D features once, all ranks together (plus < 1 kB of JSON control messages).
    # Under the paper's protocol the phases travel in a star into the active party (Q - 1 messages of m D
    # angles, protocol.star_phases) plus one 16-byte seed per pair of passive parties.
    total = sum(r["paper"]["predict_bytes"] for r in runs[:3])
    pairs = (Q - 1) * (Q - 2) // 2
    assert got["features"] == D and 0 <= total - (2 * (Q - 1) * got["rows"] * D + 16 * pairs) < 1000
    # Under shared: the star of phases, one product of 24-bit words (predict_bits, default 24: 3 bytes each), the
    # dealer's corrections and the opening (m words of 3 bytes each) and seeds.
    m = got["rows"]
    total = sum(r["shared_predict_bytes"] for r in runs)
    assert 0 <= total - (2 * (Q - 1) * m * D + 6 * m * D + 6 * m + 32 * Q - 16) < 1000


def test_compressed_model_predicts_on_its_kept_features_only(runs):
    """compress_to = D' < D: every rank holds the same support of D' features, the active party a model that is
    zero off it, federated = centralised, the distilled model agrees with the D-feature one, and prediction
    bytes are those of D' features under both protocols."""
    Q, Dp = 3, COMPRESSED["compress_to"]
    ref, data = centralised(**COMPRESSED)
    full, _ = centralised(**BOUNDED)
    m = data.X_test.shape[0]
    assert as_torch(ref.support_).shape == (Dp,) and ref.compress_["refit_iterations"] == 100       # at least 100 steps
    top = torch.topk(as_torch(full.alpha_).abs(), Dp).indices.sort().values
    torch.testing.assert_close(as_torch(ref.support_), top)
    f_ref, f_full = arr(ref.decision_function(data.X_test)), arr(full.decision_function(data.X_test))
    assert np.mean(np.sign(f_ref) == np.sign(f_full)) > 0.95 and np.corrcoef(f_ref, f_full)[0, 1] > 0.95
    for protocol in ("shared", "paper"):
        if protocol == "paper":         # its twin trains with f_delay 0 (the paper's algorithm)
            ref, _ = centralised(**dict(COMPRESSED, f_delay=0))
            f_ref = arr(ref.decision_function(data.X_test))
        ranks = runs if protocol == "shared" else runs[:3]
        got = runs[0][f"compressed_{protocol}"]
        for r in ranks:                               # one support at every rank, the dealer included
            torch.testing.assert_close(r[f"compressed_{protocol}"]["support"], as_torch(ref.support_))
        off = torch.ones(128, dtype=torch.bool)
        off[as_torch(ref.support_)] = False
        assert float(got["alpha"][off].abs().max()) == 0.0
        assert all(r[f"compressed_{protocol}"]["alpha"] is None for r in ranks[1:])
        torch.testing.assert_close(got["alpha"].double(), as_torch(ref.alpha_).double(), rtol=0, atol=3e-3)
        # Under shared prediction's f is opened in Z_2^24 (predict_bits): about 1e-3 of max |f| more.
        atol = 3e-2 if protocol == "paper" else 3e-3 * float(np.abs(f_ref).max())
        np.testing.assert_allclose(arr(got["f"]), f_ref, rtol=0, atol=atol)
        total = sum(r[f"compressed_{protocol}"]["predict_bytes"] for r in ranks)
        if protocol == "shared":
            expected = 2 * (Q - 1) * m * Dp + 6 * m * Dp + 6 * m + 32 * Q - 16
        else:
            expected = 2 * (Q - 1) * m * Dp + 16 * (Q - 1) * (Q - 2) // 2
        assert 0 <= total - expected < 1000, (protocol, total, expected)


def test_one_vs_rest_equals_its_centralised_twin(runs):
    Xtr, ytr, Xte, yte = wine()
    ref = FDSKLClassifier(**WINE).fit(Xtr, ytr)
    got = runs[0]["ovr"]
    assert got["n_models"] == 3 and list(got["classes"]) == [0.0, 1.0, 2.0]
    f, f_ref = arr(got["f"]), arr(ref.decision_function(Xte))
    assert f_ref.shape == f.shape == (len(yte), 3)
    np.testing.assert_allclose(f, f_ref, rtol=0, atol=5e-2)
    pred = got["classes"][np.argmax(f, axis=1)]
    assert np.mean(pred == ref.predict(Xte)) > 0.97
    assert ref.score(Xte, yte) > 0.9 and np.mean(pred == yte) > 0.9


def test_leak_limit_counts_equations_against_unknowns():
    # n D unknown feature values; B f values and g gradient sums per step; stop at half.
    assert leak_limit(1000, 128, 32, 128) == (1000 * 128) // (2 * 160)
    assert leak_limit(50_000, 1024, 256, 1024) == 20_000          # 100 epochs of 195 iterations at the defaults


def test_distillation_and_the_check_rows_count_against_the_leak_limit():
    from vfltorch.kernels.compress import refit_limit

    # 1000 rows x 128 features: 64,000 equations allowed; training took 300 x (32 + 128), the check 2 x 1000.
    assert refit_limit(1000, 128, 300, 32, 128, 48) == (64_000 - 48_000) // 80
    assert refit_limit(1000, 128, 300, 32, 128, 48, opened=2000) == (64_000 - 48_000 - 2000) // 80
    assert refit_limit(1000, 128, 400, 32, 128, 48) == 0                     # training used the whole budget


def test_bounded_hyperparameters_are_checked():
    from vfltorch.data import VFLInputError

    data = bc(Federation.local())
    with pytest.raises(VFLInputError, match="n_components"):
        FDSKLClassifier(n_components=0).fit(data.X_train, data.y_train)
    with pytest.raises(VFLInputError, match="solver must be"):
        FDSKLClassifier(solver="lbfgs").fit(data.X_train, data.y_train)
    for bad in (0, "all", 1.5, True, "if-faithful:0", "if-faithful:x", "if-faithful:"):
        with pytest.raises(VFLInputError, match="compress_to"):
            FDSKLClassifier(compress_to=bad).fit(data.X_train, data.y_train)
    with pytest.raises(VFLInputError, match="compress_epochs"):
        FDSKLClassifier(compress_epochs=-1).fit(data.X_train, data.y_train)
    with pytest.raises(VFLInputError, match="compress_support"):
        FDSKLClassifier(compress_support="largest").fit(data.X_train, data.y_train)
    for bad in (16, 64, True):
        with pytest.raises(VFLInputError, match="predict_bits"):
            FDSKLClassifier(predict_bits=bad).fit(data.X_train, data.y_train)
    # "auto" compresses from 2 D training rows on only (breast cancer: 427 rows, D = 1024: no compression).
    assert FDSKLClassifier(epochs=0.2).fit(data.X_train, data.y_train).support_ is None


@pytest.mark.parametrize("support", ["alpha", "public"])
def test_compressed_model_survives_save_and_load(tmp_path, support):
    est, data = centralised(**dict(COMPRESSED, epochs=0.5, compress_epochs=0.1, compress_support=support))
    est.save(tmp_path / "m")
    loaded = FDSKLClassifier.load(tmp_path / "m")
    torch.testing.assert_close(as_torch(loaded.support_), as_torch(est.support_))
    np.testing.assert_array_equal(arr(loaded.decision_function(data.X_test)), arr(est.decision_function(data.X_test)))


@pytest.mark.slow
def test_defaults_learn_the_hard_synthetic_case():
    """20 dense columns, 9:1, 4 clusters per class: logistic regression stays at 89.9%, RBF SVC 96.5%.

    The paper's growing model with its constant step reached 91.5%; the defaults (D = 1536, 4 epochs, the
    width chosen on a held-out split: the median's) reach 96.1% (centralised, the same model as federated to
    the angle rounding). About a minute.
    """
    from benchmarks.fdskl_accuracy import hard_synthetic

    Xtr, ytr, Xte, yte = hard_synthetic()
    clf = FDSKLClassifier().fit(Xtr.astype(np.float32), ytr)
    assert clf.sigma_multiplier_ == 1.0
    assert clf.score(Xte.astype(np.float32), yte) > 0.9597          # the RBF SVC's 96.47% - 0.5 point


def training_view(view, n, epochs=1):
    """The pooled (row -> phases) view of one epoch of batches, rows in the sampler's order (public seed)."""
    from vfltorch.kernels.random_features import derive_key
    from vfltorch.kernels.trainer import BatchSampler

    sampler = BatchSampler(n, ATTACK["batch_size"], derive_key(ATTACK["random_state"], 0xBA7C))
    rows, theta = [], []
    for words in view["batches"]:
        batch = sampler.next()
        rows.append(batch)
        theta.append(words)
    rows, theta = torch.cat(rows), torch.cat(theta)
    first = {}
    for k, r in enumerate(rows.tolist()):
        first.setdefault(r, k)
    keep = torch.tensor(sorted(first, key=first.get))
    return keep, theta[torch.tensor([first[r] for r in keep.tolist()])]


@pytest.mark.parametrize("protocol", ["paper", "shared", "shared_delay1"])
def test_active_party_attack_on_bounded_training(runs, protocol):
    from test_fdskl_attack import r2, unwrap_attack

    from vfltorch.kernels import Circle, FourierSampler

    data = bc(Federation.local())
    X = data.X_train.double()
    n = X.shape[0]
    view = runs[0]["attack"][protocol]
    rows, theta_words = training_view(view, n)
    assert len(rows) == n                                      # one epoch of batches covers every training row
    circle = Circle(16)
    theta = circle.decode(theta_words)
    own = circle.decode(circle.encode(X[rows][:, :10] @ view["omega"]))       # the active party's own part
    W_P = FourierSampler("rbf", view["sigma"], ATTACK["random_state"]).omega(range(10, 30), range(theta.shape[1]))
    est = unwrap_attack(theta, own, W_P)
    got = r2(est, X[rows][:, 10:30])
    if protocol == "paper":
        assert float(got.min()) > 0.99, got                    # every passive column rebuilt from training alone
    else:
        assert float(got.max()) < 0.05, got                    # nothing beyond a trivial baseline


def _gradient_attack(n, epochs, noisy_labels, lam="auto"):
    """The active party's least squares on the gradient sums of the bounded model's training.

    Under ``shared`` the active party receives, per step, f on the batch rows (so it knows L'_i) and
    g_j = sum_i L'_i phi_j(x_i) for every feature: linear equations in the unknown phi_j(x_i). The
    values are those of centralised training (the shared protocol opens the same numbers, to
    fixed-point rounding); the spy records them. Returns the kernel-matrix R^2 from the active
    party's own columns alone and with the attack's phi estimate added, and the median R^2 of phi_j.
    """
    from sklearn.datasets import load_breast_cancer
    from sklearn.metrics.pairwise import rbf_kernel

    from vfltorch.kernels import budget

    X, y = load_breast_cancer(return_X_y=True)
    X = ((X - X.min(0)) / (X.max(0) - X.min(0)))[:n]
    y = (2.0 * y - 1)[:n] if not noisy_labels else np.where(np.random.default_rng(1).random(n) < 0.5, 1.0, -1.0)
    seen = {"batches": [], "sums": [], "alpha": []}
    next_batch, step = budget.BatchSampler.next, budget._Optimizer.step

    def spy_next(self):
        b = next_batch(self)
        seen["batches"].append(b.clone())
        return b

    def spy_step(self, t, cols, sums, B):
        seen["sums"].append(sums.clone())
        seen["alpha"].append(self.coefficients(t, self.cfg.f_delay).clone())     # the alpha f_t was computed with
        return step(self, t, cols, sums, B)

    budget.BatchSampler.next, budget._Optimizer.step = spy_next, spy_step
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Training's equations only (compress.py's refit adds B + D' per step to the same budget).
            est = FDSKLClassifier(epochs=epochs, batch_size=32, random_state=0, n_components=1024,
                                  compress_to=None, lam=lam).fit(X, y)
    finally:
        budget.BatchSampler.next, budget._Optimizer.step = next_batch, step
    fmap = est.feature_map_
    phi = fmap.features(torch.tensor(X), range(fmap.n_blocks)).double().numpy()      # the truth, n x D
    loss = est._loss()
    M = np.zeros((len(seen["sums"]), n))
    for t, (b, alpha) in enumerate(zip(seen["batches"], seen["alpha"])):
        b = b.numpy()
        M[t, b] = loss.derivative(torch.tensor(phi[b] @ alpha.numpy()), torch.tensor(y[b])).numpy()
    estimate = np.linalg.lstsq(M, torch.stack(seen["sums"]).numpy(), rcond=1e-10)[0]
    r2_phi = 1 - ((estimate - phi) ** 2).sum(0) / ((phi - phi.mean(0)) ** 2).sum(0)
    gamma = 1 / (2 * est.sigma_ ** 2)
    upper = np.triu_indices(n, 1)
    truth, own = rbf_kernel(X, gamma=gamma)[upper], rbf_kernel(X[:, :10], gamma=gamma)[upper]
    guess = (estimate @ estimate.T)[upper]

    def fit(*cols):
        A = np.column_stack([np.ones_like(truth), *cols])
        resid = A @ np.linalg.lstsq(A, truth, rcond=None)[0] - truth
        return 1 - (resid ** 2).sum() / ((truth - truth.mean()) ** 2).sum()

    return fit(own), fit(own, guess), float(np.median(r2_phi)), len(seen["sums"])


def test_gradient_sums_rebuild_the_kernel_past_the_leak_limit_and_not_at_the_defaults():
    # Past the limit (200 steps for 64 rows, labels the model cannot fit so L'_i stays large) the
    # least squares recovers every phi_j and so the whole kernel matrix: the attack works.
    own, both, r2_phi, steps = _gradient_attack(64, 100, noisy_labels=True)
    assert steps > 64 and r2_phi > 0.99 and both > 0.98 > own + 0.1
    # Stopped at budget.leak_limit (what `shared` does), half the unknowns: a partial estimate only.
    limit = leak_limit(64, 1024, 32, 1024)
    own, both, r2_phi, steps = _gradient_attack(64, limit / 2, noisy_labels=True, lam=1e-5)
    assert steps == limit and r2_phi < 0.7 and both - own < 0.08         # (measured 0.533 and +0.043)
    # At the small-data default lambda = D / (30 n) (0.53 here: the model cannot follow the noisy labels, so L' stays
    # large) the same count of equations gives more: measured r2_phi 0.648 and +0.088 (docs/fdskl.md, `shared`'s
    # leak limit). Still a partial estimate; `shared` warns the label holder in any case.
    own, both, r2_phi, steps = _gradient_attack(64, limit / 2, noisy_labels=True)
    assert steps == limit and r2_phi < 0.7 and both - own < 0.1
    # The defaults on breast_cancer (5 epochs, 455 rows): nothing beyond the active party's own columns.
    own, both, _, _ = _gradient_attack(455, 5.0, noisy_labels=False)
    assert both - own < 0.01


FOUR = dict(protocol="shared", batch_size=32, epochs=1, random_state=5, n_components=64, features_per_step=16, compress_to=32,
            compress_epochs=0.5)


def four_party_paper_job(fed):
    warnings.simplefilter("ignore")
    data = bc(fed)
    est = FDSKLClassifier(fed, mask_seed="seed", **dict(FOUR, protocol="paper"))
    est.fit(data.X_train, data.y_train, columns=data.columns)
    before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
    f = est.decision_function(data.X_test)
    return {"f": f, "alpha": as_torch(est.alpha_), "rows": data.X_test.shape[0], "support": as_torch(est.support_),
            "predict_bytes": phase_totals(fed, "fdskl/predict")["bytes_sent"] - before}


def test_paper_star_with_three_passive_parties():
    """Q = 4 (three passive parties exchange pairwise seeds, in an order that cannot deadlock): the
    distillation and the prediction star give the centralised model and send 2 (Q - 1) m D' + 16 * 3 bytes."""
    runs = launch(four_party_paper_job, 4)
    ref, data = centralised(f_delay=0, **FOUR)              # the paper's algorithm: f after the last step
    got = runs[0]
    torch.testing.assert_close(got["support"], as_torch(ref.support_))
    torch.testing.assert_close(got["alpha"].double(), as_torch(ref.alpha_).double(), rtol=0, atol=2e-3)
    np.testing.assert_allclose(arr(got["f"]), arr(ref.decision_function(data.X_test)), rtol=0, atol=2e-2)
    total = sum(r["predict_bytes"] for r in runs)
    assert 0 <= total - (2 * 3 * got["rows"] * 32 + 16 * 3) < 1000


def test_32_bit_training_products_match_the_centralised_model_closely_and_cost_their_formula(runs):
    """product_bits=32: both training products in Z_2^32 (the 8-byte-word format of before the narrow rings): the
    federated model is the centralised one to about 0.1% (20-bit: about 3%), at 8 B (D + G) product bytes."""
    ref, _ = centralised(**BOUNDED)
    got, narrow = runs[0]["shared32"], runs[0]["shared"]
    scale = float(as_torch(ref.alpha_).abs().max())
    err32 = float((got["alpha"].double() - as_torch(ref.alpha_).double()).abs().max()) / scale
    err20 = float((narrow["alpha"].double() - as_torch(ref.alpha_).double()).abs().max()) / scale
    assert err32 < 1e-2 and err32 < err20, (err32, err20)
    Q, B, D = 3, 32, 128
    G, T = D, got["n_iter"]
    shared = got["comm"]["bytes_per_iteration"]
    assert shared > narrow["comm"]["bytes_per_iteration"]
    formula = 2 * (Q - 1) * B * D + 8 * B * (D + G) + 12 * (B + G) + 32 * Q - 16
    assert formula == iteration_bytes("shared", Q, B, D, G, bits=(32, 32))
    extra = round(shared * T) - T * formula
    windows = extra // (8 * Q)
    assert extra % (8 * Q) == 0 and math.ceil(T / DEALER_WINDOW) <= windows <= T, (shared, extra)


PIPE = dict(BOUNDED, log_every=100)


def two_party_job(fed):
    """Q = 2 (the active party, one passive party that keeps every round, the dealer): each delay, and the
    pipeline under a time budget (which drains it every iteration)."""
    import vfltorch.kernels.budget as budget

    warnings.simplefilter("ignore")
    data = bc(fed) if fed.is_data_party else None
    out = {}
    # Which rounds' local part each rank makes while round t's forward product is under way (f_delay 0: between
    # forward_begin and forward_end of iteration t, round t + 1's), recorded by a spy that changes nothing.
    made, inside = [], [False]
    local_round, begin, end = budget._local_round, budget.StarProducts.forward_begin, budget.StarProducts.forward_end

    def local_spy(*args, **kwargs):
        got = local_round(*args, **kwargs)
        made.append((got.t, inside[0]))
        return got

    def begin_spy(self, coef):
        begin(self, coef)
        inside[0] = True

    def end_spy(self):
        inside[0] = False
        return end(self)
    budget._local_round, budget.StarProducts.forward_begin, budget.StarProducts.forward_end = local_spy, begin_spy, end_spy
    try:
        for name, kw in (("delay1", dict(f_delay=1)), ("delay0", {}), ("budget", dict(max_time=1e4, f_delay=1)),
                         ("budget0", dict(max_time=1e4))):
            made.clear()
            est = FDSKLClassifier(fed, **dict(PIPE, **kw))
            before = phase_totals(fed, "fdskl/train")
            est.fit(None) if data is None else est.fit(data.X_train, data.y_train, columns=data.columns)
            sent = phase_totals(fed, "fdskl/train")
            out[name] = {"alpha": as_torch(est.alpha_), "n_iter": est.n_iter_,
                         "messages": sent["messages_sent"] - before["messages_sent"],
                         "bytes": sent["bytes_sent"] - before["bytes_sent"],
                         "ahead": [t for t, ahead in made if ahead], "rounds": [t for t, _ in made]}
    finally:
        budget._local_round, budget.StarProducts.forward_begin, budget.StarProducts.forward_end = local_round, begin, end
    return out


def test_pipelined_iteration_sends_one_message_each_way_at_two_parties():
    """f_delay 1 (opt-in): in steady state the active party sends the keeper one message per iteration
    ([e_g of t - 1, e_f of t]) and the keeper one back ([its shares, the phases of t + 1]); the pipeline drains
    (one more message each way) at the epoch end and the end, and the keeper opens with a star of its own.
    f_delay 0 (the default): two messages each way. The same bytes, and each federated model equals its centralised twin."""
    from vfltorch.kernels.trainer import TRAIN_PHASE

    assert TRAIN_PHASE == "fdskl/train"
    runs = launch(two_party_job, 2, coordinator=True)
    T = runs[0]["delay1"]["n_iter"]
    assert T == math.ceil(2 * 427 / 32) == runs[0]["delay0"]["n_iter"] == runs[0]["budget"]["n_iter"]
    drains = 2                                              # after the first epoch and at the end
    assert runs[0]["delay1"]["messages"] == T + drains         # A -> K
    assert runs[1]["delay1"]["messages"] == T + drains + 1     # K -> A, plus the first round's phases
    assert runs[0]["delay0"]["messages"] == 2 * T
    assert runs[1]["delay0"]["messages"] == 2 * T + drains
    # f_delay 0: each party makes round t + 1's local part (the dealer's material, masks, its own phases) while
    # round t's forward product is under way, except across a synchronisation, where the dealer sends that round's
    # material only after it. This run has no monitor, so its only synchronisation is the end (the epoch end is
    # none: curve points send nothing, tests/test_fdskl_curve.py): every round after the first is made ahead.
    # The same messages. (With a stop flag before every iteration nothing is made ahead: budget0 below.)
    for rank in (0, 1):
        got = runs[rank]["delay0"]
        assert got["rounds"] == list(range(T)), rank          # every round once, in order
        assert got["ahead"] == list(range(1, T)), rank
    assert runs[2]["delay0"]["ahead"] == []                 # the dealer makes its rounds in its own loop
    # Under a time budget (a stop flag before every iteration) nothing is made ahead, and the run completes.
    assert runs[0]["budget0"]["n_iter"] == T and runs[0]["budget0"]["ahead"] == runs[1]["budget0"]["ahead"] == []
    # (the pipelined iteration has its own order: _Pipeline)
    assert runs[0]["delay1"]["ahead"] == []
    # Under a time budget (a stop flag each iteration) the pipeline drains every iteration.
    assert runs[0]["budget"]["messages"] >= 2 * T
    # Bytes: the parties' are the same under both delays (the dealer's differ by its windows' 8-byte lengths).
    for rank in (0, 1):
        assert runs[rank]["delay1"]["bytes"] == runs[rank]["delay0"]["bytes"]
    data = bc(Federation.local())
    for name, kw in (("delay1", dict(f_delay=1)), ("delay0", {}), ("budget", dict(f_delay=1)), ("budget0", {})):
        ref = FDSKLClassifier(**dict(PIPE, **kw)).fit(data.X_train, data.y_train)
        a, a_ref = runs[0][name]["alpha"].double(), as_torch(ref.alpha_).double()
        assert float((a - a_ref).norm() / a_ref.norm()) < 0.04, name
    assert runs[1]["delay1"]["alpha"] is None


def test_a_run_that_moves_a_lot_says_so_before_it_starts():
    # a9a at Q = 4 with the defaults (issue 38 measured 4.59 GB): the line names the total and its time at 100 Mbit/s.
    per = iteration_bytes("shared", 4, 1024, 1536, 1536)
    line = announce(per, 128)
    assert line.startswith("vfl: fdskl: training will move about ") and "GB over the links" in line
    assert "100 Mbit/s" in line
    assert announce(per, 1) is None and announce(None, 100) is None       # small runs and no formula: quiet
    assert iteration_bytes("nope", 2, 32, 128, 128) is None
    # The default (sealed) on a9a at Q = 4 (32,561 rows): its setup, (2 (Q - 1) + 32) D bytes per row, then B = 254,
    # 513 iterations of 24 (B + D) bytes: 1.92 GB (the paper protocol's 2.40 GB), 2.6 min at 100 Mbit/s.
    fixed = sealed_setup_bytes(32561, 4, 1536, setup_rows(1536, 2 ** 22)) + sealed_once_bytes(1536)
    line = announce(iteration_bytes("sealed", 4, 254, 1536, 1536), 513, extras=False, fixed=fixed)
    assert "about 1.92 GB" in line and "1.90 GB once" in line and "2.6 min" in line, line
    assert "width selection" not in line
