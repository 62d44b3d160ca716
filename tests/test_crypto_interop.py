"""Interoperability with python-paillier, both ways, with its own key objects and decryption."""

import random

import phe
import pytest
import torch
from phe import paillier

from vfltorch.crypto import EncryptedTensor, ObfuscatorPool, generate_keypair, to_fixed


@pytest.fixture(scope="module")
def keys():
    return generate_keypair(512, insecure=True)


@pytest.mark.parametrize("method", ["djn", "full"])
@pytest.mark.parametrize("f", [0, 16, 40, 13])
def test_fast_path_ciphertexts_decrypt_with_phe(keys, method, f):
    pub, priv = keys
    x = torch.tensor([0.0, 1.0, -1.0, 0.1, -2.5e3, 123.456, -1e-3], dtype=torch.float64)
    e = EncryptedTensor.encrypt(pub, x, f, pool=ObfuscatorPool(pub, method))
    expect = [m / 2 ** f for m in to_fixed(x, f)[0]]
    # the documented raw route: phe.EncryptedNumber(pub, ciphertext, exponent) + priv.decrypt
    if f % 4 == 0:
        raw = [phe.EncryptedNumber(pub, int(c), -f // 4) for c in e.ciphertexts]
        assert [priv.decrypt(r) for r in raw] == pytest.approx(expect, rel=0, abs=0)
    # to_phe handles any f (lifting to a multiple of 4 when needed)
    assert [priv.decrypt(r) for r in e.to_phe()] == pytest.approx(expect, rel=0, abs=0)


def test_results_of_operations_decrypt_with_phe(keys):
    pub, priv = keys
    d = torch.tensor([0.5, -0.25, 1.0])
    X = torch.tensor([[1.0, -2.0], [0.5, 4.0], [-1.0, 0.25]])
    g = EncryptedTensor.encrypt(pub, d) @ X
    assert [priv.decrypt(n) for n in g.to_phe()] == pytest.approx((d @ X).tolist(), abs=1e-12)
    assert [priv.decrypt(n) for n in (EncryptedTensor.encrypt(pub, d) * -3).to_phe()] == [-1.5, 0.75, -3.0]


def test_raw_ciphertexts_match_phe_raw_decrypt(keys):
    pub, priv = keys
    e = EncryptedTensor.encrypt(pub, torch.tensor([5, -5, 0]), 0)
    assert [priv.raw_decrypt(int(c)) for c in e.ciphertexts] == [5, pub.n - 5, 0]


def test_phe_ciphertexts_decrypt_with_the_fast_path(keys):
    pub, priv = keys
    vals = [0, 1, -1, 7, -123456789, 0.5, -0.3, 3.14159, 1e-8, -2.5e10, 2.0 ** 60]
    nums = [pub.encrypt(v) for v in vals]               # phe's own encoding: mixed exponents
    assert len({n.exponent for n in nums}) > 2
    e = EncryptedTensor.from_phe(nums)
    assert e.decrypt(priv).tolist() == pytest.approx(vals, rel=1e-15, abs=1e-20)
    # phe with an explicit precision and a positive exponent
    coarse = [pub.encrypt(v, precision=16.0 ** 2) for v in (256 * 3, -256 * 7)]
    assert all(n.exponent == 2 for n in coarse)
    assert EncryptedTensor.from_phe(coarse).decrypt(priv).tolist() == [768.0, -1792.0]


def test_arithmetic_across_the_two_libraries(keys):
    pub, priv = keys
    a = [random.uniform(-5, 5) for _ in range(4)]
    b = torch.tensor([random.uniform(-5, 5) for _ in range(4)], dtype=torch.float64)
    from_phe = EncryptedTensor.from_phe([pub.encrypt(v) for v in a], max_abs=5.0)
    total = from_phe + EncryptedTensor.encrypt(pub, b)      # ours + phe's, in our type
    assert total.decrypt(priv).tolist() == pytest.approx((torch.tensor(a, dtype=torch.float64) + b).tolist(),
                                                         abs=1e-10)
    mixed = [x + y for x, y in zip(EncryptedTensor.encrypt(pub, b).to_phe(), [pub.encrypt(v) for v in a])]
    assert [priv.decrypt(m) for m in mixed] == pytest.approx((torch.tensor(a, dtype=torch.float64) + b).tolist(),
                                                             abs=1e-10)


def test_phe_numbers_without_a_bound_can_be_decrypted_but_not_grown(keys):
    pub, priv = keys
    e = EncryptedTensor.from_phe([pub.encrypt(1.5)])
    assert e.decrypt(priv).item() == 1.5
    with pytest.raises(OverflowError, match="max_abs"):
        e + e


def test_from_phe_refuses_mixed_keys_and_foreign_objects(keys):
    pub, _ = keys
    other, _ = paillier.generate_paillier_keypair(n_length=512)
    with pytest.raises(ValueError, match="different public keys"):
        EncryptedTensor.from_phe([pub.encrypt(1), other.encrypt(1)])
    with pytest.raises(TypeError):
        EncryptedTensor.from_phe([1, 2])
