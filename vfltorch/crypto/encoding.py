"""Fixed-point encoding of real tensors into the Paillier plaintext ring Z_n.

A real x is represented by the integer m = round(x * 2^f) for a number f of
*fractional bits* (rounding half to even), and m by its residue in Z_n:

    encode(x) = m mod n,   so a negative m lands in the upper half as n - |m|.

Addition and multiplication of residues mod n are exact as long as the true
integer result stays inside the *safe range* |m| <= max_int = floor(n/3) - 1
(phe's ``max_int``). Decoding maps r in [0, n) back to a signed integer:

    r <= max_int          ->  m = r
    r >= n - max_int      ->  m = r - n
    otherwise             ->  overflow: the result wrapped around (raised).

The middle third is the detection band: a sum that overflowed by less than
n/3 lands there instead of aliasing a valid value. We use phe's bound, not
n/2, so that phe decodes our ciphertexts exactly as we do.

Scale. Every encrypted tensor carries its f. Sums need equal f (the smaller
is lifted by multiplying with 2^Δf); a product of values with f1 and f2
fractional bits has f1 + f2, e.g. a residual with 40 bits times a feature
with 16 bits has 56. Decoding divides by 2^f exactly and rounds once, to the
nearest float64.

Magnitude bound. Wrapping cannot be seen inside the ring, so every tensor also
carries a conservative bound B >= max |m|, updated by each operation (B1 + B2
for sums, B * max|k| for products, B * sum|k_i| for dot products...), and an
operation whose bound would pass max_int raises ``EncodingOverflowError``
before it runs. With a 2048-bit key max_int is about 2^2046, so this only
bites with absurd scales, or with the small keys of tests.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .errors import EncodingOverflowError
from .keys import PublicMath

DEFAULT_FRAC_BITS = 40
"""Fractional bits of encrypted values: absolute precision 2^-41 ~ 4.5e-13, free of cost
(the size of m does not change the cost of any ciphertext operation)."""

DEFAULT_SCALAR_FRAC_BITS = 16
"""Fractional bits of plaintext multipliers: their size *is* the exponent of a modular
exponentiation, so short is fast. 16 bits give an absolute error <= 2^-17 ~ 7.6e-6."""

_FAST_LIMIT = 2.0 ** 62     # scaled magnitudes below this round through int64
_FLOAT_LIMIT = 2.0 ** 1000  # below this the float64 product x * 2^f cannot overflow


def check_frac_bits(frac_bits, name: str = "frac_bits") -> int:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, (int, np.integer)) or frac_bits < 0:
        raise ValueError(f"{name} must be a non-negative int (number of fractional bits), got {frac_bits!r}")
    return int(frac_bits)


def as_plain_tensor(x, what: str = "value") -> torch.Tensor:
    """Accept tensors, numpy arrays, numbers and nested lists; refuse complex numbers."""
    try:
        t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{what} must be a tensor, an array or a number, got {type(x).__name__}") from exc
    if t.is_complex():
        raise TypeError(f"{what} is complex; Paillier encodes real numbers only")
    if not t.is_floating_point():
        t = t.to(torch.int64)     # bool and unsigned types would not survive negation
    return t.cpu()


def to_fixed(x, frac_bits: int) -> tuple[list[int], int]:
    """``round(x * 2^frac_bits)`` for every element of ``x`` (row-major), and the largest magnitude.

    Integer tensors are shifted exactly. Floats are scaled by a power of two
    (exact in float64) and rounded half to even; NaN and infinities are refused.
    """
    f = check_frac_bits(frac_bits)
    if _is_big_int(x):                       # Python ints may exceed int64: keep them exact
        m = int(x) << f
        return [m], abs(m)
    t = as_plain_tensor(x)
    if t.numel() == 0:
        return [], 0
    if not t.is_floating_point():
        ms = [int(v) << f for v in t.reshape(-1).tolist()]
        return ms, max(abs(m) for m in ms)
    flat = t.reshape(-1).to(torch.float64)
    if not bool(torch.isfinite(flat).all()):
        raise ValueError("cannot encode NaN or infinite values; clean the input first")
    amax = float(flat.abs().max())
    # float products overflow to inf (no exception); 2.0 ** f itself would raise for f >= 1024
    scaled_max = amax * 2.0 ** f if f < 1000 else math.inf
    if scaled_max < _FAST_LIMIT:
        ms = torch.round(flat * (2.0 ** f)).to(torch.int64).tolist()
    elif scaled_max < _FLOAT_LIMIT:
        # Multiplying by 2^f is exact; np.rint rounds half to even; int() of an
        # integral float is exact, whatever its size.
        ms = [int(v) for v in np.rint(flat.numpy() * 2.0 ** f).tolist()]
    else:
        ms = [_exact_fixed(v, f) for v in flat.tolist()]
    return ms, max(abs(m) for m in ms)


def _is_big_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def plain_shape(x) -> torch.Size:
    """The shape a plaintext operand broadcasts with (Python numbers are 0-d)."""
    return torch.Size(()) if _is_big_int(x) else as_plain_tensor(x).shape


def _exact_fixed(v: float, f: int) -> int:
    """round(v * 2^f) computed on integers (for scales where float64 would overflow)."""
    if v == 0.0:
        return 0
    mant, exp = math.frexp(v)           # v = mant * 2^exp, 0.5 <= |mant| < 1
    mi = int(mant * (1 << 53))           # exact: mant has at most 53 significant bits
    shift = exp - 53 + f
    return mi << shift if shift >= 0 else round_shift(mi, -shift)


def round_shift(m: int, s: int) -> int:
    """round(m / 2^s), half to even, on integers."""
    if s <= 0:
        return m << -s
    q, r = divmod(int(m), 1 << s)        # floor division: r in [0, 2^s)
    half = 1 << (s - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return q


def from_fixed(ms, frac_bits: int, shape, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The tensor of ``m / 2^frac_bits`` (each correctly rounded to float64, then cast to ``dtype``)."""
    if not dtype.is_floating_point:
        raise TypeError(f"decoded values are real numbers; ask for a floating dtype, not {dtype}")
    denom = 1 << frac_bits
    try:
        vals = [int(m) / denom for m in ms]
    except OverflowError as exc:
        raise EncodingOverflowError(f"a decrypted value is too large for a float64 "
                                    f"(its fixed-point integer has more than 1024 + {frac_bits} bits)") from exc
    return torch.tensor(vals, dtype=torch.float64).reshape(tuple(shape)).to(dtype)


def to_ring(m: int, n):
    """The residue of a signed integer in Z_n (negatives become n - |m|)."""
    return m % n


def from_ring(r, pm: PublicMath) -> int:
    """The signed integer that ``r`` in Z_n encodes; raises in the overflow band."""
    if r <= pm.max_int:
        return r
    if r >= pm.n - pm.max_int:
        return r - pm.n
    raise EncodingOverflowError(
        "a decrypted plaintext lies in the overflow band (n/3, 2n/3): the computation wrapped "
        "around the plaintext ring. Lower frac_bits, scale the inputs down, or use a larger key.")


def check_bound(bound: int, pm: PublicMath, what: str) -> int:
    """Raise ``EncodingOverflowError`` if a tracked bound leaves the safe range; return it."""
    if bound > pm.max_int:
        raise EncodingOverflowError(
            f"{what} could reach a fixed-point magnitude of 2^{int(bound).bit_length()}, beyond the "
            f"safe range of this {pm.bits}-bit key (n/3 ~ 2^{int(pm.max_int).bit_length()}); the result "
            f"could wrap around. Lower frac_bits, scale the inputs down, or use a larger key. (Tensors "
            f"imported with from_phe without max_abs assume the worst case: declare max_abs.)")
    return bound


def encode_multiplier(x, frac_bits: int | None) -> tuple[list[int], int, torch.Size]:
    """Plaintext multipliers as fixed-point ints with the *shortest* exact scale.

    ``frac_bits=None`` means 0 for integer tensors and ``DEFAULT_SCALAR_FRAC_BITS``
    for floats. Common trailing zero bits are then stripped (k -> k / 2^z,
    f -> f - z): the value is unchanged and the exponents get shorter, e.g.
    0.25 is multiplied as 1 with 2 fractional bits instead of 16384 with 16.
    """
    if _is_big_int(x):
        t = int(x)
        shape = torch.Size(())
        frac_bits = 0 if frac_bits is None else frac_bits
    else:
        t = as_plain_tensor(x, "multiplier")
        shape = t.shape
        if frac_bits is None:
            frac_bits = DEFAULT_SCALAR_FRAC_BITS if t.is_floating_point() else 0
    ks, _ = to_fixed(t, frac_bits)
    z = frac_bits
    for k in ks:
        if k:
            tz = (k & -k).bit_length() - 1
            if tz < z:
                z = tz
                if z == 0:
                    break
    if z:
        ks = [k >> z for k in ks]
    return ks, frac_bits - z, shape


__all__ = [
    "DEFAULT_FRAC_BITS", "DEFAULT_SCALAR_FRAC_BITS", "as_plain_tensor", "check_bound", "check_frac_bits",
    "encode_multiplier", "from_fixed", "from_ring", "plain_shape", "round_shift", "to_fixed", "to_ring",
]
