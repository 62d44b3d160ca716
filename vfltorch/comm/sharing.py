"""Secret-shared arithmetic: additive shares on Z_2^64, Beaver triples from a dealer, opening.

This is the one place in vfltorch where values are split into shares and
multiplied under sharing; every method that needs it (FDSKL, hetero LR, PCA)
calls these functions instead of writing its own.

Shares. A real value x lives in fixed point (``FixedPoint``: ``frac_bits``
fractional bits) as an element of the ring Z / 2**64 (int64 with wrap-around,
``RingGroup``). Its *additive shares* among the holders h_0, ..., h_{m-1} are
ring elements with x = x_0 + ... + x_{m-1} (mod 2**64). Every share but one is
a uniform ring element drawn from OS entropy, so any m - 1 shares together are
uniform and independent of x: a holder learns nothing from its share.

Opening. ``open_shares`` sends every share to the recipients, which add them:
only then is x known, and only to them.

Products (two holders, a dealer). For x and y shared between h_0 and h_1, a
*Beaver triple* (a, b, c = a * b, or c = a @ b for matrices) is dealt by a third
process (the dealer: the coordinator that ``vfl`` starts, or any rank that is
not a holder), which draws a and b uniformly from OS entropy and hands each
holder additive shares. The holders open e = x - a and f = y - b (uniform,
since a and b are) and set

    z_i = [i = 0] e * f + e * b_i + a_i * f + c_i,    z_0 + z_1 = x * y.

When x is held in the clear by h_0 and y by h_1 (the common vertical case: an
active-party number times a passive-party number), ``mul_private`` needs only
one message each way: the dealer gives h_0 (a, c_0) and h_1 (b, c_1) with
c_0 + c_1 = a * b; h_0 sends e = x - a, h_1 sends f = y - b, and
z_0 = a * f + c_0, z_1 = e * y + c_1.

When y is randomness the dealer itself dealt to h_1 (so the dealer knows it),
``mul_dealt`` needs one message only, h_0 -> h_1: the dealer gives h_0 a and
c_0 = a * y - c_1, h_1 a seed for c_1; h_0 sends e = x - a, and
z_0 = c_0, z_1 = e * y + c_1. FDSKL's phase masks are such randomness.

Many products with one opening each (``cross_products``): when every pair of
Q parties needs X_i^T X_j, the dealer gives party i one mask A_i and each
pair shares of A_i^T A_j; party i opens E_i = X_i - A_i once to every other
party and every pair's shares follow locally: (Q - 1) sum_i |X_i| elements in
all instead of Q (Q - 1) per-pair openings of both operands.

A public rotation of shared matrices (``rotate_shares``): two holders' shares
of V become shares of R V R^T for a real R they both know. Encoding R costs
its bits on each side, which Z_2^64 does not have next to V's, so the shares
are lifted to Z_2^128 (one product of the shares' top bits gives the wrap)
and truncated there, where two-holder truncation almost never fails.

Dealer bandwidth: the dealer sends seeds (16 bytes) for everything that is
uniform and one explicit tensor (c_1) per triple, so a triple costs the size
of its product, not three times that.

``kind`` is ``"mul"`` (elementwise, broadcasting), ``"matmul"``, ``"rowdot"``
(row-wise inner products, (a * b).sum(-1): many dot products in one triple) or
``"coldot"`` (column inner products of pairs of (rows x 2G) operands: G sums).

Narrow rings. Every function here computes in int64 (wrap-around, i.e. mod
2**64), and arithmetic mod 2**64 is also arithmetic mod 2**w for every w <= 64.
With ``bits=w`` for w in ``WIRE_BITS`` below 64 (``deal_dealt``, ``mul_dealt``'s
dealt path, ``open_shares``) the holders compute in int32 (mod 2**32, hence
mod 2**w), only the low w bits of each word travel (``send_words``: int32 for
32, packed into w / 8 bytes per word for w = 24, 20, 16) and
the opened value is read mod 2**w (``from_ring``: the signed representative).
The masked operand e = x - a is still uniform (a is uniform mod 2**32, so its
low w bits are uniform mod 2**w); the caller must keep the opened value inside
[-2**(w-1), 2**(w-1)): ``dot_scales`` picks fixed-point scales for h_0's
operand that guarantee it for dot products with |y| <= 2**y_bits from a bound
of each product's sum of |x| (``rowdot_scales``: the exact row sums; h_0 knows
its operand, so it knows a bound; the scales are its own and never travel). Below 32 bits the dealer's corrections c_0 travel packed
too (at 32 bits they stay int64 words in the seed message, as before).

Truncation. A product of two fixed-point values has 2 * frac_bits fractional
bits. Each of two holders truncates its own share (SecureML, Mohassel & Zhang
2017): h_0 shifts its share right by frac_bits, h_1 negates, shifts, negates.
The result is off by at most one unit in the last place, except with
probability about |x * y| * 2**(frac_bits + 1 - 64) per element, when it is
wildly wrong; ``FixedPoint.encode``'s bound keeps that probability small
(callers choose ``frac_bits`` so that products stay far below 2**(63 - frac_bits)).

Security model: semi-honest holders and a dealer that does not collude with
either holder. What each learns: a holder learns its shares and the opened
e, f (uniform); the dealer learns nothing (it never receives anything).
Products run on the CPU (integer matmul is not available on CUDA); results
return on the device of the inputs.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import torch

from .federation import Federation
from .masking import FixedPoint, MaskStream, RingGroup

RING = RingGroup()
_SEED_WORDS = 2     # a 128-bit seed travels as two int64 words


def fresh_seed() -> torch.Tensor:
    """128 bits of OS entropy as two int64 words: the seed of a secret stream, sent only to its holders."""
    # (torch.from_numpy, not torch.tensor: 3x faster, and the dealer draws three seeds per round)
    return torch.from_numpy(np.frombuffer(secrets.token_bytes(8 * _SEED_WORDS), dtype=np.int64).copy())


def _stream_from(seed: torch.Tensor) -> MaskStream:
    words = [int(w) % (2 ** 64) for w in seed.tolist()]
    return MaskStream.from_entropy(words[0] << 64 | words[1])


def _uniform(stream: MaskStream, shape, bits: int = 64) -> torch.Tensor:
    if bits == 64:
        return stream.draw(RING, tuple(shape))
    # Uniform mod 2**32: 4 bytes of the stream each, as int32 (torch's int32 arithmetic wraps mod 2**32). For the
    # 16-bit ring 2 bytes each, as int16 (uniform mod 2**16; half the bytes; int16 arithmetic wraps).
    shape = tuple(int(s) for s in shape)
    count = math.prod(shape)
    dtype = np.int16 if bits == 16 else np.int32
    return torch.from_numpy(stream.bytes(count * np.dtype(dtype).itemsize).view(dtype).reshape(shape))


WIRE_BITS = (64, 32, 24, 20, 16)


def _check_bits(bits: int) -> None:
    if bits not in WIRE_BITS:
        raise ValueError(f"ring width must be one of {WIRE_BITS}, got {bits}")


def wire_bytes(count: int, bits: int) -> int:
    """Bytes that ``count`` ring words of width ``bits`` take on the wire (``send_words``)."""
    _check_bits(bits)
    if bits in (64, 32):
        return count * bits // 8
    return 2 * count + (count * (bits - 16) + 7) // 8    # low 16 bits, then the high bits (bytes or nibbles)


def pack_words(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The low ``bits`` bits of each ring word as they travel: int64 / int32 for 64 / 32; below, one uint8
    tensor: the low 16 bits of every word (int16, little-endian), then bits 16-23 as one byte per word (24)
    or bits 16-19 as one nibble per word (20: words i and i + ceil(n / 2) share byte i)."""
    _check_bits(bits)
    if bits == 64:
        return x.to(torch.int64)
    if bits == 16 and x.dtype == torch.int16:            # the 16-bit ring's own words: their bytes, no pass
        x = x.reshape(-1)
        if x.device.type != "cpu":
            x = x.cpu()
        return x.view(torch.uint8) if x.is_contiguous() else x.contiguous().view(torch.uint8)
    if bits == 32:
        return x.reshape(-1).cpu().to(torch.int32)      # the int64 -> int32 cast keeps the low bits
    # Below 32 bits in numpy at every size (one torch call, the same bytes; issue 11's op count): as fast as the
    # torch passes at 2 B D words and 4-6x faster on small vectors (the dealer's corrections, the shares).
    x = x.reshape(-1)
    return torch.from_numpy(_pack_np((x if x.device.type == "cpu" else x.cpu()).numpy(), bits))


def unpack_words(buf: torch.Tensor, shape, bits: int) -> torch.Tensor:
    """Inverse of ``pack_words``: int32 words (int64 for 64) of ``shape``; below 32 bits each is the unsigned
    representative in [0, 2**bits), which is the same element of Z_2^bits."""
    _check_bits(bits)
    shape = tuple(int(s) for s in shape)
    if bits in (64, 32):
        return buf.reshape(shape)
    count = math.prod(shape)
    return torch.from_numpy(_unpack_np(buf.numpy(), count, bits).reshape(shape))


_UINT16 = getattr(torch, "uint16", None)                 # torch >= 2.3


def _pack_np(x: np.ndarray, bits: int) -> np.ndarray:
    """``pack_words`` below 32 bits in numpy (the same layout); x: flat integer words. The high bits come from
    int32 shifts and masks on contiguous words, then one narrowing cast: 76 us against 134 us for 196,608 words
    (f's operand at B = 64, D = 1536; the earlier strided byte copy and uint8 shifts; median of 500 calls, one-off
    timings)."""
    x = np.ascontiguousarray(x.astype(np.int32, copy=False))       # int64 -> int32 keeps the low bits
    n = x.size
    out = np.empty(wire_bytes(n, bits), dtype=np.uint8)
    out[:2 * n].view(np.int16)[:] = x                               # (unsafe cast: the low 16 bits)
    if bits == 16:
        return out
    high = out[2 * n:]
    if bits == 24:
        high[:] = np.right_shift(x, 16)                             # bits 16-23 of each word (the cast drops 24-31)
    else:                                                           # 20: word i's nibble with word i + ceil(n / 2)'s
        half = (n + 1) // 2
        low = np.right_shift(x[:half], 16)
        low &= 0xF
        up = np.right_shift(x[half:], 12)                           # bits 16-19 at bits 4-7
        up &= 0xF0
        low[:n - half] |= up
        high[:] = low                                               # (the cast keeps the byte)
    return out


def _unpack_np(buf: np.ndarray, count: int, bits: int) -> np.ndarray:
    """``unpack_words`` below 32 bits in numpy: int32 words, the unsigned representative in [0, 2**bits). The
    high bits are written as byte 2 of each little-endian word (a strided view), once: the nibbles are first
    spread into a contiguous row of bytes (30-40% faster at 2 B D words than two strided writes, one-off timings)."""
    x = buf[:2 * count].view(np.uint16).astype(np.int32)           # (a slice at an odd byte: numpy reads it)
    if bits > 16:
        third = x.view(np.uint8)[2::4]
        high = buf[2 * count:wire_bytes(count, bits)]
        if bits == 24:
            third[:] = high
        else:
            half = (count + 1) // 2
            spread = np.empty(count, dtype=np.uint8)
            np.bitwise_and(high, 0xF, out=spread[:half])
            np.right_shift(high[:count // 2], 4, out=spread[half:])
            third[:] = spread
    return x


def _from_ring_np(x: np.ndarray, bits: int) -> np.ndarray:
    """``from_ring`` in numpy (int64 in, int64 out): the same integers."""
    if bits == 64:
        return x.astype(np.int64, copy=False)
    if bits == 32:
        return x.astype(np.int32).astype(np.int64)
    low = x.astype(np.int64, copy=False) & ((1 << bits) - 1)
    return (low ^ (1 << (bits - 1))) - (1 << (bits - 1))


def send_words(fed: Federation, x: torch.Tensor, dst: int, bits: int = 64) -> None:
    """Send ring words of width ``bits`` (``pack_words``): ``wire_bytes`` bytes."""
    fed.send(pack_words(x, bits), dst)


def recv_words(fed: Federation, src: int, shape, bits: int = 64) -> torch.Tensor:
    """Receive what ``send_words`` sent: int32 words (int64 for 64) of ``shape``, on the CPU."""
    _check_bits(bits)
    shape = tuple(int(s) for s in shape)
    if bits in (64, 32):
        return fed.recv(src, shape, _wire_dtype(bits), device="cpu")
    count = math.prod(shape)
    return unpack_words(fed.recv(src, (wire_bytes(count, bits),), torch.uint8, device="cpu"), shape, bits)


def word_bytes(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``pack_words`` as one flat uint8 tensor (``wire_bytes`` long): a part of a message that carries several."""
    return pack_words(x.cpu(), bits).reshape(-1).view(torch.uint8)


def post_words(fed: Federation, src: int, shape, bits: int = 64) -> None:
    """Post ahead the receive of ring words that ``recv_words`` or ``recv_ring_words`` will take
    (``Federation.post_recv``: the same message shape and dtype)."""
    _check_bits(bits)
    shape = tuple(int(s) for s in shape)
    if bits in (64, 32):
        fed.post_recv(src, shape, _wire_dtype(bits))
    else:
        fed.post_recv(src, (wire_bytes(math.prod(shape), bits),), torch.uint8)


def recv_ring_words(fed: Federation, src: int, shape, bits: int = 64) -> torch.Tensor:
    """Receive what ``send_words`` sent, in the type the ring's products are computed in (``_ring_dtype``: 16-bit
    words as int16, with no unpacking pass). The message's dtype is the sender's (``pack_words``: uint8 below 32
    bits), which the TLS link checks."""
    if bits != 16:
        return recv_words(fed, src, shape, bits)
    shape = tuple(int(s) for s in shape)
    return ring_words_from_bytes(fed.recv(src, (wire_bytes(math.prod(shape), 16),), torch.uint8, device="cpu"),
                                 shape, 16)


def words_from_bytes(buf: torch.Tensor, shape, bits: int) -> torch.Tensor:
    """Inverse of ``word_bytes`` (a slice of a message at any byte offset): the words ``unpack_words`` returns."""
    _check_bits(bits)
    if bits in (64, 32):
        if buf.storage_offset() % (bits // 8):
            buf = buf.clone()
        return buf.view(_wire_dtype(bits)).reshape(tuple(int(s) for s in shape))
    return unpack_words(buf, shape, bits)


def ring_words_from_bytes(buf: torch.Tensor, shape, bits: int) -> torch.Tensor:
    """``words_from_bytes`` in the type products of the ring are computed in (``_ring_dtype``): for 16 bits the
    int16 words themselves (a view; a copy at an odd byte offset), with no unpacking pass."""
    if bits != 16:
        return words_from_bytes(buf, shape, bits)
    if buf.storage_offset() % 2:
        buf = buf.clone()
    return buf.view(torch.int16).reshape(tuple(int(s) for s in shape))


def split_bytes(buf: torch.Tensor, lengths) -> list:
    """A uint8 message cut into consecutive parts of the given byte lengths (all of it, exactly)."""
    lengths = [int(n) for n in lengths]
    if sum(lengths) != buf.numel():
        raise ValueError(f"a message of {buf.numel()} bytes does not hold parts of {lengths} bytes")
    parts, at = [], 0
    for n in lengths:
        parts.append(buf[at:at + n])
        at += n
    return parts


def to_wire(x: torch.Tensor, bits: int = 64) -> torch.Tensor:
    """The ring words as they travel: int64, their low 32 bits as int32, or packed (``pack_words``)."""
    return pack_words(x, bits)


def from_ring(x: torch.Tensor, bits: int = 64) -> torch.Tensor:
    """The signed representative in [-2**(bits-1), 2**(bits-1)) of a word read mod 2**bits, as int64."""
    if bits == 64:
        return x
    if bits == 32:
        return x.to(torch.int32).to(torch.int64)
    low = x.to(torch.int64) & ((1 << bits) - 1)
    return (low ^ (1 << (bits - 1))) - (1 << (bits - 1))


def _wire_dtype(bits: int) -> torch.dtype:
    return torch.int64 if bits == 64 else torch.int32


def _ring_dtype(bits: int) -> torch.dtype:
    """The integer type products of a ``bits``-bit ring are computed in: int64, int16 for 16 bits (its words are
    exactly the wire's; int16 arithmetic wraps mod 2**16), int32 otherwise (mod 2**32, hence mod 2**bits)."""
    return torch.int16 if bits == 16 else _wire_dtype(bits)


def _word(y: torch.Tensor, bits: int) -> torch.Tensor:
    """A known operand as ring words (``_ring_dtype``: the narrowing cast keeps the low bits)."""
    return _cpu_as(y, _ring_dtype(bits))


def _cpu_as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.cpu().to(dtype)`` without the calls that would return x itself (per-iteration operands)."""
    if x.device.type != "cpu":
        x = x.cpu()
    return x if x.dtype == dtype else x.to(dtype)


def rowdot_scales(x: torch.Tensor, bits: int, y_bits: int) -> torch.Tensor:
    """Per-row scales s_i for h_0's real operand x (rows x k) in a row-wise product with integers |y| <= 2**y_bits.

    With x_enc = round(s_i x_i), |sum_k x_enc,ik y_ik| <= 2**y_bits (s_i sum_k |x_ik| + k / 2) < 2**(bits - 1):
    the opened row dot never wraps in Z_2^bits, and uses (nearly) all of its bits. Rows of zeros get 1.
    (``dot_scales`` with the exact sums of |x|.)
    """
    return dot_scales(x.abs().sum(-1, dtype=torch.float64).numpy(), x.shape[-1], bits, y_bits)


def dot_scales(bound: np.ndarray, k: int, bits: int, y_bits: int) -> torch.Tensor:
    """Scales s for dot products of k terms x . y in Z_2^bits, |y| <= 2**y_bits, from ``bound`` >= sum_k |x| of
    each product (float64, any shape): with x_enc = round(s x) (x s in float32: 2**-24 per element),
    |x_enc . y| <= 2**y_bits (s bound + k / 2) < 2**(bits - 1), so the opened value never wraps. A bound that
    h_0 knows without a pass over x (FDSKL: sqrt2 times the 1-norm of its coefficients or row weights,
    since |cos| + |sin| <= sqrt2) costs at most the bound's slack in resolution. A zero bound gets 1.
    """
    # The margin 2**-10 covers float32 rounding of x * s (2**-24 per element).
    room = 2.0 ** (bits - 1 - y_bits) * (1 - 2.0 ** -10) - k / 2 - 1
    if room <= 0:
        raise OverflowError(f"a dot product of {k} terms does not fit Z_2^{bits} with |y| <= 2**{y_bits}")
    total = np.asarray(bound, dtype=np.float64)
    # room / total, and 1 where total == 0 (total >= 0: x finite), in numpy (fewer calls) with torch's operations:
    # a Python number divided by a tensor is the tensor's reciprocal times the number (two roundings).
    with np.errstate(divide="ignore"):
        out = np.reciprocal(total) * room
    out = np.atleast_1d(out)
    out[np.atleast_1d(total) == 0] = 1.0
    return torch.from_numpy(out.reshape(total.shape))


# ------------------------------------------------------------------ sharing
def share(fed: Federation, x: torch.Tensor | None, *, owner: int, holders, shape=None,
          fp: FixedPoint | None = None) -> torch.Tensor | None:
    """``owner`` splits its value ``x`` into additive shares for ``holders``; each holder gets one.

    ``x`` is real (encoded with ``fp``) or already a ring element (int64, with
    ``fp=None``). The owner may itself be a holder. Holders that are not the
    owner must pass ``shape``. Returns this rank's share (int64), or ``None``.
    """
    holders = list(holders)
    if fed.rank == owner:
        ring = fp.encode(x) if fp is not None else x.to(torch.int64)
        dev = ring.device
        ring = ring.cpu()
        stream = MaskStream.private(fed.rank)
        mine = ring.clone()
        # The owner keeps x minus the others' uniform shares; if it is not a holder, the last holder gets that.
        random_to = [h for h in holders if h != owner] if owner in holders else holders[:-1]
        for h in random_to:
            r = _uniform(stream, ring.shape)
            mine = mine - r
            fed.send(r, h)
        if owner in holders:
            return mine.to(dev)
        fed.send(mine, holders[-1])
        return None
    if fed.rank in holders:
        if shape is None:
            raise ValueError("holders that do not own the value must pass its shape")
        return fed.recv(owner, tuple(shape), torch.int64, device="cpu")
    return None


def open_shares(fed: Federation, mine: torch.Tensor | None, *, holders, to=None, shape=None,
                bits: int = 64) -> torch.Tensor | None:
    """The ring sum of the holders' shares at each rank of ``to`` (default: every holder).

    Every holder sends its share to every recipient but itself; the recipients
    add. A recipient that holds no share passes ``shape``. Returns the opened
    int64 tensor (CPU) at recipients, ``None`` elsewhere. ``bits`` below 64: shares
    travel as ``bits``-bit words and the value is opened mod 2**bits (signed).
    """
    holders = list(holders)
    to = holders if to is None else ([to] if isinstance(to, int) else list(to))
    if mine is not None:
        shape = mine.shape
    total = None
    # One gather per recipient, in the same order at every rank: blocking sends never wait on each other. The
    # sums in numpy (int64 wraps mod 2**64 as the ring does; ``_from_ring_np`` reads them signed mod 2**bits): the
    # same integers as torch's, in fewer calls on the small openings of every product (issue 11's op count).
    for r in to:
        if fed.rank == r:
            if shape is None:
                raise ValueError("a recipient that holds no share must pass the shape of the opened value")
            total = None if mine is None else mine.cpu().numpy().astype(np.int64)
            for h in holders:
                if h != r:
                    part = recv_words(fed, h, shape, bits).numpy()
                    total = part.astype(np.int64) if total is None else total + part
        elif fed.rank in holders:
            send_words(fed, mine, r, bits)
    return None if total is None else torch.from_numpy(_from_ring_np(total, bits).reshape(tuple(shape)))


def open_value(fed: Federation, mine: torch.Tensor | None, *, holders, fp: FixedPoint, to=None,
               shape=None) -> torch.Tensor | None:
    """``open_shares`` then decode from fixed point (float64) at the recipients."""
    total = open_shares(fed, mine, holders=holders, to=to, shape=shape)
    return None if total is None else fp.decode(total)


def truncate(mine: torch.Tensor, index: int, frac_bits: int) -> torch.Tensor:
    """Drop ``frac_bits`` fractional bits from a two-holder share (``index`` 0 or 1); see the module doc."""
    if index == 0:
        return mine >> frac_bits            # arithmetic shift: floor division by 2**frac_bits
    return -((-mine) >> frac_bits)


# ------------------------------------------------------------------ dealer
def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _row_sums(a * b)


def _row_sums(p: torch.Tensor) -> torch.Tensor:
    return p.sum(-1, dtype=p.dtype)         # int32 stays int32 (mod 2**32, 2.5x faster than promoting to int64)


def _coldot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Column dot products of pairs: (rows x 2G) operands, z_j = sum_i a_i,2j b_i,2j + a_i,2j+1 b_i,2j+1.

    FDSKL's gradient sums over the batch rows, in the layout of the row products' operands (no transposed copy
    at any role). Summed down the rows first (a vectorised pass), in the operands' type (it wraps in the ring)."""
    return _pair_column_sums(a * b)


def _pair_column_sums(p: torch.Tensor) -> torch.Tensor:
    """Sums down the rows (dim -2), then over each pair of columns; leading dims are separate products (the
    dealer's batched rounds, ``kernels.shared.deal_rounds``)."""
    cols = p.sum(-2, dtype=p.dtype)
    return cols.view(*cols.shape[:-1], -1, 2).sum(-1, dtype=p.dtype)


def _op(kind: str):
    if kind == "mul":
        return torch.mul
    if kind == "matmul":
        return torch.matmul
    if kind == "rowdot":
        return _rowdot                      # row-wise inner products: bilinear, so Beaver's identity holds
    if kind == "coldot":
        return _coldot                      # column inner products of pairs: bilinear too
    raise ValueError(f"triple kind must be 'mul' or 'matmul' (or 'rowdot' / 'coldot': row-wise dot products, "
                     f"column dot products of pairs), got {kind!r}")


def _broadcast(a, b) -> tuple:
    # Plain Python: torch.broadcast_shapes imports sympy on first use (seconds).
    a, b = tuple(int(s) for s in a), tuple(int(s) for s in b)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b))


def _out_shape(kind: str, shape_a, shape_b) -> tuple:
    if kind == "matmul":
        return tuple((torch.empty(tuple(shape_a), dtype=torch.float32)
                      @ torch.empty(tuple(shape_b), dtype=torch.float32)).shape)
    full = _broadcast(shape_a, shape_b)
    if kind == "coldot":
        if len(full) != 2 or full[1] % 2:
            raise ValueError(f"'coldot' takes (rows x 2G) operands, got {full}")
        return (full[1] // 2,)
    return full[:-1] if kind == "rowdot" else full


def deal(fed: Federation, kind: str, shape_a, shape_b, *, holders, dealer: int, private: bool = False):
    """SPMD: the dealer draws a Beaver triple and hands out shares; each holder gets its part.

    ``private=False``: both holders get shares of a, b and c (for ``mul_shared``).
    ``private=True``: h_0 gets a and c_0, h_1 gets b and c_1 (for ``mul_private``).
    Returns ``(a_i, b_i, c_i)`` at each holder (``None`` for parts it does not
    get), ``None`` at every other rank.
    """
    h0, h1 = holders
    op = _op(kind)
    out_shape = _out_shape(kind, shape_a, shape_b)
    if fed.rank == dealer:
        s0, s1 = fresh_seed(), fresh_seed()
        g0, g1 = _stream_from(s0), _stream_from(s1)
        if private:
            a = _uniform(g0, shape_a)
            c0 = _uniform(g0, out_shape)
            b = _uniform(g1, shape_b)
            c1 = op(a, b) - c0
        else:
            a0, b0, c0 = _uniform(g0, shape_a), _uniform(g0, shape_b), _uniform(g0, out_shape)
            a1, b1 = _uniform(g1, shape_a), _uniform(g1, shape_b)
            c1 = op(a0 + a1, b0 + b1) - c0
        fed.send(s0, h0)
        fed.send(s1, h1)
        fed.send(c1, h1)
        return None
    if fed.rank == h0:
        g = _stream_from(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu"))
        if private:
            return _uniform(g, shape_a), None, _uniform(g, out_shape)
        return _uniform(g, shape_a), _uniform(g, shape_b), _uniform(g, out_shape)
    if fed.rank == h1:
        g = _stream_from(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu"))
        if private:
            b = _uniform(g, shape_b)
            return None, b, fed.recv(dealer, tuple(out_shape), torch.int64, device="cpu")
        a1, b1 = _uniform(g, shape_a), _uniform(g, shape_b)
        return a1, b1, fed.recv(dealer, tuple(out_shape), torch.int64, device="cpu")
    return None


# ------------------------------------------------------------------ products
def mul_private(fed: Federation, x: torch.Tensor | None, y: torch.Tensor | None, *, holders, dealer: int,
                kind: str = "mul", shape_x=None, shape_y=None, fp: FixedPoint | None = None,
                truncate_result: bool = True) -> torch.Tensor | None:
    """Shares of x * y (``kind="mul"``, broadcasting) or x @ y (``"matmul"``), x held by h_0, y by h_1.

    Every rank of ``holders`` and the dealer calls this (SPMD). h_0 passes ``x``
    and ``shape_y``, h_1 passes ``y`` and ``shape_x``, the dealer both shapes.
    With ``fp`` the inputs are real and encoded, and the product's shares are
    truncated back to ``fp.frac_bits`` (unless ``truncate_result=False``).
    Returns this holder's int64 share (CPU), ``None`` at the dealer.
    """
    h0, h1 = holders
    if fed.rank == h0:
        shape_x = tuple(x.shape)
    if fed.rank == h1:
        shape_y = tuple(y.shape)
    if shape_x is None or shape_y is None:
        raise ValueError("mul_private needs the shape of the operand this rank does not hold")
    op = _op(kind)
    triple = deal(fed, kind, shape_x, shape_y, holders=holders, dealer=dealer, private=True)
    if fed.rank == dealer:
        return None

    def enc(v):
        v = v.cpu()
        return fp.encode(v) if fp is not None else v.to(torch.int64)

    if fed.rank == h0:
        a, _, c0 = triple
        xe = enc(x)
        fed.send(xe - a, h1)
        f = fed.recv(h1, shape_y, torch.int64, device="cpu")
        z = op(a, f) + c0
        index = 0
    else:
        _, b, c1 = triple
        ye = enc(y)
        e = fed.recv(h0, shape_x, torch.int64, device="cpu")
        fed.send(ye - b, h0)
        z = op(e, ye) + c1
        index = 1
    if fp is not None and truncate_result:
        z = truncate(z, index, fp.frac_bits)
    return z


def mul_shared(fed: Federation, x: torch.Tensor | None, y: torch.Tensor | None, *, holders, dealer: int,
               kind: str = "mul", shape_x=None, shape_y=None, frac_bits: int | None = None) -> torch.Tensor | None:
    """Shares of x * y or x @ y where both x and y are shared between the two ``holders``.

    ``x``, ``y`` are this holder's int64 shares; the dealer passes the shapes.
    With ``frac_bits`` the product is truncated by that many bits (both inputs
    in fixed point with ``frac_bits`` fractional bits). Returns the share, or
    ``None`` at the dealer.
    """
    h0, h1 = holders
    if fed.rank in holders:
        shape_x, shape_y = tuple(x.shape), tuple(y.shape)
    op = _op(kind)
    triple = deal(fed, kind, shape_x, shape_y, holders=holders, dealer=dealer, private=False)
    if fed.rank == dealer:
        return None
    a, b, c = triple
    index = 0 if fed.rank == h0 else 1
    other = h1 if index == 0 else h0
    e_mine, f_mine = x.cpu() - a, y.cpu() - b
    theirs = fed.sendrecv(torch.cat([e_mine.reshape(-1), f_mine.reshape(-1)]), other, other).cpu()
    e = e_mine + theirs[: e_mine.numel()].reshape(e_mine.shape)
    f = f_mine + theirs[e_mine.numel():].reshape(f_mine.shape)
    z = op(e, b) + op(a, f) + c
    if index == 0:
        z = z + op(e, f)
    if frac_bits:
        z = truncate(z, index, frac_bits)
    return z


def mul_dealt(fed: Federation, x: torch.Tensor | None, y: torch.Tensor | None, *, holders, dealer: int,
              kind: str = "mul", shape_x=None, shape_y=None, fp: FixedPoint | None = None,
              dealt=None, bits: int = 64) -> torch.Tensor | None:
    """Shares of x * y (``"mul"``), x @ y (``"matmul"``) or row-wise x . y (``"rowdot"``), x held by h_0
    and y known to h_1 *and the dealer*.

    For y that is randomness the dealer handed to h_1 (a mask it dealt): no
    triple is needed for y, and the only data message is e = x - a from h_0 to
    h_1 (uniform, as a is). The dealer sends h_0 one seed (for a) with
    c_0 = op(a, y) - c_1, and h_1 one seed (for c_1); it receives nothing.
    Every rank of ``holders`` and the dealer calls this (SPMD): h_0 passes
    ``x`` and ``shape_y`` (default: x's shape), h_1 and the dealer pass the
    same int64 ring tensor ``y`` and ``shape_x``. With ``fp`` h_0's x is real
    and encoded; the product is *not* truncated (its fractional bits are those
    of x plus those of y), so the shares add up to the exact ring product.
    Returns this holder's int64 share (CPU), ``None`` at the dealer. With
    ``dealt`` (this holder's item from ``deal_dealt``; non-holders pass
    anything but None, e.g. ``True``) the dealing already happened: only
    e crosses the wire, and the dealer does nothing here; ``bits`` below 64
    (with a ``deal_dealt(..., bits=...)`` dealing of the same width) sends e as
    ``bits``-bit words and the shares are meaningful mod 2**bits.
    """
    h0, h1 = holders
    if dealt is not None:
        if fed.rank == h0:
            send_words(fed, dealt_operand(x, dealt, bits, fp), h1, bits)
            return dealt[1]
        if fed.rank == h1:
            return dealt_share(kind, recv_ring_words(fed, h0, shape_x, bits), y, dealt, bits, into_e=True)
        return None                     # the dealer and other ranks
    if bits != 64:
        raise ValueError("mul_dealt: a narrow ring needs the material of deal_dealt(..., bits=...)")
    if fed.rank == h0:
        shape_x = tuple(x.shape)
        shape_y = shape_x if shape_y is None else tuple(shape_y)
    elif fed.rank in (h1, dealer):
        if shape_x is None:
            raise ValueError("mul_dealt needs shape_x at the ranks that do not hold x")
        shape_y = tuple(y.shape)
    else:
        return None
    op = _op(kind)
    out_shape = _out_shape(kind, shape_x, shape_y)
    if fed.rank == dealer:
        s0, s1 = fresh_seed(), fresh_seed()
        a = _uniform(_stream_from(s0), shape_x)
        c1 = _uniform(_stream_from(s1), out_shape)
        c0 = op(a, y.cpu().to(torch.int64)) - c1
        fed.send(torch.cat([s0, c0.reshape(-1)]), h0)
        fed.send(s1, h1)
        return None
    if fed.rank == h0:
        xe = fp.encode(x.cpu()) if fp is not None else x.cpu().to(torch.int64)
        count = math.prod(out_shape)
        msg = fed.recv(dealer, (_SEED_WORDS + count,), torch.int64, device="cpu")
        a = _uniform(_stream_from(msg[:_SEED_WORDS]), shape_x)
        fed.send(xe - a, h1)
        return msg[_SEED_WORDS:].reshape(out_shape)
    c1 = _uniform(_stream_from(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu")), out_shape)
    e = fed.recv(h0, shape_x, torch.int64, device="cpu")
    return op(e, y.cpu().to(torch.int64)) + c1


def dealt_operand(x: torch.Tensor, dealt, bits: int = 64, fp: FixedPoint | None = None) -> torch.Tensor:
    """h_0's message of a dealt product (``mul_dealt`` with ``dealt=(a, c_0)``): e = x - a, ring words.

    For protocols that carry e inside a message of their own (``word_bytes``); h_0's share is c_0."""
    a, _ = dealt
    xe = fp.encode(x.cpu()) if fp is not None else _cpu_as(x, _ring_dtype(bits))
    return xe - a


def dealt_share(kind: str, e: torch.Tensor, y: torch.Tensor, c1: torch.Tensor, bits: int = 64,
                into_e: bool = False) -> torch.Tensor:
    """h_1's share of a dealt product from h_0's e (``dealt_operand``): op(e, y) + c_1. ``into_e``: e is the
    caller's to discard (a received message), and a row or column dot's products overwrite it (``_op``)."""
    return (_over_first(kind, e, _as_ring_operand(y, bits)) if into_e else _op(kind)(e, _word(y, bits))) + c1


def _over_first(kind: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) with a discarded by the caller (a dealer's fresh mask, a received e): a row or column dot writes its
    elementwise products over a where they fit it (b broadcasting to a's shape), which saves a multi-MB temporary
    per product; else it computes as ``_op``. b may be a narrower signed integer than a (the keeper's and dealer's
    int8 cosines against int32 / int16 ring words: the same integers, hence the same ring elements): numpy widens
    it in cache-sized pieces inside the multiplication (torch would need a full-size cast first, and its
    mixed-type product is 10x slower)."""
    if kind not in ("rowdot", "coldot") or not _mul_into(a, b):
        return _op(kind)(a, b)
    return _row_sums(a) if kind == "rowdot" else _pair_column_sums(a)


def _mul_into(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a *= b elementwise in a's ring type where b broadcasts to a's shape (``_over_first``'s products; the dealer's
    batched rounds, ``kernels.shared.deal_rounds``); False, doing nothing, where it cannot."""
    if not (a.dim() >= b.dim() and all(y in (1, x) for x, y in zip(a.shape[::-1], b.shape[::-1]))):
        return False
    if a.dtype == b.dtype:
        a.mul_(b)
    elif _narrower_signed(b.dtype, a.dtype) and a.device.type == b.device.type == "cpu" \
            and a.is_contiguous() and b.is_contiguous():
        an = a.numpy()
        np.multiply(an, b.numpy(), out=an, casting="unsafe")
    else:
        return False
    return True


def _narrower_signed(small: torch.dtype, wide: torch.dtype) -> bool:
    ints = (torch.int8, torch.int16, torch.int32, torch.int64)
    return small in ints and wide in ints and ints.index(small) < ints.index(wide)


def _as_ring_operand(y: torch.Tensor, bits: int) -> torch.Tensor:
    """A known operand for ``_over_first``: as it is where it is a narrower signed integer than the ring's type
    (widened inside the product), else ``_word``."""
    return y if y.device.type == "cpu" and _narrower_signed(y.dtype, _ring_dtype(bits)) else _word(y, bits)


def deal_dealt(fed: Federation, ys, *, holders, dealer: int, kind: str, shapes_x, shapes_y=None, bits=64,
               h1_seed: torch.Tensor | None = None):
    """The dealer's part of several ``mul_dealt`` products at once: one message to each holder.

    SPMD like ``mul_dealt``: the dealer and h_1 pass the list ``ys`` (ring
    tensors they both know), h_0 passes ``shapes_y``. ``kind``: one for all
    products, or one per product. Returns, at h_0, a list
    of ``(a, c_0)`` and, at h_1, a list of ``c_1``; pass item i as
    ``dealt=`` to the i-th ``mul_dealt`` (fewer synchronisations: the material
    of a whole round travels ahead of the data messages). ``bits`` (one width,
    or one per product) below 64: a, c_0 and c_1 are uniform mod 2**32, hence
    mod 2**bits (see *Narrow rings* above); when a width is below 32 the
    corrections c_0 travel packed, each product's to its width. ``h1_seed``: a
    128-bit seed the dealer already gave h_1 (``fresh_seed``, sent with other
    seeds; the dealer and h_1 pass it): c_1 is drawn from it and the dealer
    sends h_1 nothing here (one message fewer).
    """
    h0, h1 = holders
    if fed.rank not in (h0, h1, dealer):
        return None
    shapes_x = [tuple(s) for s in shapes_x]
    kinds = [kind] * len(shapes_x) if isinstance(kind, str) else list(kind)
    shapes_y = [tuple(y.shape) for y in ys] if fed.rank != h0 else [tuple(s) for s in shapes_y]
    outs = [_out_shape(k, sx, sy) for k, sx, sy in zip(kinds, shapes_x, shapes_y)]
    widths = [int(bits)] * len(outs) if isinstance(bits, int) else [int(b) for b in bits]
    for w in widths:
        _check_bits(w)
    packed = min(widths, default=64) < 32           # else int64 words after the seed, as before
    sizes = [math.prod(o) for o in outs]
    if fed.rank == dealer:
        s0, s1 = fresh_seed(), (fresh_seed() if h1_seed is None else h1_seed)
        g0, g1 = _stream_from(s0), _stream_from(s1)
        c0s = []
        for kd, sx, out, y, w in zip(kinds, shapes_x, outs, ys, widths):
            a = _uniform(g0, sx, w)             # (fresh and the dealer's own: the products go over it)
            if packed:          # (the small corrections' difference and packing in numpy: the same words)
                c = _over_first(kd, a, _as_ring_operand(y, w)).numpy() - _uniform(g1, out, w).numpy()  # (ring wraps)
                c0s.append(_pack_np(c.reshape(-1), w) if w < 32 else c.reshape(-1).view(np.uint8))
            else:
                c = _over_first(kd, a, _word(y, w)) - _uniform(g1, out, w)
                c0s.append(from_ring(c, w).to(torch.int64).reshape(-1))
        if packed:                              # the seed's 16 bytes, then each product's corrections packed
            fed.send(torch.from_numpy(np.concatenate([s0.numpy().view(np.uint8), *c0s])), h0)
        else:
            fed.send(torch.cat([s0, *c0s]), h0)
        if h1_seed is None:
            fed.send(s1, h1)
        return None
    if fed.rank == h0:
        if packed:
            lengths = [wire_bytes(n, w) for n, w in zip(sizes, widths)]
            # The message read in numpy (the seed's words, then each product's corrections): one torch call each.
            raw = fed.recv(dealer, (8 * _SEED_WORDS + sum(lengths),), torch.uint8, device="cpu").numpy()
            seed, at, c0s = raw[:8 * _SEED_WORDS].view(np.int64), 8 * _SEED_WORDS, []
            for n, w, length, out in zip(sizes, widths, lengths, outs):
                part = raw[at:at + length]
                c0s.append(torch.from_numpy(part.view(np.int32).reshape(out) if w == 32 else
                                            _unpack_np(part, n, w).reshape(out)))
                at += length
            g0 = _stream_from(seed)
            return [(_uniform(g0, sx, w), c0) for sx, w, c0 in zip(shapes_x, widths, c0s)]
        else:
            msg = fed.recv(dealer, (_SEED_WORDS + sum(sizes),), torch.int64, device="cpu")
            seed, c0s, at = msg[:_SEED_WORDS], [], _SEED_WORDS
            for n in sizes:
                c0s.append(msg[at:at + n])
                at += n
        g0 = _stream_from(seed)
        return [(_uniform(g0, sx, w), c0.reshape(out)) for sx, out, w, c0 in zip(shapes_x, outs, widths, c0s)]
    g1 = _stream_from(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu") if h1_seed is None else h1_seed)
    return [_uniform(g1, out, w) for out, w in zip(outs, widths)]


# ------------------------------------------------------------------ ring products through float64 BLAS
_LIMB_ROWS = 2 ** 21      # a sum of this many 16-bit x 16-bit limb products stays below 2**53 (exact in float64)


def ring_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b mod 2**64 for int64 (ring) matrices, exact, through float64 BLAS on 16-bit limbs.

    ``torch`` multiplies int64 matrices without BLAS (n x 256 by 256 columns: ~3 s on a loaded
    core); here each operand is cut into four unsigned 16-bit limbs, the ten limb products that
    reach below bit 64 are float64 matmuls (exact while the inner dimension is below 2**21), and
    the shifted partial sums wrap in int64. Other shapes fall back to ``torch.matmul``.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] >= _LIMB_ROWS or a.dtype != torch.int64 or b.dtype != torch.int64:
        return torch.matmul(a, b)
    la = [((a >> (16 * i)) & 0xFFFF).to(torch.float64) for i in range(4)]
    lb = [((b >> (16 * i)) & 0xFFFF).to(torch.float64) for i in range(4)]
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.int64, device=a.device)
    for i in range(4):
        for j in range(4 - i):
            out += (la[i] @ lb[j]).to(torch.int64) << (16 * (i + j))
    return out


# ------------------------------------------------------------------ one opening per party
def cross_products(fed: Federation, x: torch.Tensor | None, *, parties, dealer: int, widths, rows: int,
                   fp: FixedPoint | None = None) -> dict | None:
    """Shares of every cross product X_i^T X_j (i before j in ``parties``), each party opening its X_i once.

    Party i holds X_i (``rows`` x ``widths[i]``). The dealer draws a uniform
    ring mask A_i per party (from a seed it sends to party i only) and, per pair
    (i, j), additive shares of A_i^T A_j (j gets a seed, i the explicit
    c_i = A_i^T A_j - c_j). Every party sends E_i = X_i - A_i (uniform) once
    to every other data party, never to the dealer. Then

        X_i^T X_j = E_i^T E_j + A_i^T E_j + E_i^T A_j + A_i^T A_j
        z_i = X_i^T E_j + c_i        (i knows X_i = E_i + A_i and received E_j)
        z_j = E_i^T A_j + c_j        (j knows A_j and received E_i)

    and z_i + z_j = X_i^T X_j with no further message. Traffic: (Q - 1) rows
    sum_i widths[i] ring elements (each party's columns once to each other
    party; a pairwise ``mul_private`` sends both operands per pair), plus the
    dealer's sum over pairs of widths[i] widths[j] and four seed words per party.

    What each learns (semi-honest, a dealer colluding with nobody): a party,
    the others' E_j (uniform: A_j is known to the dealer and j only) and its
    shares (uniform: c_j from a seed it does not know, or A_i^T A_j - c_j with
    A_j unknown); parties colluding without the dealer, nothing more (they see
    the same E_j, masked by the same unknown A_j). The dealer receives nothing.
    The dealer together with any party unmasks every E_j that party received.

    SPMD: every rank of ``parties`` and the dealer calls it. ``x`` is real
    (encoded with ``fp``; the products then carry 2 * fp.frac_bits fractional
    bits, *not* truncated) or ring (``fp=None``). Returns, at a party, a dict
    {(i, j): its int64 share of X_i^T X_j (widths[i] x widths[j])} over the
    pairs it belongs to; ``None`` at the dealer and elsewhere.
    """
    parties = list(parties)
    widths = [int(w) for w in widths]
    q = len(parties)
    pairs = [(parties[a], parties[b]) for a in range(q) for b in range(a + 1, q)]
    width = dict(zip(parties, widths))
    if fed.rank == dealer:
        seeds = {p: (fresh_seed(), fresh_seed()) for p in parties}
        masks = {p: _uniform(_stream_from(seeds[p][0]), (rows, width[p])) for p in parties}
        second = {p: _stream_from(seeds[p][1]) for p in parties}
        explicit = {p: [] for p in parties}
        for i, j in pairs:                      # j draws its c_j in this order from its second seed
            c_j = _uniform(second[j], (width[i], width[j]))
            explicit[i].append((ring_matmul(masks[i].T, masks[j]) - c_j).reshape(-1))
        del masks
        for p in parties:
            fed.send(torch.cat([*seeds[p], *explicit[p]]), p)
        return None
    if fed.rank not in parties:
        return None
    me, w = fed.rank, width[fed.rank]
    firsts = [(i, j) for i, j in pairs if i == me]
    count = 2 * _SEED_WORDS + sum(w * width[j] for _, j in firsts)
    msg = fed.recv(dealer, (count,), torch.int64, device="cpu")
    A = _uniform(_stream_from(msg[:_SEED_WORDS]), (rows, w))
    second = _stream_from(msg[_SEED_WORDS:2 * _SEED_WORDS])
    xe = fp.encode(x.cpu()) if fp is not None else x.cpu().to(torch.int64)
    E = xe - A
    # Every party's E to every other party, one recipient at a time in the same order everywhere.
    received = {}
    for r in parties:
        if r == me:
            for p in parties:
                if p != me:
                    received[p] = fed.recv(p, (rows, width[p]), torch.int64, device="cpu")
        else:
            fed.send(E, r)
    del E
    shares, at = {}, 2 * _SEED_WORDS
    for i, j in pairs:
        if i == me:
            size = w * width[j]
            shares[(i, j)] = ring_matmul(xe.T, received[j]) + msg[at:at + size].reshape(w, width[j])
            at += size
        elif j == me:
            shares[(i, j)] = ring_matmul(received[i].T, A) + _uniform(second, (width[i], w))
    return shares


def holder_gram(fed: Federation, x: torch.Tensor | None, *, parties, dealer: int, widths, rows: int,
                fp: FixedPoint | None = None) -> torch.Tensor | None:
    """Shares at two holders of the whole Gram matrix X^T X of X = [X_1, ..., X_Q], each party's columns opened once.

    The holders are h0 = parties[0] and h1 = parties[1]; every other party o
    secret-shares its columns between them: the dealer sends o and h1 a seed of
    a uniform R_o, and o sends E_o = X_o - R_o to h0 only (uniform to h0). So
    X = S0 + S1 (columns in the pooled order) with S0 = [X_h0 | 0 | E_o ...] at
    h0 and S1 = [0 | X_h1 | R_o ...] at h1, and

        X^T X = S0^T S0 (h0, locally) + S1^T S1 (h1, locally) + S0^T S1 + (S0^T S1)^T.

    The cross term as in ``cross_products`` with one opening each way: the
    dealer gives h0 a mask A (seed) and h1 a mask B (seed) for X_h1, h0 sends
    F0 = S0 - A to h1, h1 sends G1 = X_h1 - B to h0, and with the dealer's
    shares c0 + c1 = A^T [B | R] (it knows A, B and R):

        z1 = F0^T S1 + c1          z0 = [A^T G1 | 0] + c0          z0 + z1 = S0^T S1.

    Traffic: rows x (d + sum of the other parties' widths) ring elements (each
    party's columns once to h0, h0's masked S0 once to h1, h1's masked own
    columns once to h0), against (Q - 1) rows d for ``cross_products``; the
    dealer sends the d0 x d1 explicit c0 and seeds. With ``fp``, each diagonal
    block X_l^T X_l enters as the float product encoded at 2F bits (a holder
    corrects its own block locally; another party sends h0 its correction
    masked by a tensor h1 draws from the same seed as R_l: f_l^2 words), so
    the result is as exact as with the parties' own blocks in floating point.

    What each learns (semi-honest): h0: E_o (uniform: R_o unknown to it), G1
    (uniform: B), c0 (uniform: c1 from a seed it lacks); h1: F0 = S0 - A
    (uniform: A is the dealer's), its seeds; the other parties: one seed each;
    the dealer: nothing (it receives nothing). Collusions: **h0 with h1** gets
    every other party's columns (E_o + R_o): the two holders must not collude
    (``cross_products`` resists any coalition of data parties without the
    dealer); the dealer with h0 unmasks E_o (R_o) and G1 (B), with h1 unmasks F0
    (A). SPMD: every rank of ``parties`` and the dealer calls it. ``x`` real
    (encoded with ``fp``: the Gram matrix then carries 2 * fp.frac_bits
    fractional bits, not truncated) or ring. Returns this holder's int64 d x d
    share, ``None`` elsewhere.
    """
    parties = list(parties)
    widths = [int(w) for w in widths]
    h0, h1 = parties[0], parties[1]
    others = parties[2:]
    width = dict(zip(parties, widths))
    offsets, at = {}, 0
    for p in parties:
        offsets[p] = range(at, at + width[p])
        at += width[p]
    d = at
    cols0 = [c for p in [h0, *others] for c in offsets[p]]          # S0's columns in the pooled order
    cols1 = [c for p in [h1, *others] for c in offsets[p]]
    d0, d1, w_o = len(cols0), len(cols1), sum(width[o] for o in others)
    if fed.rank == dealer:
        r_seeds = {o: fresh_seed() for o in others}
        a_seed, b_seed, c_seed = fresh_seed(), fresh_seed(), fresh_seed()
        for o in others:
            fed.send(r_seeds[o], o)
        A = _uniform(_stream_from(a_seed), (rows, d0))
        T = ring_matmul(A.T, torch.cat([_uniform(_stream_from(b_seed), (rows, width[h1]))]
                                       + [_uniform(_stream_from(r_seeds[o]), (rows, width[o])) for o in others], 1))
        del A
        c0 = T - _uniform(_stream_from(c_seed), (d0, d1))
        fed.send(torch.cat([a_seed, c0.reshape(-1)]), h0)
        fed.send(torch.cat([b_seed, c_seed, *(r_seeds[o] for o in others)]), h1)
        return None
    if fed.rank not in parties:
        return None
    me = fed.rank
    xe = fp.encode(x.cpu()) if fp is not None else x.cpu().to(torch.int64)
    # With real inputs each party's own diagonal block enters as its float product encoded at 2F bits (as the
    # products of unrounded columns), not as the product of its rounded columns: the correction below.
    delta = None
    if fp is not None:
        delta = FixedPoint(2 * fp.frac_bits).encode(x.cpu().to(torch.float64).T @ x.cpu().to(torch.float64))
        delta -= ring_matmul(xe.T, xe)
    if me in others:
        stream = _stream_from(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu"))
        R = _uniform(stream, (rows, width[me]))
        fed.send(xe - R, h0)
        if delta is not None:       # shared between the holders: T (from R's stream, h1) and delta - T (to h0)
            fed.send(delta - _uniform(stream, (width[me], width[me])), h0)
        return None
    if me == h0:
        msg = fed.recv(dealer, (_SEED_WORDS + d0 * d1,), torch.int64, device="cpu")
        A = _uniform(_stream_from(msg[:_SEED_WORDS]), (rows, d0))
        c0 = msg[_SEED_WORDS:].reshape(d0, d1)
        parts, corrections = [xe], []
        for o in others:
            parts.append(fed.recv(o, (rows, width[o]), torch.int64, device="cpu"))
            if fp is not None:
                corrections.append(fed.recv(o, (width[o], width[o]), torch.int64, device="cpu"))
        S0 = torch.cat(parts, 1)
        del parts
        fed.send(S0 - A, h1)
        G1 = fed.recv(h1, (rows, width[h1]), torch.int64, device="cpu")
        z = c0.clone()
        z[:, :width[h1]] += ring_matmul(A.T, G1)
        own, rows_idx = S0, cols0
        del A, G1
    else:
        msg = fed.recv(dealer, ((2 + len(others)) * _SEED_WORDS,), torch.int64, device="cpu")
        seeds = msg.reshape(-1, _SEED_WORDS)
        B = _uniform(_stream_from(seeds[0]), (rows, width[h1]))
        streams = [_stream_from(seeds[2 + k]) for k in range(len(others))]
        S1 = torch.cat([xe] + [_uniform(st, (rows, width[o])) for st, o in zip(streams, others)], 1)
        corrections = [_uniform(st, (width[o], width[o])) for st, o in zip(streams, others)] if fp is not None else []
        F0 = fed.recv(h0, (rows, d0), torch.int64, device="cpu")
        fed.send(xe - B, h0)
        z = ring_matmul(F0.T, S1) + _uniform(_stream_from(seeds[1]), (d0, d1))
        own, rows_idx = S1, cols1
        del B, F0
    share = torch.zeros(d, d, dtype=torch.int64)
    idx = torch.tensor(rows_idx)
    share[idx[:, None], idx[None, :]] += ring_matmul(own.T, own)
    if delta is not None:
        for p, c in [(me, delta), *zip(others, corrections)]:
            block = torch.tensor(offsets[p])
            share[block[:, None], block[None, :]] += c
    i0, i1 = torch.tensor(cols0), torch.tensor(cols1)
    share[i0[:, None], i1[None, :]] += z
    share[i1[:, None], i0[None, :]] += z.T
    return share


def rerandomise(fed: Federation, mine: torch.Tensor | None, *, pair) -> torch.Tensor | None:
    """The two ranks of ``pair`` add and subtract the same uniform ring tensor; others return ``mine`` unchanged.

    The sum of all shares stays the same, and the first rank's share becomes
    uniform to everyone but the second (which never sees it). Needed before
    the other shares are summed at a third party: a share that is zero in
    places would leave the value itself there. The first rank draws a
    128-bit seed from the OS and sends it to the second only.
    """
    a, b = pair
    if fed.rank == a:
        seed = fresh_seed()
        fed.send(seed, b)
        return mine + _uniform(_stream_from(seed), mine.shape)
    if fed.rank == b:
        seed = fed.recv(a, (_SEED_WORDS,), torch.int64, device="cpu")
        return mine - _uniform(_stream_from(seed), mine.shape)
    return mine


# ------------------------------------------------------------------ a public rotation of shared matrices
# Z_2^128 as two uint64 words (hi, lo), numpy arrays of one shape: vectorised, and products through float64 BLAS.
_U64 = np.uint64


def _add128(x, y):
    lo = x[1] + y[1]                                    # uint64 arithmetic wraps mod 2**64
    return x[0] + y[0] + (lo < x[1]).astype(_U64), lo


def _neg128(x):
    return _add128((~x[0], ~x[1]), (np.zeros_like(x[0]), np.ones_like(x[1])))


def _shr128(x, bits: int):
    """Arithmetic right shift of signed 128-bit values by 0 < bits < 64."""
    lo = (x[1] >> _U64(bits)) | (x[0] << _U64(64 - bits))
    return (x[0].view(np.int64) >> bits).view(_U64), lo


def _truncate128(x, index: int, bits: int):
    """Two-holder truncation (as ``truncate``) on Z_2^128: fails with probability ~|value| 2**-127."""
    if index == 0:
        return _shr128(x, bits)
    return _neg128(_shr128(_neg128(x), bits))


def _matmul128(L: np.ndarray, x):
    """L @ x mod 2**128 for a signed int64 matrix L with |L| < 2**47 and x in Z_2^128.

    16-bit limbs: x has 8, L 3 (the top one signed); a limb product summed over
    d < 2**19 terms stays below 2**53, exact in float64 (BLAS). The result's
    limbs are summed per weight, carried in int64 and packed back into words.
    """
    limbs_x = [((x[0] if b >= 4 else x[1]) >> _U64(16 * (b % 4)) & _U64(0xFFFF)).astype(np.float64)
               for b in range(8)]
    limbs_l = [(L & 0xFFFF).astype(np.float64), ((L >> 16) & 0xFFFF).astype(np.float64),
               (L >> 32).astype(np.float64)]
    out, carry = [], 0
    for c in range(8):
        acc = sum(limbs_l[a] @ limbs_x[c - a] for a in range(3) if 0 <= c - a < 8)
        v = acc.astype(np.int64) + carry
        out.append((v & 0xFFFF).astype(_U64))
        carry = v >> 16
    lo = out[0] | out[1] << _U64(16) | out[2] << _U64(32) | out[3] << _U64(48)
    hi = out[4] | out[5] << _U64(16) | out[6] << _U64(32) | out[7] << _U64(48)
    return hi, lo


def rotate_shares(fed: Federation, mine: torch.Tensor | None, rotation: torch.Tensor | None, *, holders,
                  dealer: int, frac_in: int, frac_out: int = 40, rotation_bits: int = 40,
                  shape=None) -> torch.Tensor | None:
    """Two-holder shares of R V R^T (``frac_out`` fractional bits) from shares of V (``frac_in`` bits).

    R is a real d x d matrix both holders know (a secret rotation), V a d x d
    matrix with |V_ab| <= 1 and column norms <= 1, ||R||_2 <= 1 (so every
    intermediate entry is at most 1 in value). Multiplying ring shares by an
    encoded R costs ``rotation_bits`` per side, more than Z_2^64 holds next to
    V's bits, so the shares are first lifted to Z_2^128:

    1. h_0 adds 2**62 to its share, so v' = v + 2**62 lies in [0, 2**63) and
       u_0 + u_1 = v' + 2**64 w over the integers (u_h unsigned). Because
       v' < 2**63, the wrap w is 1 exactly when either top bit is set:
       w = a + b - a b with a, b the holders' top bits.
    2. a b: one ``mul_private`` of the two bit tensors (the dealer deals; the
       holders exchange one uniform d x d message each), shares s_0 + s_1 = a b.
    3. Z_h = u_h - 2**64 (bit_h - s_h) (- 2**62 at h_0) mod 2**128: Z_0 + Z_1 = v.
    4. In Z_2^128 two-holder truncation fails with probability ~|value| 2**-127
       per entry (2**-46 here, against ~2**-3 for V's 60 bits in Z_2^64): drop
       to ``frac_out`` bits, multiply by round(R 2**rotation_bits) on the left,
       truncate, on the right, truncate, and reduce mod 2**64.

    Each truncation is off by at most one unit. A holder sees a uniform
    d x d message; the dealer receives nothing. Returns this holder's int64
    share (CPU), ``None`` at the dealer, which passes ``shape`` (d, d).
    """
    h0, h1 = holders
    if fed.rank not in (h0, h1, dealer):
        return None
    if fed.rank == dealer:
        mul_private(fed, None, None, holders=holders, dealer=dealer, kind="mul", shape_x=tuple(shape),
                    shape_y=tuple(shape))
        return None
    shape = tuple(mine.shape)
    index = 0 if fed.rank == h0 else 1
    u = mine.cpu().numpy().astype(np.int64).view(_U64)
    if index == 0:
        u = u + _U64(1 << 62)
    bit = (u >> _U64(63)).astype(np.int64)
    s = mul_private(fed, torch.from_numpy(bit) if index == 0 else None, torch.from_numpy(bit) if index == 1 else None,
                    holders=holders, dealer=dealer, kind="mul", shape_x=shape, shape_y=shape)
    z = (s.numpy().view(_U64) - bit.view(_U64), u)             # u + 2**64 (s - bit)
    if index == 0:
        z = _add128(z, (np.full(shape, 2 ** 64 - 1, dtype=_U64), np.full(shape, 2 ** 64 - 2 ** 62, dtype=_U64)))
    z = _truncate128(z, index, frac_in - frac_out)
    L = np.round(rotation.cpu().double().numpy() * 2.0 ** rotation_bits).astype(np.int64)
    z = _truncate128(_matmul128(L, z), index, rotation_bits)
    z = _truncate128(tuple(w.T.copy() for w in _matmul128(L, (z[0].T.copy(), z[1].T.copy()))), index,
                     rotation_bits)
    return torch.from_numpy(z[1].view(np.int64).copy())
