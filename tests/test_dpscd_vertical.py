"""Vertical DP-SCD over real gloo processes equals the centralised run, and keeps raw columns at home."""

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.privacy import DPSCDConfig, fit_glm
from vfltorch.privacy.primal import check_centralised

DATA = DataConfig(dataset="breast_cancer", scale="maxabs", normalize_rows=True, seed=0)
RUNS = {
    # name: (config, secure sum)
    "dual-svm-tree": (dict(task="svm", variant="dual", epsilon=1.0, L=30, C=0.05, lam=1e-3, epochs=3), False),
    "dual-logistic-secure": (dict(task="logistic", variant="dual", epsilon=0.5, L=40, C=0.1, lam=1e-3, epochs=2),
                             True),
    "seq-ridge-tree": (dict(task="ridge", variant="seq", epsilon=2.0, L=20, C=0.01, lam=1e-2, epochs=1), False),
}
SEED, NOISE_SEED = 3, 7


def run_all(fed, data):
    out = {}
    for name, (kwargs, secure) in RUNS.items():
        res = fit_glm(fed, data.X_train, data.y_train, DPSCDConfig(**kwargs), seed=SEED, noise_seed=NOISE_SEED,
                      secure=secure, noise_blocks=getattr(data, "noise_blocks", None))
        out[name] = {"theta": res.theta.numpy(), "alpha": None if res.alpha is None else res.alpha.numpy(),
                     "history": res.history, "sigma": res.sigma, "epsilon": res.epsilon}
    return out


def party_job(fed):
    data = load_party_data(fed, DATA)
    out = run_all(fed, data)
    out["columns"] = data.columns.tolist()
    out["raw"] = np.concatenate([data.X_train.numpy().ravel(), data.X_test.numpy().ravel()])
    out["sent"] = [(m.phase, m.dst, m.tensor.numpy().astype(np.float64).ravel()) for m in fed.transcript
                   if m.tensor.dtype not in (torch.uint8, torch.bool, torch.int64)]
    return out


@pytest.fixture(scope="module")
def federated():
    return launch(party_job, 3, record_transcript=True)


@pytest.fixture(scope="module")
def centralised(federated):
    fed = Federation.local()
    data = load_party_data(fed, DATA)
    # The same private noise streams as the federation: one per party's column block.
    data.noise_blocks = [np.asarray(r["columns"]) for r in federated]
    return run_all(fed, data)


@pytest.mark.parametrize("name", list(RUNS))
def test_vertical_run_equals_the_centralised_run(federated, centralised, name):
    theta = np.zeros_like(centralised[name]["theta"])
    for party in federated:
        theta[party["columns"]] = party[name]["theta"]
    scale = np.abs(centralised[name]["theta"]).max()
    np.testing.assert_allclose(theta, centralised[name]["theta"], rtol=1e-8, atol=1e-10 * scale)
    np.testing.assert_allclose(federated[0][name]["alpha"], centralised[name]["alpha"], rtol=1e-8, atol=1e-12)
    assert federated[1][name]["alpha"] is None and federated[2][name]["alpha"] is None   # alpha stays active
    fed_obj = [h["objective"] for h in federated[0][name]["history"]]
    cen_obj = [h["objective"] for h in centralised[name]["history"]]
    np.testing.assert_allclose(fed_obj, cen_obj, rtol=1e-9)
    assert federated[0][name]["sigma"] == centralised[name]["sigma"]
    assert federated[0][name]["epsilon"] == centralised[name]["epsilon"] <= RUNS[name][0]["epsilon"]
    assert all(p[name]["sigma"] == federated[0][name]["sigma"] for p in federated)   # agreed without a message


def test_no_message_carries_a_raw_feature_value(federated):
    for party in federated:
        raw = np.unique(party["raw"][party["raw"] != 0])
        for phase, _dst, payload in party["sent"]:
            hits = np.isin(payload[payload != 0], raw)
            assert not hits.any(), (phase, int(hits.sum()))


def test_passive_parties_only_learn_the_clipped_steps(federated):
    # During training the active party (rank 0) sends the passive parties nothing but the zeta of each batch.
    training = {phase for phase, dst, _ in federated[0]["sent"] if dst != 0 and phase.startswith("dpscd")}
    assert training == {"dpscd/steps"}
    C = max(kwargs["C"] for kwargs, _ in RUNS.values())
    for phase, dst, payload in federated[0]["sent"]:
        if phase == "dpscd/steps":
            assert np.abs(payload).max() <= C + 1e-12


def test_primal_dp_scd_refuses_to_run_across_parties():
    class TwoParties:
        num_parties = 2

    with pytest.raises(VFLInputError, match="slice of another party's raw column.*--variant dual"):
        check_centralised(TwoParties())
