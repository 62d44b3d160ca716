"""Key policy: phe key objects, 2048-bit default, small keys refused without the test flag."""

import pytest
import torch
from phe import paillier

from vfltorch.crypto import (EncryptedTensor, KeyTooSmallError, MIN_KEY_BITS, ObfuscatorPool, allow_insecure,
                             check_key, generate_keypair, key_fingerprint)


def test_small_keys_are_refused_without_the_flag():
    with pytest.raises(KeyTooSmallError, match="insecure=True"):
        generate_keypair(512)
    with pytest.raises(ValueError):          # KeyTooSmallError is a ValueError, as callers expect
        generate_keypair(768)


def test_small_keys_with_the_flag_are_phe_keys_and_usable():
    pub, priv = generate_keypair(512, insecure=True)
    assert isinstance(pub, paillier.PaillierPublicKey) and isinstance(priv, paillier.PaillierPrivateKey)
    assert pub.n.bit_length() == 512
    enc = EncryptedTensor.encrypt(pub, torch.tensor([1.5, -2.0]))
    assert torch.equal(enc.decrypt(priv), torch.tensor([1.5, -2.0], dtype=torch.float64))


def test_keys_from_elsewhere_are_checked_where_they_enter():
    pub, _ = paillier.generate_paillier_keypair(n_length=512)     # made by phe, not marked
    with pytest.raises(KeyTooSmallError):
        EncryptedTensor.encrypt(pub, torch.ones(2))
    with pytest.raises(KeyTooSmallError):
        ObfuscatorPool(pub)
    with pytest.raises(KeyTooSmallError):
        check_key(pub)
    check_key(pub, insecure=True)
    allow_insecure(pub)
    assert EncryptedTensor.encrypt(pub, torch.ones(2)).numel() == 2


def test_secure_sizes_need_no_flag():
    pub, priv = generate_keypair(MIN_KEY_BITS)
    assert pub.n.bit_length() == 1024
    assert EncryptedTensor.encrypt(pub, torch.tensor([3.25])).decrypt(priv).item() == 3.25


@pytest.mark.parametrize("bad", [1025, 64, "2048", 2048.0, True])
def test_bad_sizes_say_what_to_fix(bad):
    with pytest.raises((ValueError, TypeError)):
        generate_keypair(bad, insecure=True)


def test_wrong_key_type_is_named():
    with pytest.raises(TypeError, match="PaillierPublicKey"):
        EncryptedTensor.encrypt("not a key", torch.ones(1))


def test_fingerprint_identifies_the_modulus():
    pub, _ = generate_keypair(256, insecure=True)
    other, _ = generate_keypair(256, insecure=True)
    same = allow_insecure(paillier.PaillierPublicKey(pub.n))
    assert key_fingerprint(pub) == key_fingerprint(same) != key_fingerprint(other)
    assert len(key_fingerprint(pub)) == 16
