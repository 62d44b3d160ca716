"""Obfuscator pools (including the background filler) and the process-parallel worker pool."""

import gmpy2
import pytest
import torch

from vfltorch.crypto import CryptoWorkers, EncryptedTensor, KeyMismatchError, ObfuscatorPool, generate_keypair
from vfltorch.crypto.obfuscators import DJNObfuscators, FullObfuscators
from vfltorch.crypto.keys import public_math


@pytest.fixture(scope="module")
def keys():
    return generate_keypair(512, insecure=True)


@pytest.mark.parametrize("cls", [DJNObfuscators, FullObfuscators])
def test_obfuscators_are_distinct_nth_residues(keys, cls):
    pub, priv = keys
    pm = public_math(pub)
    gen = cls(pm.n, pm.nsquare)
    obs = gen.generate(20)
    assert len(set(map(int, obs))) == 20
    # an obfuscator is an encryption of 0: L(s^lambda) = 0, i.e. phe decrypts it to 0
    assert all(priv.raw_decrypt(int(s)) == 0 for s in obs)
    assert all(gmpy2.gcd(s, pm.n) == 1 for s in obs)


def test_djn_windows_cover_half_the_modulus(keys):
    pm = public_math(keys[0])
    for w in (1, 5, 8, 11):
        gen = DJNObfuscators(pm.n, pm.nsquare, w)
        assert gen.exponent_bits >= (pm.bits + 1) // 2 and gen.exponent_bits % w == 0
        assert keys[1].raw_decrypt(int(gen.generate(1)[0])) == 0
    with pytest.raises(ValueError, match="window"):
        DJNObfuscators(pm.n, pm.nsquare, 0)


def test_pool_accounting(keys):
    pub, _ = keys
    pool = ObfuscatorPool(pub).fill(10)
    assert pool.available == 10 and pool.stats["made_here"] == 10
    got = pool.take(15)                                  # 10 from stock, 5 inline
    assert len(got) == 15 and len(set(map(int, got))) == 15
    assert pool.stats["inline"] == 5 and pool.available == 0
    with pytest.raises(ValueError, match="method"):
        ObfuscatorPool(pub, "fast")


def test_background_pool_fills_ahead_of_need(keys):
    pub, priv = keys
    with ObfuscatorPool(pub, background=True, capacity=256, batch=32) as pool:
        assert pool.wait_for(64, timeout=60) >= 64
        assert pool.stats["made_here"] == 0 and pool.stats["received"] >= 64
        e = EncryptedTensor.encrypt(pub, torch.tensor([1.0, -2.0, 3.5]), pool=pool)
        assert pool.stats["inline"] == 0
        assert e.decrypt(priv).tolist() == [1.0, -2.0, 3.5]
    assert not pool.background


def test_workers_match_the_serial_path(keys):
    pub, priv = keys
    d = torch.randn(40, dtype=torch.float64)
    X = torch.randn(40, 5, dtype=torch.float64)
    V = torch.randn(3, 40, dtype=torch.float64)
    with CryptoWorkers(pub, priv, processes=2) as workers:
        e = workers.encrypt(d, 32)
        assert e.obfuscated and e.decrypt_fixed(priv) == EncryptedTensor.encrypt(pub, d, 32).decrypt_fixed(priv)
        assert workers.decrypt(e).tolist() == e.decrypt(priv).tolist()
        serial = e.matmul(X)
        assert e.matmul(X, workers=workers).decrypt_fixed(priv) == serial.decrypt_fixed(priv)   # split columns
        one = e.matmul(X[:, :1], workers=workers)                                                 # split bases
        assert one.decrypt_fixed(priv) == e.matmul(X[:, :1]).decrypt_fixed(priv)
        assert e.rmatmul(V, workers=workers).decrypt_fixed(priv) == e.rmatmul(V).decrypt_fixed(priv)
        assert e.mul(X[:, 0], workers=workers).decrypt_fixed(priv) == e.mul(X[:, 0]).decrypt_fixed(priv)
        other, _ = generate_keypair(512, insecure=True)
        with pytest.raises(KeyMismatchError):
            EncryptedTensor.encrypt(other, d).matmul(X, workers=workers)
    with CryptoWorkers(pub, processes=1) as public_only:
        with pytest.raises(ValueError, match="private key"):
            e.decrypt(priv, workers=public_only)
