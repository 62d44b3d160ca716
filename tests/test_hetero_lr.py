"""Encrypted vertical LR across real processes: encrypted == plaintext == centralised, autograd, privacy, bad input.

One launch (a guest, two hosts - so the host chain with its cross terms is
exercised - and a coordinator, with 512-bit test keys) runs every scenario;
the checks run here, on what the processes return (their results and their
transcripts of sent messages).
"""

import json

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.linear import HeteroLogisticRegression, PublicBounds, gradient, hessian_vector, taylor_loss
from vfltorch.linear.bounds import quantize
from vfltorch.linear.taylor import LOG2, logistic_loss, penalty

PARTIES = 3                      # guest + 2 hosts (+ the coordinator)
CONFIG = DataConfig(dataset="breast_cancer", scale="standard", test_fraction=0.2, seed=0)
COMMON = dict(protocol="paper", crypto_processes=1, batch_size=64, max_epochs=3, tol=0.0, l2=0.01, key_bits=512,
              insecure_key=True, random_state=5, mask_seed=11)
RUNS = {"sgd": dict(COMMON, optimizer="sgd", lr=0.2),
        "sqn": dict(COMMON, optimizer="sqn", lr=0.2, decay=0.5, L=2, M=3)}
GRAD_ROWS = np.arange(3, 300, 2)


def coef_for(rank, n_columns):
    return torch.randn(n_columns, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64) * 0.3


def party_job(fed):
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None else data.y_train
    X_test = None if data is None else data.X_test
    out = {"rank": fed.rank}

    # Bad input first: every process stops with the same clear message, and the federation stays usable.
    errors = {}
    for name, kw, labels in [("labels", {}, None if y is None else torch.ones_like(y)),
                             ("batch", {"batch_size": 10_000}, y)]:
        try:
            HeteroLogisticRegression(fed, **dict(RUNS["sgd"], **kw)).fit(X, labels)
        except VFLInputError as exc:
            errors[name] = str(exc)
    out["errors"] = errors

    for name, kw in RUNS.items():
        for encryption in (True, False):
            start = len(fed.transcript)
            est = HeteroLogisticRegression(fed, encryption=encryption, **kw)
            est.fit(X, y, monitor=None if data is None else (X_test, data.y_test))
            fit_messages = fed.transcript.messages[start:]
            scores = est.decision_function(X_test)
            out[(name, encryption)] = {
                "coef": None if est.coef_ is None else torch.as_tensor(est.coef_), "intercept": est.intercept_, "scores": scores, "epochs": est.n_epochs_,
                "history": getattr(est, "history_", None), "encryption": est.encryption_,
                "transcript": [(m.phase, m.src, m.dst, m.tensor) for m in fit_messages]}

    # One gradient round at a given model: each data party's block.
    coef = None if data is None else coef_for(fed.rank, X.shape[1] + int(fed.is_active))
    est = HeteroLogisticRegression(fed, **RUNS["sgd"])
    out["gradient"] = est.loss_and_gradient(X, y, coef=coef, rows=GRAD_ROWS)
    return out


@pytest.fixture(scope="module")
def results():
    return launch(party_job, PARTIES, coordinator=True, record_transcript=True, timeout=120)


@pytest.fixture(scope="module")
def full():
    """Every column at one party (the parent process), in the parties' order, as the protocol quantises them."""
    data = load_party_data(Federation.local(), CONFIG)
    return data


def centralised(name, full):
    est = HeteroLogisticRegression(None, **RUNS[name]).fit(full.X_train, full.y_train,
                                                           monitor=(full.X_test, full.y_test))
    return est


# --------------------------------------------------------------------------------- pure maths
def test_gradient_and_hessian_vector_equal_autograd():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(50, 6, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(50, generator=g) < 0.4, 1.0, -1.0).to(torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    s = torch.randn(6, generator=g, dtype=torch.float64)
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.float64)
    loss = taylor_loss(X @ w, y) + penalty(w, 0.3, mask)
    (auto,) = torch.autograd.grad(loss, w, create_graph=True)
    torch.testing.assert_close(gradient(X, y, w.detach(), 0.3, mask), auto.detach(), rtol=1e-12, atol=1e-12)
    (hvp,) = torch.autograd.grad(auto @ s, w)
    torch.testing.assert_close(hessian_vector(X, s, 0.3, mask), hvp, rtol=1e-12, atol=1e-12)


def test_taylor_loss_is_the_second_order_expansion():
    u = torch.linspace(-0.05, 0.05, 11, dtype=torch.float64)
    for label in (1.0, -1.0):
        y = torch.full_like(u, label)
        assert abs(float(taylor_loss(u, y) - logistic_loss(u, y))) < 1e-6     # error O(u^4)
    assert abs(float(taylor_loss(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))) - LOG2) < 1e-15


def test_public_bounds_leave_room_in_the_test_key():
    b = PublicBounds(parties=3, batch=64, hessian_batch=64, l2=0.01, feature_frac_bits=16, mask_bits=64)
    assert b.total_bits() < 500
    assert b.masked_gradient_bits() == b.gradient_bits() + 64 + 1


# ------------------------------------------------------------------------ federated runs
@pytest.mark.parametrize("name", sorted(RUNS))
def test_encrypted_equals_plaintext_equals_centralised(results, full, name):
    ref = centralised(name, full)
    blocks = {}
    for encryption in (True, False):
        parts = [results[r][(name, encryption)] for r in range(PARTIES)]
        guest = parts[0]
        assert guest["epochs"] == ref.n_epochs_ == 3
        assert guest["encryption"] == ("paillier (512-bit keys, djn obfuscators)" if encryption
                                       else "none (INSECURE plaintext mode)")
        coef = torch.cat([p["coef"] for p in parts])
        blocks[encryption] = coef
        torch.testing.assert_close(coef, torch.as_tensor(ref.coef_), rtol=0, atol=1e-9)
        assert guest["intercept"] == pytest.approx(ref.intercept_, abs=1e-9)
        losses = [h["loss"] for h in guest["history"]]
        blocks[encryption, "loss"] = losses
        # The federated loss multiplies [[U]] by 2 u_B - 4 y encoded with F_M = 16 fractional bits.
        np.testing.assert_allclose(losses, [h["loss"] for h in ref.history_], rtol=0, atol=1e-6)
        np.testing.assert_allclose([h["test_auc"] for h in guest["history"]],
                                   [h["test_auc"] for h in ref.history_], atol=1e-9)
        torch.testing.assert_close(guest["scores"], ref.decision_function(full.X_test), rtol=0, atol=1e-8)
        assert all(p["scores"] is None for p in parts[1:])
        assert results[PARTIES][(name, encryption)]["coef"] is None     # the coordinator holds no model
    # Encrypted and plaintext runs agree far below the fixed-point scale of the features (2^-16).
    torch.testing.assert_close(blocks[True], blocks[False], rtol=0, atol=1e-10)
    np.testing.assert_allclose(blocks[True, "loss"], blocks[False, "loss"], rtol=0, atol=1e-10)
    assert losses[-1] < LOG2


def test_federated_gradient_equals_autograd(results, full):
    X_parts = [load_party_data_cols(full, r) for r in range(PARTIES)]
    X = torch.cat([quantize(Xp, 16) for Xp in X_parts] + [torch.ones(full.n_train, 1, dtype=torch.float64)], dim=1)
    # The guest's block carries the intercept last: reorder the columns to (guest, intercept, hosts).
    d0 = X_parts[0].shape[1]
    order = list(range(d0)) + [X.shape[1] - 1] + list(range(d0, X.shape[1] - 1))
    X = X[:, order]
    w = torch.cat([coef_for(0, d0 + 1)] + [coef_for(r, X_parts[r].shape[1]) for r in range(1, PARTIES)])
    w.requires_grad_(True)
    mask = torch.ones(X.shape[1], dtype=torch.float64)
    mask[d0] = 0.0                                            # the intercept is not penalised
    rows = torch.as_tensor(GRAD_ROWS)
    loss = taylor_loss(X[rows] @ w, full.y_train[rows]) + penalty(w, RUNS["sgd"]["l2"], mask)
    (auto,) = torch.autograd.grad(loss, w)
    got = torch.cat([results[r]["gradient"] for r in range(PARTIES)])
    torch.testing.assert_close(got, auto, rtol=0, atol=1e-10)
    data_loss = float(taylor_loss(X[rows] @ w.detach(), full.y_train[rows]))
    assert results[PARTIES]["gradient"] == pytest.approx(data_loss, abs=1e-6)   # decrypted by the coordinator


def load_party_data_cols(full, rank):
    cols = np.array_split(np.arange(full.X_train.shape[1]), PARTIES)[rank]
    return full.X_train[:, cols]


def test_bad_input_stops_every_process_with_the_same_message(results):
    for r in range(PARTIES + 1):
        assert "party 0 (active): HeteroLogisticRegression needs two classes in y, got only one class [1.0]" \
            in results[r]["errors"]["labels"]
        assert "batch_size=10000 is larger than the training set (455 rows)" in results[r]["errors"]["batch"]


# ---------------------------------------------------------------------------------- privacy
def _values(tensor):
    """How many numbers a message carries in the clear (None for ciphertexts and their headers)."""
    if tensor.dtype == torch.uint8:
        if tensor.dim() == 2:
            return None                                           # a Paillier payload: one row per ciphertext
        try:
            obj = json.loads(bytes(tensor.numpy()).decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None                                           # raw bytes: the public key n
        if isinstance(obj, dict) and obj.get("format", "").startswith("vfltorch.paillier"):
            return None
        if isinstance(obj, dict):
            return sum(len(v) if isinstance(v, list) else 1 for v in obj.values())
        return len(obj) if isinstance(obj, list) else 1
    if tensor.dtype == torch.int64 and tuple(tensor.shape) == (10,):
        return None                                               # send_tensor's framing (dtype and shape)
    return tensor.numel()


def _received(results, rank, run):
    """(phase, src, tensor) of every message of ``run`` sent to ``rank`` (from the senders' transcripts)."""
    return [(phase, src, t) for res in results for (phase, src, dst, t) in res[run]["transcript"] if dst == rank]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_coordinator_never_receives_a_margin_feature_or_label(results, full, name):
    coordinator = PARTIES
    widest = max(load_party_data_cols(full, r).shape[1] for r in range(PARTIES)) + 1
    received = _received(results, coordinator, (name, True))
    assert received, "the coordinator received nothing"
    payloads = 0
    for phase, src, t in received:
        if phase.startswith("hetero-lr/") and t.dtype == torch.uint8 and t.dim() == 2:
            payloads += 1
            assert t.shape[0] <= widest, f"{phase}: {t.shape[0]} ciphertexts from party {src}: per-row values"
        count = _values(t)
        assert count is None or count <= widest, f"{phase}: party {src} sent the coordinator {count} values"
        if t.dtype == torch.float64:                               # SQN's s_l blocks: never a row of X_l
            X_l = torch.cat([load_party_data_cols(full, src), torch.ones(full.n_train, 1, dtype=torch.float64)],
                            1)[:, :t.numel()]
            assert float((X_l - t).abs().max(dim=1).values.min()) > 1e-6
    assert payloads > 0
    sent = [t for res in results for (ph, src, dst, t) in res[(name, True)]["transcript"] if src == coordinator]
    assert all((_values(t) or 0) <= widest for t in sent)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_hosts_receive_labels_and_residuals_only_encrypted(results, full, name):
    for host in range(1, PARTIES):
        widest = load_party_data_cols(full, host).shape[1]
        received = _received(results, host, (name, True))
        ciphertexts = [t for ph, src, t in received if t.dtype == torch.uint8 and t.dim() == 2]
        assert ciphertexts and all(t.shape[1] == 128 for t in ciphertexts)    # 512-bit key: |n^2| = 128 bytes
        headers = [json.loads(bytes(t.numpy()).decode()) for ph, src, t in received
                   if t.dtype == torch.uint8 and t.dim() == 1 and bytes(t[:2].numpy()) == b'{"'
                   and b"paillier" in bytes(t.numpy())]
        assert headers and all(h["obfuscated"] for h in headers)          # re-randomised before leaving
        for phase, src, t in received:
            if phase.startswith("hetero-lr/") and not phase.startswith(("hetero-lr/monitor", "hetero-lr/predict")):
                count = _values(t)
                assert count is None or count <= widest + 1, f"{phase}: host {host} got {count} values in the clear"
    # Each host gets its own re-randomisation of the same [[d]]: the payloads differ.
    to = {h: [t for ph, src, t in _received(results, h, (name, True))
              if ph == "hetero-lr/gradient" and src == 0 and t.dim() == 2] for h in (1, 2)}
    assert to[1] and all(not torch.equal(a, b) for a, b in zip(to[1], to[2]))
    # The same check run on the INSECURE plaintext transcript does find the residuals (it can fail).
    plain = _received(results, 1, (name, False))
    residuals = [t for ph, src, t in plain if ph == "hetero-lr/gradient" and t.dtype == torch.float64
                 and t.numel() == RUNS[name]["batch_size"]]
    assert residuals


def test_sums_for_scores_are_masked(results):
    # Prediction and monitoring go through ring-masked secure sums: hosts only ever see uniform int64 words.
    for host in range(1, PARTIES):
        for phase, src, t in _received(results, host, ("sgd", True)):
            if phase.startswith("hetero-lr/monitor") and t.numel() > 20:
                assert t.dtype == torch.int64
