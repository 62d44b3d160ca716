"""Phases as fixed-point angles: the circle [0, 2*pi) as wrap-around integers.

A random Fourier feature only needs its phase ``w^T x + b`` modulo 2*pi, since
``cos`` is 2*pi-periodic. FDSKL's Algorithm 3 hides each party's partial
projection ``(w)_l^T (x)_l`` behind a uniform phase mask, so the natural group
for the masked values is the circle R / 2*pi Z. We represent an angle ``theta``
by the integer

    k = round(theta / (2*pi) * 2**bits)  (mod 2**bits),   bits = 16, 32 or 64,

held in int16 / int32 / int64 with two's-complement wrap-around, so that adding
integers *is* adding angles mod 2*pi, exactly:

* reducing mod 2*pi happens in ``encode``, before a value leaves its party;
* a mask is a uniform ``bits``-bit word, i.e. an exactly uniform angle on the
  grid of 2**bits points, so a masked angle is exactly uniform and says
  nothing on its own (a float64 mask added mod 2*pi is only uniform up to
  rounding);
* masks cancel exactly: no rounding error enters the sums of Algorithm 3, so
  the federated phases equal the centralised ones up to the rounding of each
  party's part in ``encode`` (at most half a grid step, 2*pi / 2**(bits+1), per
  party: 7e-10 rad for 32 bits).

16-bit angles (the default) have a grid step of 1e-4 rad: with Q parties each
phase is off by at most Q * 4.8e-5 rad, so each feature by at most 7e-5 * Q,
far below the O(D^-1/2) error of the random-feature kernel itself (a9a: the
same test accuracy as 32 and 64 bits). They halve the bytes of 32-bit
angles, and bytes are what a federated iteration pays for: on a9a with
Q = 4 on two cores, training took 4.2 s with 16-bit angles and 7.5 s with
32-bit ones (docs/fdskl.md). 32-bit angles are finer than a float32
projection; 64-bit angles match float64 projections (Lemma 1 to 1e-9).

Features from 16-bit angles are a lookup (``Circle.scaled_cos``): sqrt(2) cos(decode(k)) takes only
65,536 values, so the table of all of them is built once per (dtype, device, scale) with the very ops of
the computed path (decode, cos, scale) and gathered with int32 indices k mod 2**16 (``index_select``:
0.5 ms for 256 x 1536 float64 features, against 0.6 ms for the float32 cosines alone, one core at load 9). A party that
sends nothing (Q = 1) encodes straight into table indices (``encode_index``): the same grid units as
``encode``, summed with the phase words in int32. 32- and 64-bit angles are computed as before.

Masks come from ``vfltorch.comm.MaskStream`` (the one mask stream type):
``Circle.random`` reads its keystream bytes as 16- or 32-bit angles.
``Circle(64)`` is the same group as ``vfltorch.comm.RingGroup`` (Z / 2**64)
plus the angle encoding, and draws its words the same way.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..comm import RingGroup

TWO_PI = 2.0 * math.pi
TABLE_BITS = 16             # angles up to this width have a cosine table (``Circle.scaled_cos``)
_COS_TABLES: dict = {}      # (bits, dtype, out dtype, device, scale) -> table (public values: no secrets)


class Circle:
    """The angles mod 2*pi as ``bits``-bit wrap-around integers (a group with ``add`` / ``sub``).

    Duck-types the ``group`` argument of ``vfltorch.comm.masked_sum`` (``dtype``,
    ``add``, ``sub``, ``random``).
    """

    DTYPES = {16: torch.int16, 32: torch.int32, 64: torch.int64}
    NUMPY = {16: np.int16, 32: np.int32, 64: np.int64}

    def __init__(self, bits: int = 32):
        if bits not in self.DTYPES:
            raise ValueError(f"angle bits must be 16, 32 or 64, got {bits}")
        self.bits = bits
        self.dtype = self.DTYPES[bits]
        self.scale = float(2 ** bits)          # grid points per turn
        self.radians_per_unit = TWO_PI / self.scale

    def __repr__(self) -> str:
        return f"Circle(bits={self.bits})"

    # ------------------------------------------------------------ encoding
    def encode(self, theta: torch.Tensor) -> torch.Tensor:
        """Radians (any real) -> the nearest grid angle, reduced mod 2*pi, as a wrap-around integer."""
        if self.bits < 64:
            # Grid units, rounded. The int64 -> int32 / int16 cast keeps the low bits, i.e. reduces mod 2**bits.
            k = theta * (self.scale / TWO_PI)
            k.round_()                                         # (k is a fresh tensor: rounded in place)
            if k.device.type != "cpu":
                # On a GPU no host round trip for the range check: reduce mod 2**bits on the device (exact: k is
                # integer-valued and 2**bits a power of two), the same low bits as every route below.
                return torch.remainder(k, self.scale).to(torch.int64).to(self.dtype)
            lo, hi = torch.aminmax(k)
            peak = max(-float(lo), float(hi))
            if peak < 2.0 ** 31:
                # Through int32, not int64: the same low bits, and no 8-byte temporary (a fresh multi-MB
                # tensor costs page faults: 1.7 -> 0.1 ms for 175 x 1024 phases).
                return k.to(torch.int32).to(self.dtype)
            if peak >= 2.0 ** 62:
                # Beyond int64 (|theta| > 1e9 rad): reduce first; exact, as k is integer-valued.
                k = torch.remainder(k, self.scale)
            return k.to(torch.int64).to(self.dtype)
        turns = theta * (1.0 / TWO_PI)
        frac = turns - torch.round(turns)                      # in [-1/2, 1/2]
        frac = torch.where(frac >= 0.5, frac - 1.0, frac)      # [-1/2, 1/2): fits the signed range
        k = torch.round(frac.to(torch.float64) * self.scale)
        # frac < 1/2 - 2**-54 in float64, so k < 2**63 - 2**10: no overflow in the cast.
        return k.to(torch.int64)

    def decode(self, k: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Wrap-around integer -> radians in [-pi, pi)."""
        return k.to(dtype) * self.radians_per_unit

    # ------------------------------------------------------ cosine lookup
    def has_table(self) -> bool:
        """Whether ``scaled_cos`` looks angles up in a table (16-bit angles: 65,536 entries); else it computes."""
        return self.bits <= TABLE_BITS

    def cos_table(self, dtype: torch.dtype, device, scale: float = 1.0,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``scale * cos(decode(k, dtype))`` for every word k, at index k mod 2**bits (built once per key).

        The same ops as the computed path (``decode``, then ``cos_``, then ``mul_(scale)``, vectorised
        over the 2**bits words), then cast to ``out_dtype`` (default ``dtype``): a lookup gives the
        computed value element for element (tested on every word).
        """
        if not self.has_table():
            raise ValueError(f"no cosine table for {self.bits}-bit angles")
        out_dtype = dtype if out_dtype is None else out_dtype
        device = torch.device(device)
        key = (self.bits, dtype, out_dtype, str(device), float(scale))
        table = _COS_TABLES.get(key)
        if table is None:
            # Index u in [0, 2**bits) -> the word with the same low bits (the int32 -> int16 cast wraps).
            words = torch.arange(2 ** self.bits, dtype=torch.int32).to(self.dtype).to(device)
            table = self.decode(words, dtype).cos_().mul_(scale).to(out_dtype)
            _COS_TABLES[key] = table
        return table

    def table_index(self, k: torch.Tensor) -> torch.Tensor:
        """Words -> their table indices k mod 2**bits, as int32 (``index_select`` takes int32)."""
        return k.to(torch.int32).bitwise_and_(2 ** self.bits - 1)

    def encode_index(self, theta: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        """Table indices of ``encode(theta) + offset`` (``offset``: words, broadcast), without the word tensor.

        Equal to ``table_index(add(encode(theta), offset))``: the same grid units (the same scaling and
        rounding as ``encode``), summed in int32 and reduced mod 2**bits once. For a party that sends
        nothing (Q = 1): it rounds to the same grid as every federated run.
        """
        if not self.has_table():
            raise ValueError(f"no cosine table for {self.bits}-bit angles")
        k = theta * (self.scale / TWO_PI)
        k.round_()
        if k.device.type != "cpu":
            # (no host round trip for the range check on a GPU: reduced mod 2**bits first, the same indices)
            k = torch.remainder(k, self.scale).to(torch.int32)
            if offset is not None:
                k.add_(offset.to(torch.int32))
            return k.bitwise_and_(2 ** self.bits - 1)
        lo, hi = torch.aminmax(k)
        if max(-float(lo), float(hi)) >= 2.0 ** 30:        # (int32 sums could wrap: the general route)
            words = self.encode(theta)
            return self.table_index(words if offset is None else self.add(words, offset))
        k = k.to(torch.int32)
        if offset is not None:
            k.add_(offset.to(torch.int32))
        return k.bitwise_and_(2 ** self.bits - 1)

    def lookup(self, index: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """``table`` at the int32 indices ``index`` (any shape), in one ``index_select``."""
        return table.index_select(0, index.reshape(-1)).view(index.shape)

    def scaled_cos(self, k: torch.Tensor, dtype: torch.dtype, scale: float = 1.0,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(scale * cos(decode(k, dtype))).to(out_dtype)``: a table lookup for 16-bit angles, computed above."""
        if self.has_table():
            return self.lookup(self.table_index(k), self.cos_table(dtype, k.device, scale, out_dtype))
        phi = self.decode(k, dtype).cos_().mul_(scale)
        return phi if out_dtype is None else phi.to(out_dtype)

    # --------------------------------------------------------------- group
    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b                                           # wraps mod 2**bits

    def sub(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b

    def random(self, shape, stream, device) -> torch.Tensor:
        """Uniform words from a ``MaskStream``: exactly uniform angles on the grid."""
        if self.bits == 64:
            return RingGroup().random(shape, stream, device)      # the same group: one implementation
        shape = tuple(int(s) for s in shape)
        count = int(np.prod(shape)) if shape else 1
        words = stream.bytes(count * self.bits // 8).view(self.NUMPY[self.bits]).reshape(shape)
        out = torch.from_numpy(words)
        return out if device == "cpu" or device is None else out.to(device)


class KeptPhases:
    """The kept party's "mask" in Algorithm 3: given words instead of a fresh draw.

    Paper protocol: the fixed phases b_j of the features it keeps (one word per
    feature, the same for every row and every evaluation). Shared protocol:
    b_j plus the dealer's fresh mask beta_ij (one word per row and feature).
    """

    def __init__(self, words: torch.Tensor):
        self.words = words                                     # one word per requested feature (column)

    def draw(self, group: Circle, shape, device="cpu") -> torch.Tensor:
        if tuple(shape)[-1] != self.words.shape[-1]:
            raise ValueError(f"phases for {self.words.shape[-1]} features, values for {tuple(shape)[-1]}")
        return self.words.to(device).expand(tuple(shape))
