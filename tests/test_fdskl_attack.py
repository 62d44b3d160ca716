"""FDSKL's default protocol ('shared') against a curious label holder, over real processes (Q = 3 + a dealer).

The attacker is the active party. It pools what it received (the phases its
masked sums produce, every opened f and g), the public seed (so every
party's directions W) and its own columns, and tries to rebuild the passive
parties' columns:

* phase unwrapping: theta_ij - own_ij - (theta_0j - own_0j) = W_P^T (x_i - x_0)_P
  (mod 2 pi), solved by least squares over the features, low frequencies
  first, each new batch unwrapped against the current estimate; min-max
  scaling gives absolute values (each column's minimum is 0);
* distances: the mean over features of cos of the same differences estimates
  the passive kernel k_P(x_i, x_0).

Both succeed under ``protocol='paper'`` and fail under the default.
The same run checks reproducibility (two fits with fresh private masks), the
dealer's view, the monitor's opening schedule, and B = r = 1 against a DSG
written from the paper's equations here.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import Circle, FDSKLClassifier, FourierSampler, LeakWarning, get_loss
from vfltorch.kernels.random_features import counter_words, derive_key
from vfltorch.kernels.shared import dealt_phases
from vfltorch.kernels.trainer import BatchSampler
from conftest import as_torch

TWO_PI = 2 * math.pi
# sigma = 1: the attack's unwrapping needs no tuning (at breast cancer's median sigma, 0.68, it rebuilds the
# passive columns with mean R^2 0.7 on this data; a9a's issue report shows the defaults fall too).
SHARED = dict(protocol="shared", batch_size=32, features_per_step=16, epochs=2, random_state=3, sigma=1.0)
N_TRAIN = 427                     # breast cancer's training rows (the dealer gets the count from the plan)
REF = dict(protocol="shared", n_components=None, batch_size=1, features_per_step=1, epochs=30 / 427, random_state=5, sigma=1.0, lam=1e-3, gamma=0.5)


def wrap(a):
    return torch.remainder(a + math.pi, TWO_PI) - math.pi


def unwrap_attack(theta, own, W_P):
    """Least squares with phase unwrapping, low frequencies first: the passive columns, up to min-max offsets."""
    delta = wrap((theta - own) - (theta[0] - own[0]))
    order = torch.argsort(W_P.norm(dim=0))
    dP = W_P.shape[0]
    m = 2 * dP
    sol = torch.linalg.lstsq(W_P[:, order[:m]].T, delta[:, order[:m]].T).solution
    while m < W_P.shape[1]:
        m = min(W_P.shape[1], m + dP)
        used = order[:m]
        pred = sol.T @ W_P[:, used]
        target = delta[:, used] + TWO_PI * torch.round((pred - delta[:, used]) / TWO_PI)
        sol = torch.linalg.lstsq(W_P[:, used].T, target.T).solution
    est = sol.T
    return est - est.min(0).values


def r2(est, truth):
    """Variance of each column explained by the best affine map of its estimate (squared correlation)."""
    e, t = est - est.mean(0), truth - truth.mean(0)
    return (e * t).sum(0) ** 2 / ((e * e).sum(0) * (t * t).sum(0) + 1e-30)


def distance_attack(theta, own):
    """Mean cos of the differences to row 0: the passive kernel k_P(x_i, x_0) under the paper's protocol."""
    return torch.cos(wrap((theta - own) - (theta[0] - own[0]))).mean(1)


def load(fed):
    return load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0))


def attack_job(fed):
    data = load(fed) if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None else data.y_train
    out = {"rank": fed.rank}
    start = len(fed.transcript.messages)
    # The default protocol, twice: fresh private masks each time.
    fits = []
    for _ in range(2):
        est = FDSKLClassifier(fed, predict_bits=32, **SHARED)     # f compares the models (see below)
        if data is None:
            est.fit(None)
            est.decision_function()
        else:
            est.fit(X, y, columns=data.columns, monitor=(data.X_test, data.y_test))
            fits.append({"alpha": as_torch(est.alpha_), "f": est.decision_function(data.X_test),
                         "history": est.history_,
                         "comm": est.comm_})
    out["fits"] = fits
    fmap = est.feature_map_
    # What the active party gets when the training rows are evaluated on every feature.
    ph = dealt_phases(fmap, X if X is not None else torch.zeros(N_TRAIN, 0, dtype=torch.float64),
                      range(fmap.n_blocks), fed.coordinator)
    out["shared_S"] = ph.S
    out["messages"] = [(m.src, m.dst, str(m.tensor.dtype), m.tensor.numel(), m.phase)
                       for m in fed.transcript.messages[start:]]
    if data is not None:
        out["X"], out["columns"], out["sigma"] = X, torch.as_tensor(est.columns_), est.sigma_
        out["own"] = Circle(16).encode(X @ fmap.omega)
        out["b"] = {t: w for t, w in fmap.phase_words.items()}
    # B = r = 1 under the shared protocol, for the reference DSG.
    ref = FDSKLClassifier(fed, **REF)
    ref.fit(X, y) if data is not None else ref.fit(None)
    out["ref_alpha"] = as_torch(ref.alpha_)
    # The paper's protocol on the same federation (the dealer sits it out): what its active party gets.
    if data is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est = FDSKLClassifier(fed, **dict(SHARED, protocol="paper")).fit(X, y)
        out["paper_theta"] = est.feature_map_.phases(X, range(est.feature_map_.n_blocks))
        out["warned"] = [str(w.message) for w in caught if issubclass(w.category, LeakWarning)]
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(attack_job, 3, coordinator=True, record_transcript=True)


def passive_truth(shared):
    X = torch.cat([shared[r]["X"] for r in (1, 2)], dim=1)
    cols = torch.cat([shared[r]["columns"] for r in (1, 2)])
    return X, cols


def attack(theta_words, own_words, shared):
    circle = Circle(16)
    theta, own = circle.decode(theta_words), circle.decode(own_words)
    X_P, cols = passive_truth(shared)
    W_P = FourierSampler("rbf", shared[0]["sigma"], SHARED["random_state"]).omega(cols, range(theta.shape[1]))
    est = unwrap_attack(theta, own, W_P)
    k_est = distance_attack(theta, own)
    k_true = torch.exp(-((X_P - X_P[0]) ** 2).sum(1) / (2 * shared[0]["sigma"] ** 2))
    corr = float(np.corrcoef(k_est[1:].numpy(), k_true[1:].numpy())[0, 1])
    return r2(est, X_P), corr


def test_paper_protocol_leaks_the_passive_columns(runs):
    shared = runs
    r2_cols, corr = attack(shared[0]["paper_theta"], shared[0]["own"], shared)
    assert float(r2_cols.min()) > 0.99, r2_cols                 # every passive column rebuilt
    assert corr > 0.9, corr
    assert shared[0]["warned"] and "least squares" in shared[0]["warned"][0]    # the warning names the leak
    assert shared[1]["warned"] == []


def test_default_protocol_defeats_both_attacks(runs):
    shared = runs
    S = shared[0]["shared_S"]
    r2_cols, corr = attack(S, shared[0]["own"], shared)
    assert float(r2_cols.max()) < 0.05, r2_cols                 # no better than a trivial baseline, per column
    assert abs(corr) < 0.2, corr                                # n = 427: the null's std is about 0.05
    # The phases it receives are uniform on the angle grid.
    turns = Circle(16).decode(S.reshape(-1)).numpy() / TWO_PI + 0.5
    assert kstest(turns[:50_000], "uniform").pvalue > 1e-4


def test_dealer_receives_only_control_messages(runs):
    shared = runs
    dealer = 3
    to_dealer = [m for r in range(4) for m in shared[r]["messages"] if m[1] == dealer]
    assert to_dealer, "the dealer should get the plan and the stop/bytes counters"
    for src, dst, dtype, numel, phase in to_dealer:
        assert dtype in ("torch.uint8", "torch.int64") and (dtype == "torch.uint8" or numel <= 10), (src, phase)
    # Passive parties receive no label-dependent value in the clear: from the active party only e = x - a
    # (ring words, uniform: int64, or int32 in Z_2^32) and control; checked here by type: nothing real-valued.
    from_active = [m for m in shared[0]["messages"] if m[1] in (1, 2)]
    assert all(m[2] in ("torch.int64", "torch.int32", "torch.int16", "torch.uint8") for m in from_active)


def test_masks_cancel_and_the_model_is_reproducible(runs):
    shared = runs
    a, b = shared[0]["fits"]
    # Fresh private masks each fit; the fixed-point rounding of the two cos/sin factors depends on the mask,
    # so models agree to that rounding, not bit for bit. Training's products run in Z_2^20 (f) and Z_2^16
    # (gradient sums; issue 11): a row's value is exact to about 2**-8 of the sum of its terms' magnitudes,
    # and Adam's per-coefficient steps make a coefficient whose gradient sum is near zero follow that error,
    # so alpha agrees in norm, not coefficient by coefficient (measured: 3.3% of its norm, max |diff| 0.10
    # at max |alpha| 0.55), and f to 1-2% of its scale. Since A's operands are scaled from the 1-norm of its
    # factors (issue 11, s8: 3-9% more rounding error per product), 12 pairs of fits: alpha 3.4-4.4% of its norm,
    # max |f diff| 0.26-1.2% of max |f|, every sign the same.
    # These fits predict in Z_2^32 (predict_bits=32): the default Z_2^24 ring adds up to about 5e-3 of max |f| per
    # scoring (tests/test_fdskl_compress.py), a quarter of this tolerance, which is for the models' difference.
    rel = float((a["alpha"] - b["alpha"]).norm() / b["alpha"].norm())
    assert rel < 0.08, rel
    fa, fb = np.asarray(a["f"]), np.asarray(b["f"])
    np.testing.assert_allclose(fa, fb, rtol=0, atol=2e-2 * float(np.abs(fb).max()))
    assert np.mean(np.sign(fa) == np.sign(fb)) > 0.98
    assert all(shared[r]["fits"][0]["alpha"] is None for r in (1, 2)) and shared[3]["fits"] == []
    # Federated == centralised (plain DSG at Q = 1), up to the 16-bit angles and the fixed point.
    local = FDSKLClassifier(**SHARED).fit(_full(shared), _labels())
    rel = float((a["alpha"] - as_torch(local.alpha_)).norm() / as_torch(local.alpha_).norm())      # measured: 2.6%
    assert rel < 0.08, rel


def test_monitor_opens_held_out_values_once_per_epoch(runs):
    shared = runs
    hist = shared[0]["fits"][0]["history"]
    per_epoch = 427 / 32
    opened = [p["iteration"] for p in hist if "test_accuracy" in p]
    assert opened == [math.ceil(per_epoch - 1e-9), math.ceil(2 * per_epoch - 1e-9)], opened
    assert len(hist) > len(opened)                              # other log points carry losses and bytes only
    assert hist[-1]["test_accuracy"] > 0.9


def test_b_equals_r_equals_one_matches_a_dsg_from_the_papers_equations(runs):
    shared = runs
    X, y = _full(shared), _labels()
    n = X.shape[0]
    sampler = BatchSampler(n, 1, derive_key(REF["random_state"], 0xBA7C))
    T = math.ceil(REF["epochs"] * n - 1e-9)
    W = FourierSampler("rbf", REF["sigma"], REF["random_state"]).omega(range(X.shape[1]), range(T))
    key = derive_key(REF["random_state"], 0xB0B)            # b_j: public, from the seed
    b = Circle(16).decode(counter_words(key, torch.arange(T), 16))
    loss = get_loss("logistic", "binary")
    gamma, lam = REF["gamma"], REF["lam"]
    alpha = torch.zeros(0, dtype=torch.float64)
    for t in range(T):
        i = int(sampler.next()[0])
        phi = math.sqrt(2) * torch.cos(X[i] @ W[:, :t + 1] + b[:t + 1])      # phi_j(x_i), j <= t
        f = float(phi[:t] @ alpha)                                           # Algorithm 2
        d = float(loss.derivative(torch.tensor([f], dtype=torch.float64), y[i:i + 1])[0])
        alpha = torch.cat([alpha * (1 - gamma * lam), torch.tensor([-gamma * d * float(phi[t])])])   # lines 8-9
    got = shared[0]["ref_alpha"]
    assert got.shape == alpha.shape == (T,)
    torch.testing.assert_close(got, alpha, rtol=0, atol=1e-3)
    # The same reference, centralised (no protocol): to the 16-bit angle grid of the phases only.
    local = FDSKLClassifier(**REF).fit(X, y)
    torch.testing.assert_close(as_torch(local.alpha_), alpha, rtol=0, atol=2e-4)


def _full(shared):
    X_P, cols = passive_truth(shared)
    return torch.cat([shared[0]["X"], X_P], dim=1)


def _labels():
    return load(Federation.local()).y_train


def test_paper_and_cached_schedules_compute_the_same_model():
    """The schedules change what crosses the wire, not the arithmetic (Q = 1, 64-bit angles)."""
    data = load(Federation.local())
    kw = dict(batch_size=16, features_per_step=4, epochs=1, random_state=2, sigma=1.0, angle_bits=64,
              protocol="paper", mask_seed="seed")
    a = FDSKLClassifier(schedule="paper", **kw).fit(data.X_train, data.y_train)
    b = FDSKLClassifier(schedule="cached", **kw).fit(data.X_train, data.y_train)
    assert a.n_iter_ == b.n_iter_ == math.ceil(427 / 16)
    torch.testing.assert_close(as_torch(a.alpha_), as_torch(b.alpha_), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_same_seed_same_model_under_launch_and_torchrun(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    out = {}
    for bits in ("20", "32"):
        common = ["fdskl", "--dataset", "breast_cancer", "--seed", "4", "--quiet", "--product-bits", bits]
        common += ["--predict-bits", "32"] if bits == "32" else []      # the precise run predicts in Z_2^32 too
        for name, cmd in (("launch", [sys.executable, "-m", "vfltorch", *common, "--parties", "3"]),
                          ("torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
                                        "-m", "vfltorch", *common])):
            path = tmp_path / f"{name}{bits}.json"
            r = subprocess.run([*cmd, "--output-json", str(path)], capture_output=True, text=True, env=env,
                               timeout=600)
            assert r.returncode == 0, r.stderr[-2000:]
            out[name, bits] = json.loads(path.read_text())
    # Fresh masks in every run: the models agree to the products' rounding.
    # Default (issue 11: training's Z_2^20 / Z_2^16 products; see test_masks_cancel_and_the_model_is_reproducible):
    # test accuracy to one of the 142 test rows (measured: equal twice), AUC to 3e-3 (measured: equal, then
    # 0.99808 vs 0.99915). The reported batch loss, a mean over a few batches of f computed in Z_2^20, is not
    # compared here: it moved from 0.038 to 0.060 between two such runs.
    a, b = out["launch", "20"], out["torchrun", "20"]
    assert a["fdskl"]["protocol"] == b["fdskl"]["protocol"] == "shared"
    assert a["metrics"]["test_accuracy"] == pytest.approx(b["metrics"]["test_accuracy"], abs=1.01 / 142)
    assert a["metrics"]["test_auc"] == pytest.approx(b["metrics"]["test_auc"], abs=3e-3)
    # --product-bits 32 (both products in Z_2^32, the precision of before the narrow rings): the same test
    # accuracy, AUC to 1e-3 and the batch loss to 1% (measured: 0.04402 vs 0.04414).
    a, b = out["launch", "32"], out["torchrun", "32"]
    assert a["metrics"]["test_accuracy"] == b["metrics"]["test_accuracy"]
    assert a["metrics"]["test_auc"] == pytest.approx(b["metrics"]["test_auc"], abs=1e-3)
    assert a["metrics"]["batch_loss"] == pytest.approx(b["metrics"]["batch_loss"], rel=1e-2)
