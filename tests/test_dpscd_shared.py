"""Vertical DP-SCD with a dealer instead of Paillier (``--vertical-protocol shared``, the default; issue 38).

Real processes over the TLS mesh of a federation file that lists a dealer (the cross-organisation path; two
torch threads per party): the federated model equals the centralised run to the fixed point of the shares; the
active party's one opening of the passive columns, X - U, is uncorrelated with them; the passive party's view is the noisy update of its block and nothing else (the label
attack of ``test_dpscd_label_attack`` is at chance, and recovers the labels once the noise is off: the attack
is real, the noise is what stops it); the dealer receives only sizes and the schedule's public facts. Shared is
the default vertical protocol; the CLI starts the dealer itself (test_dpscd_cli).
"""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from test_dpscd_label_attack import BASE, DATA, balanced_accuracy, label_attack
from vfltorch.comm import Federation
from vfltorch.comm import federation_file as ff
from vfltorch.comm.identity import generate
from vfltorch.comm.link import launch_local
from vfltorch.comm.transcript import Transcript
from vfltorch.privacy.shared_updates import BITS, FX, PHASE
from vfltorch.data import load_party_data
from vfltorch.privacy import DPSCDConfig, fit_glm

RUNS = {"shared": dict(protocol="shared"), "shared-no-noise": dict(protocol="shared", sigma=0.0)}
EQUAL = dict(task="svm", variant="dual", epsilon=1.0, L=30, C=0.05, lam=1e-3, epochs=2, accountant="rdp",
             protocol="shared")


def party_job(fed):
    fed.transcript = Transcript()
    data = load_party_data(fed, DATA) if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None else data.y_train
    out = {}
    for name, extra in RUNS.items():
        seen = []
        prev = {"v": None}

        def record(t, batch, zeta, state):
            if prev["v"] is None:
                prev["v"] = torch.zeros_like(state.v)
            seen.append((batch.numpy().copy(), None if zeta is None else zeta.numpy().copy(),
                         (state.v - prev["v"]).numpy().copy()))
            prev["v"] = state.v.clone()

        start = len(fed.transcript)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_glm(fed, X, y, DPSCDConfig(**{**BASE, **extra}), monitor_every=0, on_step=record)
        out[name] = {"seen": seen, "sent": [(m.phase, m.dst, m.tensor.numel() * m.tensor.element_size())
                                             for m in fed.transcript.messages[start:]]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_glm(fed, X, y, DPSCDConfig(**EQUAL), simulation_seed=7, monitor_every=0)
    out["theta"] = None if res is None else res.theta.numpy()
    if X is not None and not fed.is_active:
        # What the active party is opened of this party's columns: X - U in the ring, once per run.
        opened = [m.tensor for m in fed.transcript.messages if m.phase == PHASE and m.dst == fed.active
                  and m.tensor.numel() == X.numel()]
        out["opened"] = opened[0].to(torch.int64).reshape(X.shape).numpy()
        out["Xq"] = FX.encode(X).numpy()
    out["columns"] = None if data is None else data.columns.tolist()
    out["X"] = None if X is None else X.numpy()
    out["y"] = None if y is None else y.numpy()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("federation")
    keys, parties = {}, []
    for rank, (name, role) in enumerate((("bank", "active"), ("shop", "passive"), ("dealer", "coordinator"))):
        ident = generate(name, folder / f"{name}.pem")
        keys[name] = ident.path
        parties.append(dict(name=name, rank=rank, role=role, address=f"127.0.0.1:{_free_port()}",
                            fingerprint=ident.fingerprint, certificate=f"{name}.crt"))
    ff.write(folder / "fed.json", parties, federation="dpscd-shared")
    return launch_local(party_job, folder / "fed.json", keys, timeout=120, threads=2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def received(runs, name: str, rank: int) -> list:
    """(phase, bytes) of every message ``rank`` received in run ``name`` (the senders' transcripts)."""
    return [(phase, size) for r in runs for phase, dst, size in r[name]["sent"] if dst == rank]


def test_the_passive_party_sees_only_its_noisy_update(runs):
    active, passive, dealer = runs
    assert all(zeta is None for _, zeta, _ in passive["shared"]["seen"])      # zeta_B never reaches it
    phases = {phase for phase, _ in received(runs, "shared", 1)}
    assert "dpscd/shared-updates" in phases and "dpscd/steps" not in phases, phases
    acc, rows = balanced_accuracy(label_attack(passive["X"], passive["shared"]["seen"]), active["y"])
    assert rows > 200 and abs(acc - 0.5) < 0.1, acc


def test_without_noise_the_same_attack_recovers_the_labels(runs):
    # The attack is real on this protocol's view too: what protects the labels is the DP noise.
    active, passive, _ = runs
    acc, rows = balanced_accuracy(label_attack(passive["X"], passive["shared-no-noise"]["seen"]), active["y"])
    assert rows > 200 and acc > 0.9, acc


def test_the_active_party_learns_nothing_of_the_passive_columns(runs):
    """Its only message about them, X - U mod 2^32, is a one-time pad: uniform words, uncorrelated with the
    columns (a linear fit of the columns on it explains nothing)."""
    passive = runs[1]
    words = passive["opened"].astype(np.float64).ravel()           # signed 32-bit representatives
    x = passive["Xq"].astype(np.float64).ravel()
    n = words.size
    assert abs(words.mean()) / 2.0 ** (BITS - 1) < 5 / np.sqrt(3 * n)         # uniform on [-2^31, 2^31)
    assert abs(np.corrcoef(words, x)[0, 1]) < 5 / np.sqrt(n)


def test_the_dealer_receives_only_sizes_and_public_facts(runs):
    got = received(runs, "shared", 2)
    # One JSON of the active party's schedule facts and one width per passive party: a few hundred bytes.
    assert 0 < len(got) <= 4 and sum(size for _, size in got) < 1000, got      # (a JSON message: size, then text)


def test_the_federated_run_equals_the_centralised_one(runs):
    fed = Federation.local()
    data = load_party_data(fed, DATA)
    blocks = [np.asarray(r["columns"]) for r in runs[:2]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = fit_glm(fed, data.X_train, data.y_train, DPSCDConfig(**{**EQUAL, "protocol": "encrypted"}),
                      simulation_seed=7, monitor_every=0, noise_blocks=blocks)
    theta = np.zeros_like(ref.theta.numpy())
    for party in runs[:2]:
        theta[party["columns"]] = party["theta"]
    scale = np.abs(ref.theta.numpy()).max()
    # x and zeta / C travel with 10 fractional bits (shared_updates.py): about 1e-3 of the model's scale.
    np.testing.assert_allclose(theta, ref.theta.numpy(), rtol=0, atol=3e-3 * scale)


def test_the_cli_refuses_what_the_shared_protocol_cannot_do():
    # (the CLI's default run, which starts the dealer itself, is test_dpscd_cli's two-party run)
    bad = subprocess.run([sys.executable, "-m", "vfltorch", "dpscd", "--dataset", "breast_cancer", "--parties", "2",
                          "--variant", "seq", "--quiet"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "only DP-SCD" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]
