"""The three hetero-LR leaks, attacked: they succeed against the paper's protocol and fail against the default.

One launch (guest, host, coordinator; 512-bit test keys) trains four models on
synthetic rows whose label depends on the guest's columns only, so the
host's own columns say next to nothing about it (the own-columns baseline):

* paper SGD with per-epoch monitoring and shared SGD: the host's label
  inference (the exact 0/1 solve of the first batch; stacked least squares
  at batch 50) and the guest's reconstruction of the host's test columns;
* paper SQN and shared SQN: the coordinator's least-squares fit of the
  Hessian from the curvature pairs it holds.

Each process records exactly what its role holds: the host its block of w
after every step (paper) or its share of it (shared), the guest the scores it
received, the coordinator the pairs (s, v) it decrypted; the transcripts give
every message received.
"""

import numpy as np
import pytest
import torch

from vfltorch.comm import launch
from vfltorch.linear import HeteroLogisticRegression, attacks
from vfltorch.linear.batches import BatchPlan
from vfltorch.linear.bounds import quantize
from vfltorch.linear.standardize import OwnColumnScaling

N, N_TEST, D_G, D_H = 300, 120, 5, 10
BATCH, SEED, L2, LR = 50, 3, 0.01, 0.2
COMMON = dict(batch_size=BATCH, l2=L2, tol=0.0, key_bits=512, insecure_key=True, crypto_processes=1,
              random_state=SEED, lr=LR)
RUNS = {
    ("paper", "sgd"): dict(COMMON, protocol="paper", optimizer="sgd", max_epochs=12),
    ("shared", "sgd"): dict(COMMON, protocol="shared", optimizer="sgd", max_epochs=12),
    # the packed-features layout of the paper protocol (columns encrypted once): the same host view
    ("packed", "sgd"): dict(COMMON, protocol="paper", packed_features=True, optimizer="sgd", max_epochs=12),
    ("paper", "sqn"): dict(COMMON, protocol="paper", optimizer="sqn", L=2, M=5, decay=0.5, hessian_batch=N,
                           max_epochs=8),
    ("shared", "sqn"): dict(COMMON, protocol="shared", optimizer="sqn", L=2, M=5, decay=0.5, hessian_batch=N,
                            max_epochs=8),
}


def synthetic():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(N + N_TEST, D_G + D_H, generator=g, dtype=torch.float64)
    beta = torch.tensor([1.5, -1.0, 0.8, 0.5, -0.7], dtype=torch.float64)
    y = torch.where(X[:, :D_G] @ beta + 0.3 * torch.randn(N + N_TEST, generator=g, dtype=torch.float64) > 0,
                    1.0, -1.0)
    return X[:N], y[:N], X[N:], y[N:]


def columns(fed, X):
    return X[:, :D_G] if fed.is_active else X[:, D_G:]


def trained(X_cols):
    """A party's columns as the protocol computes with them (``standardize=True``, the default): standardised
    on its own training rows, which that party knows, so its attacks start from them."""
    return OwnColumnScaling.fit(X_cols, center=True).apply(X_cols)


def attack_job(fed):
    X, y, X_test, y_test = synthetic()
    views = attacks.record_views(host_rank=1)             # what each role holds, where the protocol puts it

    out = {}
    for key, kw in RUNS.items():
        for v in views.values():
            v.clear()
        start = len(fed.transcript)
        data = None if fed.is_coordinator else columns(fed, X)
        monitor = None
        if key == ("paper", "sgd") and not fed.is_coordinator:
            monitor = (columns(fed, X_test), y_test if fed.is_active else None)
        est = HeteroLogisticRegression(fed, **kw)
        est.fit(data, y if fed.is_active else None, monitor=monitor)
        sent = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript.messages[start:]]
        out[key] = {"views": {k: list(v) for k, v in views.items()}, "sent": sent, "coef": None if est.coef_ is None else torch.as_tensor(est.coef_)}
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(attack_job, 2, coordinator=True, record_transcript=True, timeout=300)


def _received(runs, key, rank):
    return [(phase, src, t) for res in runs for (phase, src, dst, t) in res[key]["sent"] if dst == rank]


def _host_view(runs, key):
    """The host's per-step block (paper) or share (shared), the public batches, its quantised columns."""
    protocol, _ = key
    X, y, _, _ = synthetic()
    fx = 10 if protocol == "shared" else 16
    Xh = quantize(trained(X[:, D_G:]), fx).numpy()
    traj = runs[1][key]["views"]["trajectory"]
    weights = [attacks.as_numpy(w) for w, _ in traj]
    etas = [eta for _, eta in traj]
    plan = BatchPlan(N, BATCH, N, SEED)
    batches = [rows for e in range(RUNS[key]["max_epochs"]) for rows in plan.epoch(e)][:len(weights)]
    grads = attacks.gradients_from_trajectory(weights, etas, L2)
    return Xh, y.numpy(), batches, grads


def _label_attacks(runs, key):
    Xh, y, batches, grads = _host_view(runs, key)
    first = batches[0]
    labels = attacks.first_batch_labels(Xh[first], grads[0])
    exact = 0.5 if labels is None else float((labels == y[first]).mean())
    stacked = attacks.auc(-attacks.stacked_residuals(Xh, batches, grads), y)
    return exact, stacked


@pytest.fixture(scope="module")
def own_columns():
    X, y, _, _ = synthetic()
    Xh = X[:, D_G:].numpy()
    from sklearn.linear_model import LogisticRegression

    first = BatchPlan(N, BATCH, N, SEED).epoch(0)[0]
    model = LogisticRegression(C=1e4, max_iter=5000).fit(Xh, y.numpy() > 0)
    first_acc = float(((model.decision_function(Xh[first]) > 0) == (y.numpy()[first] > 0)).mean())
    return {"auc": attacks.own_columns_auc(Xh, y.numpy()), "first_batch_accuracy": first_acc}


def test_host_reads_labels_from_its_gradients_under_the_paper_protocol(runs, own_columns):
    exact, stacked = _label_attacks(runs, ("paper", "sgd"))
    assert exact == 1.0                                             # every label of the first batch
    assert stacked > own_columns["auc"] + 0.2, (stacked, own_columns)
    assert own_columns["auc"] < 0.75                                # the host's own columns are nearly useless


def test_host_reads_labels_under_the_packed_layout_too(runs, own_columns):
    """--packed-features changes how the paper protocol computes, not what the host learns: the leak stays."""
    exact, stacked = _label_attacks(runs, ("packed", "sgd"))
    assert exact == 1.0
    assert stacked > own_columns["auc"] + 0.2, (stacked, own_columns)


def test_host_learns_no_labels_under_the_shared_protocol(runs, own_columns):
    exact, stacked = _label_attacks(runs, ("shared", "sgd"))
    assert exact <= max(own_columns["first_batch_accuracy"], 0.5) + 0.1, exact
    assert stacked <= own_columns["auc"] + 0.02, (stacked, own_columns)
    # ... and the same host still ends with its own, correct block of the model.
    coef = runs[1][("shared", "sgd")]["coef"]
    paper = runs[1][("paper", "sgd")]["coef"]
    assert coef.shape == (D_H,) and float((coef - paper).abs().max()) < 0.05


def test_guest_rebuilds_host_test_columns_from_monitoring_only(runs):
    _, _, X_test, _ = synthetic()
    host_cols = X_test[:, D_G:].numpy()
    # Paper protocol with per-epoch monitoring: one host score per test row per epoch.
    seen = runs[0][("paper", "sgd")]["views"]["scores"]
    assert len(seen) == RUNS[("paper", "sgd")]["max_epochs"]
    u_host = np.column_stack([attacks.as_numpy(u - own) for u, own in seen])
    assert attacks.r_squared(u_host, host_cols).min() > 0.99
    # Default: nothing per test row reaches the guest during training.
    assert runs[0][("shared", "sgd")]["views"]["scores"] == []
    per_test_row = [t for ph, src, t in _received(runs, ("shared", "sgd"), 0) if N_TEST in t.shape]
    assert per_test_row == []
    assert attacks.r_squared(None, host_cols).max() == pytest.approx(0.0, abs=1e-12)
    # What it does receive about the training rows (Beaver openings X_A[S] - a) explains none of X_A.
    X, _, _, _ = synthetic()
    Xh = quantize(trained(X[:, D_G:]), 10).numpy()
    plan = BatchPlan(N, BATCH, N, SEED)
    batches = [rows for e in range(RUNS[("shared", "sgd")]["max_epochs"]) for rows in plan.epoch(e)]
    openings = [t for ph, src, t in _received(runs, ("shared", "sgd"), 0)
                if src == 1 and ph.endswith("margins") and tuple(t.shape) == (BATCH, D_H)]
    assert len(openings) == len(batches)
    features = np.vstack([t.numpy().astype(np.float64) for t in openings])
    targets = np.vstack([Xh[rows] for rows in batches])
    assert attacks.r_squared(features, targets).max() < 0.02


def _true_hessian():
    X, _, _, _ = synthetic()
    Xg, Xh = quantize(trained(X[:, :D_G]), 16), quantize(trained(X[:, D_G:]), 16)
    Xf = torch.cat([Xg, torch.ones(N, 1, dtype=torch.float64), Xh], 1).numpy()
    return 0.25 * Xf.T @ Xf / N


def test_coordinator_fits_the_cross_party_hessian_under_the_paper_protocol(runs):
    pairs = runs[2][("paper", "sqn")]["views"]["pairs"]
    assert len(pairs) >= 10
    H = attacks.hessian_fit([(attacks.as_numpy(s), attacks.as_numpy(v)) for s, v in pairs], D_G + 1 + D_H)
    cross = (slice(0, D_G), slice(D_G + 1, None))
    assert attacks.correlation(H[cross], _true_hessian()[cross]) > 0.9


def test_coordinator_holds_no_gradient_or_curvature_pair_under_the_shared_protocol(runs):
    key = ("shared", "sqn")
    assert runs[2][key]["views"]["pairs"] == []
    assert attacks.hessian_fit([], D_G + 1 + D_H) is None
    received = _received(runs, key, 2)
    assert received
    for phase, src, t in received:
        # Accept bits and stop decisions (JSON) and their framing headers: a few bytes each.
        assert t.numel() <= 64, (phase, src, tuple(t.shape))
    # The pairs exist: the data parties accepted some (and the model matches the paper protocol's).
    guest_coef = runs[0][key]["coef"]
    assert guest_coef is not None and float((guest_coef - runs[0][("paper", "sqn")]["coef"]).abs().max()) < 0.05
