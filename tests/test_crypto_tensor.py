"""EncryptedTensor: round trips and homomorphic identities against plaintext arithmetic.

Most identities are checked *exactly* on the fixed-point integers
(``decrypt_fixed``): Paillier arithmetic mod n is exact, so any difference
would be a bug, not rounding.
"""

import numpy as np
import pytest
import torch

from vfltorch.crypto import (EncodingOverflowError, EncryptedTensor, KeyMismatchError, ObfuscatorPool,
                             generate_keypair, to_fixed)
from vfltorch.crypto.encoding import encode_multiplier


@pytest.fixture(scope="module")
def keys():
    return generate_keypair(512, insecure=True)


@pytest.fixture(scope="module")
def pool(keys):
    return ObfuscatorPool(keys[0]).fill(64)


def fixed(x, f):
    return to_fixed(torch.as_tensor(x), f)[0]


def enc(keys, x, f=40, **kw):
    return EncryptedTensor.encrypt(keys[0], torch.as_tensor(x, dtype=torch.float64), f, **kw)


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("f", [0, 4, 16, 40, 53, 100])
def test_round_trip_positive_negative_zero_extreme(keys, f):
    pub, priv = keys
    # the largest magnitude whose encoding fits this 512-bit key at this precision (n/3 ~ 2^509)
    big = float(2 ** (500 - f))
    x = torch.tensor([0.0, 1.0, -1.0, 0.3, -0.3, 1e-9, -1e-9, 12345.678, -12345.678, big, -big],
                     dtype=torch.float64)
    e = EncryptedTensor.encrypt(pub, x, f)
    assert e.decrypt_fixed(priv) == fixed(x, f)
    back = e.decrypt(priv)
    assert bool(((back - x).abs() <= 2.0 ** -(f + 1)).all())


def test_shapes_dtypes_and_empty(keys):
    pub, priv = keys
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 8
    e = EncryptedTensor.encrypt(pub, x, 8)
    assert e.shape == (2, 3, 4) and e.numel() == 24 and len(e) == 2
    out = e.decrypt(priv, dtype=torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out, x)
    scalar = EncryptedTensor.encrypt(pub, 2.5, 4)
    assert scalar.shape == () and scalar.decrypt(priv).item() == 2.5
    empty = EncryptedTensor.encrypt(pub, torch.empty(0, 3))
    assert empty.decrypt(priv).shape == (0, 3)
    assert EncryptedTensor.encrypt(pub, np.array([1, -2]), 0).decrypt_fixed(priv) == [1, -2]


def test_encryption_is_randomised(keys, pool):
    pub, priv = keys
    a = EncryptedTensor.encrypt(pub, torch.zeros(3), pool=pool)
    b = EncryptedTensor.encrypt(pub, torch.zeros(3), pool=pool)
    assert len(set(map(int, a.ciphertexts + b.ciphertexts))) == 6
    assert a.obfuscated and torch.equal(a.decrypt(priv), b.decrypt(priv))


@pytest.mark.parametrize("method", ["djn", "full"])
def test_both_obfuscator_methods_encrypt_correctly(keys, method):
    pub, priv = keys
    p = ObfuscatorPool(pub, method).fill(5)
    x = torch.tensor([0.0, -1.5, 2.25, 1e6, -3.0])
    assert torch.equal(EncryptedTensor.encrypt(pub, x, pool=p).decrypt(priv), x.double())
    assert p.stats["inline"] == 0 and p.available == 0


# ------------------------------------------------------------------ identities
def test_addition_identities(keys):
    pub, priv = keys
    a, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    ea, eb = enc(keys, a), enc(keys, b)
    ma, mb = fixed(a, 40), fixed(b, 40)
    assert (ea + eb).decrypt_fixed(priv) == [x + y for x, y in zip(ma, mb)]
    assert (ea - eb).decrypt_fixed(priv) == [x - y for x, y in zip(ma, mb)]
    assert (-ea).decrypt_fixed(priv) == [-x for x in ma]
    assert (ea + b).decrypt_fixed(priv) == [x + y for x, y in zip(ma, mb)]      # plaintext operand
    assert (b + ea).decrypt_fixed(priv) == [x + y for x, y in zip(ma, mb)]      # torch defers to us
    assert (ea - 1.0).decrypt_fixed(priv) == [x - (1 << 40) for x in ma]
    assert (1.0 - ea).decrypt_fixed(priv) == [(1 << 40) - x for x in ma]
    assert (ea + 0).decrypt_fixed(priv) == ma


def test_addition_aligns_scales(keys):
    pub, priv = keys
    a, b = enc(keys, [1.5, -2.0], 8), enc(keys, [0.25, 0.125], 20)
    s = a + b
    assert s.frac_bits == 20
    assert torch.equal(s.decrypt(priv), torch.tensor([1.75, -1.875], dtype=torch.float64))


def test_broadcasting_follows_torch(keys):
    pub, priv = keys
    a = torch.randn(3, 1, dtype=torch.float64)
    b = torch.randn(1, 4, dtype=torch.float64)
    ea, eb = enc(keys, a, 16), enc(keys, b, 16)
    expect = torch.tensor(fixed(a, 16)).reshape(3, 1) + torch.tensor(fixed(b, 16)).reshape(1, 4)
    assert (ea + eb).shape == (3, 4)
    assert (ea + eb).decrypt_fixed(priv) == expect.flatten().tolist()
    assert (ea + b).decrypt_fixed(priv) == expect.flatten().tolist()
    k = torch.tensor([2, -3, 0, 5])
    assert (ea * k).decrypt_fixed(priv) == (torch.tensor(fixed(a, 16)).reshape(3, 1) * k).flatten().tolist()


@pytest.mark.parametrize("k", [3, -3, 1, -1, 0, 2 ** 40 + 1, -(2 ** 40 + 1)])
def test_multiplication_by_an_integer_scalar(keys, k):
    pub, priv = keys
    a = torch.randn(5, dtype=torch.float64)
    ea = enc(keys, a)
    out = ea * k
    assert out.frac_bits == 40
    assert out.decrypt_fixed(priv) == [m * k for m in fixed(a, 40)]
    assert (k * ea).decrypt_fixed(priv) == [m * k for m in fixed(a, 40)]


def test_multiplication_by_a_fixed_point_vector(keys):
    pub, priv = keys
    a = torch.randn(8, dtype=torch.float64)
    w = torch.tensor([0.5, -0.25, 1.75, -3.0, 0.0, 1e-3, -7.5, 2.0 ** -16], dtype=torch.float64)
    ea = enc(keys, a)
    out = ea * w                                        # 16 fractional bits, stripped to the shortest
    ks, fk, _ = encode_multiplier(w, 16)
    assert out.frac_bits == 40 + fk
    assert out.decrypt_fixed(priv) == [m * k for m, k in zip(fixed(a, 40), ks)]
    assert (w * ea).decrypt_fixed(priv) == out.decrypt_fixed(priv)
    # the value is the product up to the multiplier's rounding (<= 2^-17 |a|)
    assert torch.allclose(out.decrypt(priv), a * w, atol=2.0 ** -17 * a.abs().max().item() + 1e-12)
    fine = ea.mul(w, frac_bits=40)
    assert torch.allclose(fine.decrypt(priv), a * w, rtol=0, atol=1e-10)


def test_products_of_two_ciphertexts_are_refused(keys):
    ea = enc(keys, [1.0])
    with pytest.raises(TypeError, match="two ciphertexts"):
        ea * ea
    with pytest.raises(TypeError):
        ea @ ea


def test_division_by_plaintext(keys):
    pub, priv = keys
    a = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    out = (enc(keys, a) / torch.tensor([3.0, -7.0, 1000.0])).decrypt(priv)
    assert torch.allclose(out, a / torch.tensor([3.0, -7.0, 1000.0], dtype=torch.float64), rtol=1e-9, atol=1e-12)
    with pytest.raises(ZeroDivisionError):
        enc(keys, a) / 0.0


@pytest.mark.parametrize("n,f_out", [(7, 3), (1, 1), (12, 1)])
def test_encrypted_vector_times_matrix(keys, n, f_out):
    pub, priv = keys
    d = torch.randn(n, dtype=torch.float64)
    X = torch.randn(n, f_out, dtype=torch.float64)
    X[0, 0] = 0.0                                       # zero exponents are skipped
    ed = enc(keys, d)
    g = ed @ X                                          # [[d]]^T X
    ks, fk, _ = encode_multiplier(X, 16)
    K = torch.tensor(ks).reshape(n, f_out)
    md = torch.tensor(fixed(d, 40))
    assert g.shape == (f_out,) and g.frac_bits == 40 + fk
    assert g.decrypt_fixed(priv) == [sum(int(md[i]) * int(K[i, j]) for i in range(n)) for j in range(f_out)]
    assert torch.allclose(g.decrypt(priv), d @ X, atol=n * 2.0 ** -17 * d.abs().max().item() + 1e-9)


def test_plaintext_matrix_times_encrypted_vector(keys):
    pub, priv = keys
    v = torch.randn(6, dtype=torch.float64)
    X = torch.randint(-20, 20, (4, 6))
    ev = enc(keys, v)
    out = X @ ev                                        # integer matrix: exact
    assert out.shape == (4,)
    assert out.decrypt_fixed(priv) == (X @ torch.tensor(fixed(v, 40))).tolist()
    assert ev.rmatmul(X[0]).shape == ()


def test_matmul_with_2d_encrypted_operands(keys):
    pub, priv = keys
    A = torch.randn(3, 5, dtype=torch.float64)
    W = torch.randint(-9, 9, (5, 2))
    eA = enc(keys, A, 20)
    MA = torch.tensor(fixed(A, 20)).reshape(3, 5)
    assert (eA @ W).decrypt_fixed(priv) == (MA @ W).flatten().tolist()
    assert (eA @ W[:, 0]).decrypt_fixed(priv) == (MA @ W[:, 0]).tolist()
    X = torch.randint(-9, 9, (4, 3))
    assert (X @ eA).shape == (4, 5)
    assert (X @ eA).decrypt_fixed(priv) == (X @ MA).flatten().tolist()
    with pytest.raises(ValueError, match="shapes"):
        eA @ torch.ones(4, 2)


def test_sums_and_means_over_axes(keys):
    pub, priv = keys
    A = torch.randn(3, 4, dtype=torch.float64)
    eA = enc(keys, A)
    MA = torch.tensor(fixed(A, 40)).reshape(3, 4)
    assert eA.sum().decrypt_fixed(priv) == [int(MA.sum())]
    assert eA.sum(0).decrypt_fixed(priv) == MA.sum(0).tolist()
    assert eA.sum(-1, keepdim=True).shape == (3, 1)
    assert eA.sum(1).decrypt_fixed(priv) == MA.sum(1).tolist()
    assert torch.equal(eA.mean(1).decrypt(priv), (MA.sum(1).double() / 2 ** 42))  # size 4: exact
    assert torch.allclose(eA.mean(0).decrypt(priv), A.mean(0), rtol=1e-9, atol=1e-12)
    assert torch.allclose(eA.mean().decrypt(priv), A.mean(), rtol=1e-9)
    assert enc(keys, torch.empty(0, 2)).sum(0).decrypt(priv).tolist() == [0.0, 0.0]


def test_shape_operations(keys):
    pub, priv = keys
    A = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    eA = enc(keys, A, 0)
    assert torch.equal(eA.T.decrypt(priv), A.T)
    assert torch.equal(eA.reshape(3, 2).decrypt(priv), A.reshape(3, 2))
    assert torch.equal(eA.flatten().decrypt(priv), A.flatten())
    assert torch.equal(eA[1].decrypt(priv), A[1])
    assert torch.equal(eA[:, 1:].decrypt(priv), A[:, 1:])
    assert eA[0, 2].decrypt(priv).item() == 2.0
    assert torch.equal(eA[torch.tensor([1, 0])].decrypt(priv), A[torch.tensor([1, 0])])
    both = EncryptedTensor.cat([eA, enc(keys, A, 4)], dim=0)
    assert both.frac_bits == 4 and torch.equal(both.decrypt(priv), torch.cat([A, A]))


def test_exact_integer_masks(keys):
    pub, priv = keys
    g = torch.tensor([0.125, -3.5, 1e-6], dtype=torch.float64)
    eg = enc(keys, g)
    masks = [(1 << 300) + 12345, -(1 << 299), 7]            # far larger than the values
    masked = eg.add_fixed(masks)
    got = [m - r for m, r in zip(masked.decrypt_fixed(priv), masks)]
    assert got == fixed(g, 40)
    assert eg.add_fixed(torch.tensor([1, 2, 3])).decrypt_fixed(priv) == [m + r for m, r in zip(fixed(g, 40), (1, 2, 3))]
    with pytest.raises(TypeError):
        eg.add_fixed(torch.ones(3))
    with pytest.raises(ValueError):
        eg.add_fixed([1, 2])


def test_rerandomize_changes_ciphertexts_not_values(keys, pool):
    pub, priv = keys
    e = enc(keys, [1.0, -2.0]) * 3
    assert not e.obfuscated
    r = e.rerandomize(pool)
    assert r.obfuscated and set(map(int, r.ciphertexts)).isdisjoint(map(int, e.ciphertexts))
    assert r.decrypt_fixed(priv) == e.decrypt_fixed(priv)


# ------------------------------------------------------------------ overflow
def test_overflowing_operations_raise_before_running(keys):
    pub, priv = keys                                    # 512 bits: the safe range is |m| < 2^509
    big = enc(keys, [2.0 ** 300], 100)                  # m = 2^400
    with pytest.raises(EncodingOverflowError):
        big * (2 ** 120)
    with pytest.raises(EncodingOverflowError):
        big @ torch.full((1, 3), 2.0 ** 120, dtype=torch.float64)
    with pytest.raises(EncodingOverflowError):
        big.lift(250)
    with pytest.raises(EncodingOverflowError):
        EncryptedTensor.encrypt(pub, torch.tensor([2.0 ** 420], dtype=torch.float64), 100)
    s = big
    for _ in range(200):                                # 110 doublings pass 2^509
        try:
            s = s + s
        except EncodingOverflowError:
            break
    else:
        pytest.fail("repeated doubling never raised")
    assert s.decrypt(priv).item() == float(s.decrypt_fixed(priv)[0]) / 2 ** 100   # what passed is still exact


def test_accumulated_sums_are_bounded(keys):
    pub, priv = keys
    e = enc(keys, torch.full((2 ** 10,), 2.0 ** 200, dtype=torch.float64), 100)  # each m = 2^300, bound 2^300
    assert e.sum().decrypt(priv).item() == 2.0 ** 210        # 2^10 terms: fits
    wide = e.reshape(1, -1) @ torch.full((2 ** 10, 1), float(2 ** 190), dtype=torch.float64)
    with pytest.raises(EncodingOverflowError):
        wide * (2 ** 20)


def test_declared_max_abs_is_checked_and_used(keys):
    pub, priv = keys
    e = EncryptedTensor.encrypt(pub, torch.tensor([0.5, -0.9]), 16, max_abs=1.0)
    assert e.bound == 2 ** 16
    with pytest.raises(ValueError, match="max_abs"):
        EncryptedTensor.encrypt(pub, torch.tensor([1.5]), 16, max_abs=1.0)


def test_a_wrong_private_key_is_named(keys):
    _, other = generate_keypair(512, insecure=True)
    with pytest.raises(KeyMismatchError):
        enc(keys, [1.0]).decrypt(other)
    other_pub = other.public_key
    with pytest.raises(KeyMismatchError):
        enc(keys, [1.0]) + EncryptedTensor.encrypt(other_pub, torch.ones(1))


def test_2048_bit_round_trip_of_the_float64_extremes():
    pub, priv = generate_keypair(2048)
    huge = torch.tensor([1.7976931348623157e308, -1.7976931348623157e308, 1e300, 0.0], dtype=torch.float64)
    e = EncryptedTensor.encrypt(pub, huge, 1000)            # 2^1024 2^1000 < n/3 ~ 2^2046
    assert torch.equal(e.decrypt(priv), huge)
    g = e[:2] @ torch.tensor([[0.5], [0.25]], dtype=torch.float64)
    assert g.decrypt(priv).item() == 0.25 * 1.7976931348623157e308
    tiny = torch.tensor([5e-324, -5e-324, 2.2250738585072014e-308, -1e-310], dtype=torch.float64)
    assert torch.equal(EncryptedTensor.encrypt(pub, tiny, 1074).decrypt(priv), tiny)   # 2^-1074 is m = 1
