"""The shared-model protocol (the default) against the centralised twin, and vector-free L-BFGS against two-loop.

One launch (guest, host, coordinator-as-dealer) trains SGD and SQN on
breast_cancer; the models, losses and predictions must match the
centralised twin (one process, every column, the same optimizer) up to the
fixed point of the shares (2^-16) and of the features in the products
(2^-10, applied to the twin too).
"""

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.linear import CurvatureMemory, HeteroLogisticRegression, two_loop
from vfltorch.linear.vlbfgs import direction_coefficients

CONFIG = DataConfig(dataset="breast_cancer", scale="standard", test_fraction=0.2, seed=0)
COMMON = dict(batch_size=64, max_epochs=4, tol=0.0, l2=0.01, random_state=5)
RUNS = {"sgd": dict(COMMON, optimizer="sgd", lr=0.2),
        "sqn": dict(COMMON, optimizer="sqn", lr=0.2, decay=0.5, L=2, M=3)}


def test_vector_free_coefficients_give_the_two_loop_direction():
    g = torch.Generator().manual_seed(1)
    d, m = 9, 4
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    H = A @ A.T + 0.5 * torch.eye(d, dtype=torch.float64)
    pairs = []
    for _ in range(m):
        s = torch.randn(d, generator=g, dtype=torch.float64)
        pairs.append((s, H @ s))
    grad = torch.randn(d, generator=g, dtype=torch.float64)
    B = torch.stack([s for s, _ in pairs] + [v for _, v in pairs] + [grad])
    delta = direction_coefficients(B @ B.T, m)
    torch.testing.assert_close(delta @ B, two_loop(grad, pairs), rtol=1e-10, atol=1e-12)
    memory = CurvatureMemory(m)
    for s, v in pairs:
        memory.push(s, v)
    torch.testing.assert_close(delta @ B, memory.direction(grad), rtol=1e-10, atol=1e-12)
    assert torch.equal(direction_coefficients(grad[None] @ grad[None].T, 0), torch.tensor([1.0], dtype=torch.float64))


def shared_job(fed):
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    out = {}
    for name, kw in RUNS.items():
        est = HeteroLogisticRegression(fed, **kw)
        est.fit(None if data is None else data.X_train,
                None if data is None or not fed.is_active else data.y_train)
        scores = est.decision_function(None if data is None else data.X_test)
        out[name] = {"coef": None if est.coef_ is None else torch.as_tensor(est.coef_), "intercept": est.intercept_, "scores": scores,
                     "history": getattr(est, "history_", None), "encryption": est.encryption_,
                     "pairs": est.n_curvature_pairs_}
    return out


@pytest.fixture(scope="module")
def results():
    return launch(shared_job, 2, coordinator=True, timeout=300)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_shared_protocol_equals_centralised(results, name):
    full = load_party_data(Federation.local(), CONFIG)
    ref = HeteroLogisticRegression(None, feature_frac_bits=10, **RUNS[name]).fit(full.X_train, full.y_train)
    guest, host = results[0][name], results[1][name]
    assert guest["encryption"].startswith("additive secret sharing")
    coef = torch.cat([guest["coef"], host["coef"]])
    # Shares carry 16 fractional bits; each product's truncation is off by at most one unit.
    assert float((coef - torch.as_tensor(ref.coef_)).abs().max()) < 2e-3
    assert guest["intercept"] == pytest.approx(ref.intercept_, abs=2e-3)
    np.testing.assert_allclose([h["loss"] for h in guest["history"]], [h["loss"] for h in ref.history_],
                               rtol=0, atol=1e-4)
    torch.testing.assert_close(guest["scores"], ref.decision_function(full.X_test), rtol=0, atol=2e-2)
    assert host["scores"] is None and results[2][name]["coef"] is None
    if name == "sqn":
        assert guest["pairs"] == ref.n_curvature_pairs_ and guest["pairs"] >= 3
