"""Packing several fixed-point values into one Paillier plaintext (BatchCrypt-style).

A 2048-bit plaintext carries one value in the unpacked scheme, although a
fixed-point gradient needs a few dozen bits. When a protocol only *adds*
encrypted vectors and multiplies them by a *common* plaintext scalar (secure
aggregation of gradients, BatchCrypt's setting: Zhang et al., USENIX ATC
2020), s values can share one plaintext as s slots of B bits each:

    P = sum_{j<s} slot_j 2^{j B},    slot_j = m_j + base,    m_j = round(x_j 2^f).

Slots must never carry into their neighbour, so each slot holds a
*non-negative* number: the signed m_j is stored with an offset ``base``
("offset binary"), a public number equal to the tracked bound, so that
0 <= slot_j <= 2 base. The packed operations act on every slot at once:

* [[P]] [[P']]  ->  slots m_j + m'_j with base + base';
* [[P]]^k (k > 0)  ->  slots k m_j with base k (k a fixed-point scalar, f grows);
* negation  [[C]] [[P]]^{-1}, C = sum_j 2 base 2^{jB}  ->  slots 2 base - slot_j = base - m_j;
  a negative scalar is negation followed by |k|.

Headroom rule (what ``PackingLayout.plan`` computes, and what every
operation checks before it runs, raising ``PackingOverflowError``):

    2 base < 2^B                          (no slot can overflow)
    base <= T K ceil(max_abs 2^f)         after T packed tensors are summed and
                                          multiplied by scalars up to K = ceil(max|c| 2^g)
    => B = bitlength(2 T K ceil(max_abs 2^f)),
    s = floor((|n| - 1) / B)              (so P < 2^{|n|-1} < n: no wrap mod n).

That is: value bits (f + log2 max_abs), one bit for the sign offset,
ceil(log2 T) guard bits for the additions and the bits of the scalar. For
max_abs = 1, f = 16, T = 64 and a 16-bit scalar: B = 40 and s = 51 values per
2048-bit ciphertext, 51x fewer encryptions, decryptions and bytes.

What packing cannot do: multiply slots by *different* scalars (so no [[d]]^T X,
which needs a different x_ij per element) or sum the slots of one ciphertext.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import arith
from .encoding import (DEFAULT_SCALAR_FRAC_BITS, as_plain_tensor, check_frac_bits, encode_multiplier, from_fixed,
                       to_fixed)
from .errors import KeyMismatchError, PackingOverflowError
from .keys import PaillierPrivateKey, PaillierPublicKey, PublicMath, private_math, public_math
from .obfuscators import ObfuscatorPool, default_pool


@dataclass(frozen=True)
class PackingLayout:
    """Slots of ``slot_bits`` bits, ``slots`` per ciphertext, values with ``frac_bits`` and |x| <= ``max_abs``."""

    slot_bits: int
    slots: int
    frac_bits: int
    max_abs: float
    key_bits: int

    @classmethod
    def plan(cls, public_key: PaillierPublicKey, *, max_abs: float, frac_bits: int = 16, max_terms: int = 1,
             max_scalar: float | None = None, scalar_frac_bits: int = DEFAULT_SCALAR_FRAC_BITS,
             slot_bits: int | None = None) -> "PackingLayout":
        """The narrowest slots that hold sums of ``max_terms`` tensors times scalars up to ``max_scalar``.

        ``slot_bits`` overrides the computed width (it must be at least as wide).
        """
        pm = public_math(public_key)
        f = check_frac_bits(frac_bits)
        if not (isinstance(max_terms, int) and max_terms >= 1):
            raise ValueError(f"max_terms must be a positive int (how many packed tensors get added), got {max_terms!r}")
        base0 = _base(max_abs, f)
        k_max = 1
        if max_scalar is not None:
            # a scalar c is multiplied as k = round(c 2^g) (or shorter, after stripping trailing zeros)
            g = check_frac_bits(scalar_frac_bits, "scalar_frac_bits")
            k_max = max(1, math.ceil(abs(float(max_scalar)) * 2 ** g))
        need = (2 * max_terms * k_max * base0).bit_length()
        width = need if slot_bits is None else int(slot_bits)
        if width < need:
            raise PackingOverflowError(f"slot_bits={slot_bits} is too narrow: these values need {need} bits "
                                       f"(value, sign offset and guard bits; see PackingLayout.plan)")
        slots = (pm.bits - 1) // width
        if slots < 1:
            raise PackingOverflowError(f"a {width}-bit slot does not fit a {pm.bits}-bit key")
        return cls(width, slots, f, float(max_abs), pm.bits)

    @property
    def headroom(self) -> int:
        """The largest base (offset = bound) a slot can hold: 2 base < 2^slot_bits."""
        return ((1 << self.slot_bits) - 1) // 2


def _base(max_abs, frac_bits: int) -> int:
    if not (isinstance(max_abs, (int, float)) and math.isfinite(max_abs) and max_abs > 0):
        raise ValueError(f"max_abs must be a finite positive number (a public bound on |x|), got {max_abs!r}")
    return max(1, math.ceil(max_abs * 2 ** frac_bits))


class PackedEncryptedTensor:
    """A tensor packed ``layout.slots`` values per ciphertext; supports +, -, x common scalar, decrypt."""

    def __init__(self, public_key: PaillierPublicKey, ciphertexts, shape, layout: PackingLayout, frac_bits: int,
                 base: int, *, obfuscated: bool = False, _pm: PublicMath | None = None):
        self._pm = _pm if _pm is not None else public_math(public_key)
        self.public_key = public_key
        self._cs = list(ciphertexts)
        self.shape = torch.Size(shape)
        self.layout = layout
        if layout.slots * layout.slot_bits > self._pm.bits - 1:
            raise PackingOverflowError(f"this layout ({layout.slots} x {layout.slot_bits} bits) was planned for a "
                                       f"larger key than this {self._pm.bits}-bit one")
        if len(self._cs) != -(-math.prod(self.shape) // layout.slots):
            raise ValueError(f"{len(self._cs)} ciphertexts cannot hold shape {tuple(self.shape)} at "
                             f"{layout.slots} values each")
        self.frac_bits = check_frac_bits(frac_bits)
        self.base = int(base)
        if not 0 < self.base <= layout.headroom:
            raise PackingOverflowError(f"base {base} does not fit a {layout.slot_bits}-bit slot")
        self.obfuscated = bool(obfuscated)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ciphertexts(self) -> list:
        return list(self._cs)

    @property
    def nbytes(self) -> int:
        return len(self._cs) * self._pm.width

    def __repr__(self) -> str:
        return (f"PackedEncryptedTensor(shape={tuple(self.shape)}, slots={self.layout.slots}x{self.layout.slot_bits}b, "
                f"ciphertexts={len(self._cs)}, frac_bits={self.frac_bits}, key={self._pm.fingerprint})")

    # ------------------------------------------------------------ encryption
    @classmethod
    def encrypt(cls, public_key: PaillierPublicKey, x, layout: PackingLayout, *,
                pool: ObfuscatorPool | None = None) -> "PackedEncryptedTensor":
        pm = public_math(public_key)
        t = as_plain_tensor(x, "the tensor to pack")
        ms, mmax = to_fixed(t, layout.frac_bits)
        base = _base(layout.max_abs, layout.frac_bits)
        if mmax > base:
            raise PackingOverflowError(f"a value of magnitude {mmax / 2 ** layout.frac_bits:g} exceeds the layout's "
                                       f"max_abs={layout.max_abs}; plan the layout with a larger max_abs")
        plains = _pack([m + base for m in ms], layout.slots, layout.slot_bits, base)
        pool = pool if pool is not None else default_pool(public_key)
        if public_math(pool.public_key).n != pm.n:
            raise KeyMismatchError("the obfuscator pool belongs to another public key")
        cs = arith.encrypt_raw(plains, pool.take(len(plains)), pm.n, pm.nsquare)
        return cls(public_key, cs, t.shape, layout, layout.frac_bits, base, obfuscated=True, _pm=pm)

    def _like(self, cs, frac_bits: int, base: int) -> "PackedEncryptedTensor":
        return PackedEncryptedTensor(self.public_key, cs, self.shape, self.layout, frac_bits, base, _pm=self._pm)

    def _check_headroom(self, base: int, what: str) -> int:
        if base > self.layout.headroom:
            raise PackingOverflowError(
                f"{what} needs slots of {(2 * base).bit_length()} bits but the layout has {self.layout.slot_bits}: "
                f"plan the layout with more max_terms or a larger max_scalar (guard bits), or unpack first")
        return base

    # ------------------------------------------------------------ arithmetic
    def lift(self, frac_bits: int) -> "PackedEncryptedTensor":
        shift = check_frac_bits(frac_bits) - self.frac_bits
        if shift < 0:
            raise ValueError(f"cannot lower frac_bits from {self.frac_bits} to {frac_bits} without decrypting")
        if shift == 0:
            return self
        base = self._check_headroom(self.base << shift, f"lifting to frac_bits={frac_bits}")
        return self._like(arith.lift_raw(self._cs, shift, self._pm.nsquare), frac_bits, base)

    def add(self, other: "PackedEncryptedTensor") -> "PackedEncryptedTensor":
        if not isinstance(other, PackedEncryptedTensor):
            raise TypeError("packed tensors add only to packed tensors of the same layout; unpack (decrypt) "
                            "or use EncryptedTensor for plaintext operands")
        if other._pm.n != self._pm.n:
            raise KeyMismatchError("cannot add packed tensors of different keys")
        if other.layout != self.layout or other.shape != self.shape:
            raise ValueError("packed tensors must have the same shape and layout to be added")
        f = max(self.frac_bits, other.frac_bits)
        a, b = self.lift(f), other.lift(f)
        base = self._check_headroom(a.base + b.base, "this sum")
        return self._like(arith.add_raw(a._cs, b._cs, self._pm.nsquare), f, base)

    def neg(self) -> "PackedEncryptedTensor":
        # slot -> 2 base - slot = base - m: still in [0, 2 base], so no borrow crosses slots.
        const = _pack_const(2 * self.base, self.layout.slots, self.layout.slot_bits)
        inv = arith.negate_raw(self._cs, self._pm.nsquare)
        return self._like(arith.add_plain_raw(inv, [const] * len(inv), self._pm.n, self._pm.nsquare),
                          self.frac_bits, self.base)

    def sub(self, other: "PackedEncryptedTensor") -> "PackedEncryptedTensor":
        return self.add(other.neg())

    def mul(self, scalar, frac_bits: int | None = None) -> "PackedEncryptedTensor":
        """Every value times the same plaintext scalar (``frac_bits`` as for ``EncryptedTensor.mul``)."""
        if isinstance(scalar, (PackedEncryptedTensor,)):
            raise TypeError("Paillier cannot multiply two ciphertexts")
        t = as_plain_tensor(scalar, "the scalar")
        if t.numel() != 1:
            raise ValueError("packed values can only be multiplied by one common scalar (all slots share the "
                             "exponent); use EncryptedTensor for elementwise products")
        ks, fk, _ = encode_multiplier(t.reshape(()), frac_bits)
        k = ks[0]
        base = self._check_headroom(self.base * max(abs(k), 1), "this product")
        src = self.neg() if k < 0 else self
        if k == 0:
            # every value becomes 0: slot = base, i.e. the trivial encryption of the constant sum base 2^{jB}
            const = _pack_const(self.base, self.layout.slots, self.layout.slot_bits)
            cs = [(1 + const * self._pm.n) % self._pm.nsquare] * len(self._cs)
            return self._like(cs, self.frac_bits + fk, self.base)
        return self._like(arith.mul_common_raw(src._cs, abs(k), self._pm.nsquare), self.frac_bits + fk, base)

    def rerandomize(self, pool: ObfuscatorPool | None = None) -> "PackedEncryptedTensor":
        pool = pool if pool is not None else default_pool(self.public_key)
        out = self._like(arith.add_raw(self._cs, pool.take(len(self._cs)), self._pm.nsquare), self.frac_bits,
                         self.base)
        out.obfuscated = True
        return out

    def __add__(self, other):
        return self.add(other)

    def __sub__(self, other):
        return self.sub(other)

    def __neg__(self):
        return self.neg()

    def __mul__(self, other):
        return self.mul(other)

    def __rmul__(self, other):
        return self.mul(other)

    # ------------------------------------------------------------ decryption
    def decrypt(self, private_key: PaillierPrivateKey, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        sk = private_math(private_key)
        if sk.public.n != self._pm.n:
            raise KeyMismatchError("this private key belongs to another public key")
        plains = arith.decrypt_with(self._cs, sk)
        B, s = self.layout.slot_bits, self.layout.slots
        mask = (1 << B) - 1
        limit = 2 * self.base
        ms = []
        for P in plains:
            if P >> (s * B):
                raise PackingOverflowError("a packed plaintext is wider than its slots: the ciphertext was "
                                           "corrupted or overflowed")
            for j in range(s):
                slot = (P >> (j * B)) & mask
                if slot > limit:
                    raise PackingOverflowError("a packed slot overflowed its headroom; plan the layout with more "
                                               "guard bits (max_terms / max_scalar)")
                ms.append(slot - self.base)
        return from_fixed(ms[:self.numel], self.frac_bits, self.shape, dtype)


def _pack(slot_values: list[int], slots: int, slot_bits: int, pad: int) -> list[int]:
    """Integers sum_j v_j 2^{j B} over consecutive groups of ``slots`` values (the last padded with ``pad``)."""
    out = []
    for start in range(0, len(slot_values), slots):
        group = slot_values[start:start + slots]
        group = group + [pad] * (slots - len(group))
        acc = 0
        for v in reversed(group):
            acc = (acc << slot_bits) | v
        out.append(acc)
    return out


def _pack_const(value: int, slots: int, slot_bits: int) -> int:
    return _pack([value] * slots, slots, slot_bits, value)[0]


__all__ = ["PackedEncryptedTensor", "PackingLayout"]
