"""The label-recovery attack on vertical DP-SCD, run by the passive party over real gloo processes.

The passive party pools everything it has: the batch schedule (it must know it), what it received
from the active party (the clipped steps zeta_B under the paper's protocol; ciphertexts and noisy
updates X_{l,B}^T zeta_B + noise of its own block under the encrypted protocol) and its own columns.
On a row's first visit alpha_j = 0, so sign(zeta_j) = y_j: the attack guesses y_j from the sign of
zeta_j, read directly (paper) or estimated by least squares from the noisy update (encrypted).
It recovers every label under the paper's protocol, and is at chance under the encrypted one - but
only because of the DP noise: the same attack on the noise-free encrypted protocol recovers them.
(The default protocol, shared, meets the same attack over a TLS federation in ``test_dpscd_shared``.)
"""

import warnings

import numpy as np
import pytest
import torch

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.privacy import DPSCDConfig, fit_glm

DATA = DataConfig(dataset="breast_cancer", scale="maxabs", normalize_rows=True, seed=0)
# The CLI's default C for DP-SCD (0.01); small batches so that |B| <= d_l and least squares is determined.
BASE = dict(task="logistic", variant="dual", epsilon=1.0, delta=1e-3, L=6, C=0.01, lam=1e-3, epochs=1,
            key_bits=512, insecure_key=True, accountant="rdp")
RUNS = {"paper": dict(protocol="paper"), "encrypted": dict(protocol="encrypted"),
        "encrypted-no-noise": dict(protocol="encrypted", sigma=0.0)}


def party_job(fed):
    data = load_party_data(fed, DATA)
    out = {}
    for name, extra in RUNS.items():
        seen = []
        prev = {"v": torch.zeros(data.X_train.shape[1], dtype=data.X_train.dtype)}

        def record(t, batch, zeta, state):
            # What this party knows after the step: the rows, zeta_B if it was sent, its block's update.
            seen.append((batch.numpy().copy(), None if zeta is None else zeta.numpy().copy(),
                         (state.v - prev["v"]).numpy().copy()))
            prev["v"] = state.v.clone()

        start = len(fed.transcript)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # the paper protocol's leak warning: expected here
            fit_glm(fed, data.X_train, data.y_train, DPSCDConfig(**{**BASE, **extra}), monitor_every=0,
                    on_step=record)
        out[name] = {"seen": seen, "phases": {m.phase for m in fed.transcript.messages[start:] if m.dst != 0}}
    out["X"] = data.X_train.numpy()
    out["y"] = None if data.y_train is None else data.y_train.numpy()
    return out


def label_attack(X, seen):
    """The passive party's guesses {row: +-1} for every row at its first visit."""
    guesses = {}
    for batch, zeta, update in seen:
        if len(batch) == 0:
            continue
        if zeta is None:      # only the noisy update of its block: solve X_B^T zeta = update
            zeta = np.linalg.lstsq(X[batch].T, update, rcond=None)[0]
        for j, z in zip(batch.tolist(), zeta.tolist()):
            if j not in guesses:
                guesses[j] = 1.0 if z > 0 else -1.0
    return guesses


def balanced_accuracy(guesses, y):
    rows = np.array(sorted(guesses))
    g, t = np.array([guesses[j] for j in rows]), y[rows]
    return 0.5 * ((g[t > 0] > 0).mean() + (g[t < 0] < 0).mean()), len(rows)


@pytest.fixture(scope="module")
def runs():
    return launch(party_job, 2, record_transcript=True)


def test_the_paper_protocol_leaks_every_label_to_the_passive_party(runs):
    active, passive = runs
    acc, rows = balanced_accuracy(label_attack(passive["X"], passive["paper"]["seen"]), active["y"])
    assert rows > 200 and acc > 0.99


def test_the_encrypted_protocol_leaves_the_passive_party_at_chance(runs):
    active, passive = runs
    assert "dpscd/steps" not in active["encrypted"]["phases"]          # zeta never travels in the clear
    assert all(zeta is None for _, zeta, _ in passive["encrypted"]["seen"])
    acc, rows = balanced_accuracy(label_attack(passive["X"], passive["encrypted"]["seen"]), active["y"])
    # ~400 first visits: the standard error of a balanced accuracy at chance is ~0.027.
    assert rows > 200 and abs(acc - 0.5) < 0.1, acc


def test_without_noise_the_same_attack_recovers_the_labels(runs):
    # The attack is real: what protects the labels under the encrypted protocol is the DP noise.
    active, passive = runs
    acc, rows = balanced_accuracy(label_attack(passive["X"], passive["encrypted-no-noise"]["seen"]), active["y"])
    assert rows > 200 and acc > 0.9, acc
