"""Fixed-point encoding: exact rounding, negatives in the upper half, overflow raised."""

from fractions import Fraction

import pytest
import torch

from vfltorch.crypto import EncodingOverflowError, generate_keypair
from vfltorch.crypto.encoding import (check_bound, encode_multiplier, from_fixed, from_ring, round_shift, to_fixed,
                                      to_ring)
from vfltorch.crypto.keys import public_math

VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.75, 1e-3, -1e-3, 123456.789, -98765.4321, 2.0 ** -20, 7.0]


@pytest.fixture(scope="module")
def pm():
    pub, _ = generate_keypair(512, insecure=True)
    return public_math(pub)


@pytest.mark.parametrize("f", [0, 8, 16, 40, 52, 80, 200, 1100])
def test_round_trip_is_the_nearest_fixed_point_value(f):
    x = torch.tensor(VALUES, dtype=torch.float64)
    ms, mmax = to_fixed(x, f)
    assert mmax == max(abs(m) for m in ms)
    for v, m in zip(VALUES, ms):
        assert abs(Fraction(m) - Fraction(v) * 2 ** f) <= Fraction(1, 2)
    back = from_fixed(ms, f, x.shape)
    for b, m in zip(back.tolist(), ms):
        assert b == float(Fraction(m, 2 ** f))          # decoding rounds once, correctly
    if f >= 80:      # every value above is a float64 with at most 80 fractional bits
        assert torch.equal(back, x)


def test_the_exact_path_agrees_with_the_fast_paths():
    vals = torch.tensor([3.0e300, -2.5e-300, 1.0 / 3.0, -7.125], dtype=torch.float64)
    for f in (10, 60, 1030):
        ms, _ = to_fixed(vals, f)
        assert ms == [round(Fraction(v) * 2 ** f) for v in vals.tolist()]


def test_rounding_is_half_to_even():
    ms, _ = to_fixed(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]), 0)
    assert ms == [0, 2, 2, 0, -2]
    assert [round_shift(m, 1) for m in (1, 3, 5, -1, -3)] == [0, 2, 2, 0, -2]


def test_integers_are_shifted_exactly():
    ms, _ = to_fixed(torch.tensor([3, -4, 0], dtype=torch.int64), 10)
    assert ms == [3 << 10, -4 << 10, 0]
    ms, _ = to_fixed(torch.tensor([True, False]), 0)
    assert ms == [1, 0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_are_refused(bad):
    with pytest.raises(ValueError, match="NaN"):
        to_fixed(torch.tensor([1.0, bad]), 16)


def test_negative_frac_bits_are_refused():
    with pytest.raises(ValueError, match="frac_bits"):
        to_fixed(torch.ones(1), -1)


def test_negatives_live_in_the_upper_half(pm):
    for m in (1, -1, 12345, -12345, int(pm.max_int), -int(pm.max_int)):
        r = to_ring(m, pm.n)
        assert 0 <= r < pm.n
        if m < 0:
            assert r == pm.n - abs(m)
        assert from_ring(r, pm) == m


def test_the_overflow_band_raises(pm):
    with pytest.raises(EncodingOverflowError, match="overflow band"):
        from_ring(pm.max_int + 1, pm)
    with pytest.raises(EncodingOverflowError, match="overflow band"):
        from_ring(pm.n // 2, pm)


def test_bounds_beyond_the_safe_range_raise(pm):
    assert check_bound(int(pm.max_int), pm, "x") == pm.max_int
    with pytest.raises(EncodingOverflowError, match="frac_bits"):
        check_bound(int(pm.max_int) + 1, pm, "this sum")


def test_multipliers_use_the_shortest_exact_scale():
    ks, f, shape = encode_multiplier(torch.tensor([0.25, -0.5, 1.0]), None)
    assert (ks, f, tuple(shape)) == ([1, -2, 4], 2, (3,))
    ks, f, _ = encode_multiplier(torch.tensor([3, -6]), None)
    assert (ks, f) == ([3, -6], 0)
    ks, f, _ = encode_multiplier(torch.tensor([1.0 / 3.0]), 16)
    assert (ks, f) == ([21845], 16)
    ks, f, _ = encode_multiplier(0.0, None)
    assert ks == [0]


def test_huge_decoded_values_raise_instead_of_returning_inf():
    with pytest.raises(EncodingOverflowError, match="float64"):
        from_fixed([1 << 1100], 10, (1,))
