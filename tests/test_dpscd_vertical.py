"""Vertical DP-SCD over real gloo processes equals the centralised run, and keeps raw columns at home."""

import warnings

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.privacy import DPSCDConfig, fit_glm
from vfltorch.privacy.primal import check_centralised

DATA = DataConfig(dataset="breast_cancer", scale="maxabs", normalize_rows=True, seed=0)
# The encrypted protocol (Paillier; the default, shared, is tested against its centralised twin in
# test_dpscd_shared), with small keys (the crypto package's test flag) and the fast RDP accountant to keep it short.
TEST_KEYS = dict(key_bits=512, insecure_key=True, accountant="rdp", protocol="encrypted")
RUNS = {
    # name: (config, secure sum)
    "dual-svm-tree": (dict(task="svm", variant="dual", epsilon=1.0, L=30, C=0.05, lam=1e-3, epochs=2), False),
    "dual-logistic-secure": (dict(task="logistic", variant="dual", epsilon=0.5, L=40, C=0.1, lam=1e-3, epochs=2),
                             True),
    "seq-ridge-paper": (dict(task="ridge", variant="seq", epsilon=2.0, L=20, C=0.01, lam=1e-2, epochs=1,
                             protocol="paper"), False),
}
SIMULATION_SEED = 7


def run_all(fed, data):
    out = {}
    for name, (kwargs, secure) in RUNS.items():
        start = len(fed.transcript) if fed.transcript is not None else 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # simulation mode, the paper protocol's leak: both expected
            res = fit_glm(fed, data.X_train, data.y_train, DPSCDConfig(**{**TEST_KEYS, **kwargs}),
                          simulation_seed=SIMULATION_SEED, secure=secure, monitor_objective=True,
                          noise_blocks=getattr(data, "noise_blocks", None))
        out[name] = {"theta": res.theta.numpy(), "alpha": None if res.alpha is None else res.alpha.numpy(),
                     "history": res.history, "sigma": res.sigma, "epsilon": res.epsilon,
                     "observers": res.observers}
        if fed.transcript is not None:
            out[name]["sent"] = [(m.phase, m.dst, m.tensor.numpy().astype(np.float64).ravel())
                                 for m in fed.transcript.messages[start:]
                                 if m.tensor.dtype not in (torch.uint8, torch.bool, torch.int64)]
            out[name]["phases_to_passive"] = {m.phase for m in fed.transcript.messages[start:] if m.dst != 0}
    return out


def party_job(fed):
    data = load_party_data(fed, DATA)
    out = run_all(fed, data)
    out["columns"] = data.columns.tolist()
    out["raw"] = np.concatenate([data.X_train.numpy().ravel(), data.X_test.numpy().ravel()])
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
    # The encrypted protocol computes X_B^T zeta_B in fixed point (2^-40, 2^-48): equal to ~1e-12.
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
        for name in RUNS:
            for phase, _dst, payload in party[name]["sent"]:
                hits = np.isin(payload[payload != 0], raw)
                assert not hits.any(), (name, phase, int(hits.sum()))


def test_what_the_active_party_sends_the_passive_parties(federated):
    active = federated[0]
    # Encrypted protocol: the key, the schedule seed, ciphertexts of zeta_B, noisy updates - never zeta_B.
    for name in ("dual-svm-tree", "dual-logistic-secure"):
        # (the ring-masked sums of --secure-sum pass through passive parties; the monitor was asked for)
        training = {p for p in active[name]["phases_to_passive"] if p.startswith("dpscd/") and
                    "masked-sum" not in p and p != "dpscd/monitor" and p != "dpscd/margins"}
        assert training <= {"dpscd/key", "dpscd/schedule", "dpscd/enc-steps", "dpscd/noisy-updates"}, training
        assert {"dpscd/enc-steps", "dpscd/noisy-updates"} <= training
        assert not any(phase == "dpscd/steps" for phase, _, _ in active[name]["sent"])
        assert np.isfinite(active[name]["observers"]["passive_party"]["epsilon"])
    # The paper's protocol: the clipped steps themselves, |zeta| <= C.
    C = RUNS["seq-ridge-paper"][0]["C"]
    steps = [payload for phase, dst, payload in active["seq-ridge-paper"]["sent"] if phase == "dpscd/steps"]
    assert steps and max(np.abs(p).max() for p in steps) <= C + 1e-12
    assert active["seq-ridge-paper"]["observers"]["passive_party"]["epsilon"] == float("inf")


def test_primal_dp_scd_refuses_to_run_across_parties():
    class TwoParties:
        num_parties = 2

    with pytest.raises(VFLInputError, match="slice of another party's raw column.*--variant dual"):
        check_centralised(TwoParties())
