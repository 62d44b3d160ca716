"""Packing several fixed-point values per plaintext: round trips, add / scale, headroom errors."""

import pytest
import torch

from vfltorch.crypto import (PackedEncryptedTensor, PackingLayout, PackingOverflowError, deserialize,
                             generate_keypair, serialize)


@pytest.fixture(scope="module")
def keys():
    return generate_keypair(512, insecure=True)


def test_plan_follows_the_headroom_rule(keys):
    pub, _ = keys
    lay = PackingLayout.plan(pub, max_abs=1.0, frac_bits=16, max_terms=64, max_scalar=1.0, scalar_frac_bits=16)
    # 2 * T * K * ceil(max_abs 2^f) = 2 * 2^6 * 2^16 * 2^16 -> 40 bits; (512 - 1) // 40 = 12 slots
    assert (lay.slot_bits, lay.slots) == (40, 12)
    assert PackingLayout.plan(pub, max_abs=1.0, frac_bits=16).slot_bits == 18
    with pytest.raises(PackingOverflowError, match="too narrow"):
        PackingLayout.plan(pub, max_abs=1.0, frac_bits=16, max_terms=64, slot_bits=20)
    with pytest.raises(ValueError, match="max_abs"):
        PackingLayout.plan(pub, max_abs=0.0)


def test_round_trip_packs_many_values_per_ciphertext(keys):
    pub, priv = keys
    lay = PackingLayout.plan(pub, max_abs=100.0, frac_bits=20)
    x = torch.linspace(-100, 100, 101, dtype=torch.float64).reshape(1, 101)
    p = PackedEncryptedTensor.encrypt(pub, x, lay)
    assert len(p.ciphertexts) == -(-101 // lay.slots) < 101 // 4
    out = p.decrypt(priv)
    assert out.shape == (1, 101)
    assert torch.allclose(out, x, atol=2.0 ** -21)
    assert torch.equal(p.decrypt(priv), torch.round(x * 2 ** 20) / 2 ** 20)


def test_add_sub_and_common_scalars(keys):
    pub, priv = keys
    lay = PackingLayout.plan(pub, max_abs=4.0, frac_bits=16, max_terms=4, max_scalar=8.0)
    a = torch.rand(30, dtype=torch.float64) * 8 - 4
    b = torch.rand(30, dtype=torch.float64) * 8 - 4
    qa, qb = torch.round(a * 2 ** 16) / 2 ** 16, torch.round(b * 2 ** 16) / 2 ** 16
    pa, pb = PackedEncryptedTensor.encrypt(pub, a, lay), PackedEncryptedTensor.encrypt(pub, b, lay)
    assert torch.equal((pa + pb).decrypt(priv), qa + qb)
    assert torch.equal((pa - pb).decrypt(priv), qa - qb)
    assert torch.equal((-pa).decrypt(priv), -qa)
    assert torch.equal((pa * 3).decrypt(priv), 3 * qa)
    assert torch.equal((pa * -2.5).decrypt(priv), -2.5 * qa)
    assert torch.equal((0.5 * (pa + pb)).decrypt(priv), 0.5 * (qa + qb))
    assert torch.equal((pa * 0).decrypt(priv), torch.zeros(30, dtype=torch.float64))


def test_headroom_errors_instead_of_carrying_into_neighbours(keys):
    pub, priv = keys
    lay = PackingLayout.plan(pub, max_abs=1.0, frac_bits=8, max_terms=2)
    p = PackedEncryptedTensor.encrypt(pub, torch.ones(5), lay)
    # plan: 2 T ceil(max_abs 2^f) = 2 * 2 * 256 needs 11-bit slots, which hold a base up to 1023:
    # three terms (base 768) still fit, the fourth (1024) would carry into the next slot.
    assert (lay.slot_bits, lay.headroom) == (11, 1023)
    s = p
    for terms in range(2, 4):
        s = s + p
        assert torch.equal(s.decrypt(priv), torch.full((5,), float(terms), dtype=torch.float64))
    with pytest.raises(PackingOverflowError, match="guard bits|max_terms"):
        s + p
    with pytest.raises(PackingOverflowError):
        p * 4
    with pytest.raises(PackingOverflowError, match="max_abs"):
        PackedEncryptedTensor.encrypt(pub, torch.tensor([1.5]), lay)


def test_what_packing_cannot_do_is_refused(keys):
    pub, _ = keys
    lay = PackingLayout.plan(pub, max_abs=1.0, frac_bits=8, max_terms=4)
    p = PackedEncryptedTensor.encrypt(pub, torch.ones(5), lay)
    with pytest.raises(ValueError, match="one common scalar"):
        p * torch.arange(5)
    with pytest.raises(TypeError):
        p + torch.ones(5)
    other = PackedEncryptedTensor.encrypt(pub, torch.ones(6), lay)
    with pytest.raises(ValueError, match="same shape"):
        p + other


def test_packed_tensors_serialise(keys):
    pub, priv = keys
    lay = PackingLayout.plan(pub, max_abs=2.0, frac_bits=12, max_terms=3)
    p = PackedEncryptedTensor.encrypt(pub, torch.tensor([[1.0, -2.0, 0.5], [0.0, 1.25, -0.75]]), lay)
    p = p + p
    header, payload = serialize(p)
    q = deserialize(header, payload, pub)
    assert isinstance(q, PackedEncryptedTensor) and q.base == p.base and q.layout == lay
    assert torch.equal(q.decrypt(priv), p.decrypt(priv))
    assert payload.shape == (len(p.ciphertexts), 128)
