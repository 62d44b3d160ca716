"""The packed-features layout of the paper's SGD (``vfltorch.linear.packed``): columns encrypted once, packed.

* crypto: a packed row is an ordinary Paillier ciphertext (phe decrypts it to the packed integer), and a
  linear combination with signed exponents plus the public offset decrypts to X^T e slot by slot;
* one launch (guest + host + coordinator, 512-bit test keys, breast cancer): the packed layout trains the
  same model as the per-row protocol (its plaintext mode, which test_hetero_lr.py checks equal to its
  encrypted runs to 1e-10) with SGD and with SQN (coefficients and epoch losses to 1e-7, the
  same curvature pairs), the host receives no clear number from the guest, the coordinator ciphertexts
  only in the gradient and loss phases, and bad settings are refused.
"""

import pytest
import torch

from vfltorch.comm import launch
from vfltorch.crypto import ObfuscatorPool, arith, generate_keypair
from vfltorch.crypto.keys import private_math, public_math
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.linear import HeteroLogisticRegression
from vfltorch.linear.packed import PackedColumns
from vfltorch.linear.packed_check import check_packed

CONFIG = DataConfig(dataset="breast_cancer", scale="standard", test_fraction=0.2, seed=0)
COMMON = dict(protocol="paper", crypto_processes=1, batch_size=64, max_epochs=2, tol=0.0,
              l2=0.01, lr=0.2, key_bits=512, insecure_key=True, random_state=5)
RUNS = {"sgd": dict(optimizer="sgd"), "sqn": dict(optimizer="sqn", decay=0.5, L=2, M=3)}


def test_packed_rows_are_paillier_ciphertexts_and_combine_slotwise():
    pub, priv = generate_keypair(512, insecure=True)
    pm, sk = public_math(pub), private_math(priv)
    lay = PackedColumns.plan(pm.bits, columns=7, slot_bits=100)
    assert (lay.slots, lay.chunks) == (5, 2)
    g = torch.Generator().manual_seed(0)
    X = torch.randint(-2 ** 20, 2 ** 20, (40, 7), generator=g)
    e = torch.randint(-2 ** 12, 2 ** 12, (40,), generator=g)
    pool = ObfuscatorPool(pub)
    for c in range(lay.chunks):
        rows = [lay.pack(r, c) for r in X.tolist()]
        cs = arith.encrypt_raw(rows, pool.take(len(rows)), pm.n, pm.nsquare)
        # phe decrypts a packed row to the packed integer (mod n): an ordinary ciphertext.
        for c_i, m in zip(cs[:5], rows[:5]):
            assert priv.raw_decrypt(int(c_i)) == m % int(pm.n)
        comb = arith.multiexp_columns(cs, [e.tolist()], pm.nsquare)[0]
        base = 1 << 50                            # the public offset that makes every slot non-negative
        cols = list(lay.chunk_columns(c))
        plain = arith.add_plain_raw([comb], [lay.pack([base] * 7, c)], pm.n, pm.nsquare)[0]
        slots = lay.unpack(arith.decrypt_with([plain], sk)[0], c)
        expect = (X[:, cols].T.to(torch.int64) @ e.to(torch.int64)).tolist()
        assert [s - base for s in slots] == expect


def test_packed_settings_refused_where_they_cannot_run():
    assert check_packed("paper", True, 2) is None
    assert "paper protocol" in check_packed("shared", True, 2)
    assert "plaintext" in check_packed("paper", False, 2)
    assert "2 data parties" in check_packed("paper", True, 3)
    with pytest.raises(VFLInputError, match="paper protocol"):
        HeteroLogisticRegression(None, protocol="shared", packed_features=True)._check_params()


def _job(fed):
    data = load_party_data(fed, CONFIG) if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None else data.y_train
    out = {"rank": fed.rank}
    for name, kw in RUNS.items():
        for packed in (False, True):
            start = len(fed.transcript)
            # the reference: the per-row protocol in plaintext mode (test_hetero_lr: == encrypted to 1e-10)
            est = HeteroLogisticRegression(fed, packed_features=packed, encryption=packed, **COMMON, **kw)
            est.fit(X, y)
            out[name, packed] = {
                "coef": None if est.coef_ is None else torch.as_tensor(est.coef_), "intercept": est.intercept_, "pairs": est.n_curvature_pairs_,
                "losses": [h["loss"] for h in getattr(est, "history_", [])],
                "transcript": [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript.messages[start:]]}
    return out


@pytest.fixture(scope="module")
def results():
    return launch(_job, 2, coordinator=True, record_transcript=True, timeout=180)


@pytest.mark.parametrize("name", list(RUNS))
def test_packed_trains_the_same_model_as_the_per_row_protocol(results, name):
    for res in results[:2]:
        a, b = res[name, False], res[name, True]
        assert torch.allclose(a["coef"], b["coef"], atol=1e-7, rtol=0)
        if a["intercept"] is not None:
            assert abs(a["intercept"] - b["intercept"]) < 1e-7
    la, lb = results[0][name, False]["losses"], results[0][name, True]["losses"]
    assert len(la) == len(lb) == 2
    assert max(abs(p - q) for p, q in zip(la, lb)) < 1e-7
    if name == "sqn":       # the quasi-Newton steps ran on the same curvature pairs
        assert results[0][name, True]["pairs"] == results[0][name, False]["pairs"] >= 1


def _received(results, rank, name):
    return [(phase, src, t) for res in results for (phase, src, dst, t) in res[name, True]["transcript"]
            if dst == rank]


@pytest.mark.parametrize("name", list(RUNS))
def test_packed_messages_are_ciphertexts_or_masked(results, name):
    host, coordinator = 1, 2
    width = 128                                   # bytes of a 512-bit key's ciphertext
    from_guest = [t for phase, src, t in _received(results, host, name) if src == 0 and phase.startswith("hetero-lr/")
                  and phase not in ("hetero-lr/setup", "hetero-lr/report")]
    payloads = [t for t in from_guest if t.dtype == torch.uint8 and t.dim() == 2]
    assert payloads and all(t.shape[1] == width for t in payloads)
    assert not any(t.is_floating_point() for _, src, t in _received(results, host, name) if src == 0)
    # the coordinator receives ciphertexts only (packed masked slots, the batch loss)
    to_c = [(phase, t) for phase, src, t in _received(results, coordinator, name)
            if phase in ("hetero-lr/gradient", "hetero-lr/loss")]
    assert to_c and not any(t.is_floating_point() for _, t in to_c)


def test_cli_refuses_packed_features_where_it_cannot_run(capfd):
    """The launcher's check answers before any party starts (the other refusals: check_packed, above)."""
    from vfltorch.cli import main

    argv = ["hetero-lr", "--dataset", "breast_cancer", "--quiet", "--packed-features"]     # shared by default
    assert main(argv) == 2
    assert "applies to the paper protocol" in capfd.readouterr().err
