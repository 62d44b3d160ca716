"""Masked sums (FDSKL Algorithm 3) on two groups: phases mod 2*pi and a fixed-point ring.

Each party adds a mask drawn from its own seeded stream to its part; the
masked parts are summed over a tree T1; the masks of every party but one
(``keep``) are summed over a *totally different* tree T2 and subtracted. The
output party receives ``sum of parts + mask of keep``: the kept mask hides the
result itself (FDSKL uses it as the random phase b of a Fourier feature). With
``reveal=True`` the kept party also hands over its mask and the output party
gets the exact sum (secure aggregation).

Masks are uniform on the group their values live in, so each masked value is
exactly uniform and reveals nothing on its own:

* ``PhaseGroup``: [0, 2*pi) with addition mod 2*pi. cos is 2*pi-periodic, so
  random-feature projections may be reduced mod 2*pi before they leave a party.
* ``RingGroup``: int64 with wrap-around addition, i.e. Z / 2**64. Real values
  enter as fixed-point integers (``FixedPoint``); a uniform 64-bit mask makes
  the masked integer uniform. Overflow of the encoding raises instead of
  wrapping silently.
"""

from __future__ import annotations

import hashlib
import math
import secrets

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .federation import Federation
from .reduce import allreduce, broadcast, reduce
from .topology import pairwise_tree, totally_different_trees

TWO_PI = 2.0 * math.pi


class PhaseGroup:
    """Real numbers mod 2*pi, as float64."""

    dtype = torch.float64

    @staticmethod
    def reduce(x: torch.Tensor) -> torch.Tensor:
        return torch.remainder(x.to(torch.float64), TWO_PI)

    def add(self, a, b):
        return torch.remainder(a + b, TWO_PI)

    def sub(self, a, b):
        return torch.remainder(a - b, TWO_PI)

    def random(self, shape, stream: "MaskStream", device) -> torch.Tensor:
        # float64 uniform on [0, 1) scaled: 53 random bits per mask (the top bits of a word).
        shape = tuple(int(s) for s in shape)
        count = int(np.prod(shape)) if shape else 1
        unit = (stream.words(count) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return torch.from_numpy(unit.reshape(shape)).to(device) * TWO_PI


class RingGroup:
    """Z / 2**64 as int64 with wrap-around (two's complement) arithmetic."""

    dtype = torch.int64

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def random(self, shape, stream: "MaskStream", device) -> torch.Tensor:
        # The stream's 64-bit words are uniform words.
        shape = tuple(int(s) for s in shape)
        count = int(np.prod(shape)) if shape else 1
        words = stream.words(count).view(np.int64).reshape(shape)
        return torch.from_numpy(words).to(device)


class FixedPoint:
    """Real values as int64 with ``frac_bits`` fractional bits, for sums of ``summands`` parts.

    The sum is exact in the ring as long as its magnitude stays below
    2**(63 - frac_bits); ``encode`` checks that every part is small enough for
    ``summands`` of them to fit and raises ``OverflowError`` otherwise.
    """

    def __init__(self, frac_bits: int = 24, summands: int = 1):
        if not 0 <= frac_bits <= 62:
            raise ValueError(f"frac_bits must be in [0, 62], got {frac_bits}")
        self.frac_bits = frac_bits
        self.summands = max(1, int(summands))
        self.scale = float(2 ** frac_bits)
        self.bound = 2.0 ** (63 - frac_bits) / self.summands

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        if not torch.isfinite(x).all():
            raise ValueError("cannot encode NaN or inf as fixed point")
        peak = float(x.abs().max()) if x.numel() else 0.0
        if peak >= self.bound:
            raise OverflowError(
                f"fixed-point overflow: |value| up to {peak:.4g}, but with {self.frac_bits} fractional bits "
                f"and {self.summands} summands each part must stay below {self.bound:.4g}. "
                f"Scale the values down or use fewer fractional bits.")
        return torch.round(x * self.scale).to(torch.int64)

    def decode(self, v: torch.Tensor) -> torch.Tensor:
        return v.to(torch.float64) / self.scale


class MaskStream:
    """A party's private stream of uniform masks: the one mask stream type of the toolkit.

    The stream is the keystream of AES-128 in counter mode (OpenSSL, through the
    maintained ``cryptography`` package) under a 128-bit key: a cryptographic
    generator, so no number of masks a peer sees (or removes, knowing the data)
    predicts the others. A statistical generator such as PCG64 is not one: its
    state can be recovered from its outputs. With AES-NI the keystream also costs
    less than PCG64's raw words (0.5 against 1.5 ms for 3.2 MB here; masks are
    the hot path of FDSKL and of secret sharing). ``private`` keys it with 128 bits
    of OS entropy: the only constructor for real runs; ``from_entropy`` with a
    128-bit seed a dealer drew from the OS and sent to the holders. ``MaskStream(seed,
    rank)`` is the reproducible *simulation* stream: whoever knows ``seed`` can
    remove the masks, so outputs of a run that uses it carry no privacy
    guarantee. ``draw(group, shape)`` returns a uniform element of ``group``
    (``RingGroup``, ``PhaseGroup``, ``vfltorch.kernels.Circle``); ``bytes`` and
    ``words`` the raw stream. A stream is never pickled (its key is a secret).
    """

    __slots__ = ("_keystream",)

    def __init__(self, seed: int, rank: int):
        # The simulation stream's key: SHA-256 of (seed, rank), one stream per party.
        digest = hashlib.sha256(b"vfltorch/MaskStream/simulation/%d/%d" % (int(seed), int(rank))).digest()
        self._start(digest[:16])

    @classmethod
    def from_entropy(cls, entropy: int) -> "MaskStream":
        """A stream keyed with ``entropy`` (an integer of up to 128 bits, e.g. from a dealer's seed)."""
        stream = cls.__new__(cls)
        stream._start((int(entropy) % (2 ** 128)).to_bytes(16, "little"))
        return stream

    @classmethod
    def private(cls, rank: int | None = None) -> "MaskStream":
        """A stream keyed with 128 bits of the operating system's entropy: known to this party only."""
        return cls.from_entropy(secrets.randbits(128))

    def _start(self, key: bytes) -> None:
        # Each key starts one stream at counter 0 (keys are fresh OS entropy, or the simulation's own).
        self._keystream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def bytes(self, count: int) -> np.ndarray:
        """The stream's next ``count`` bytes (uint8): uniform and independent."""
        count = int(count)
        out = np.empty(count + _AES_BLOCK - 1, dtype=np.uint8)   # (update_into's room for a block)
        for at in range(0, count, _CHUNK):
            n = min(_CHUNK, count - at)
            self._keystream.update_into(_ZEROS[:n], out[at:at + n + _AES_BLOCK - 1])
        return out[:count]

    def fill(self, out: np.ndarray, count: int) -> None:
        """Write the stream's next ``count`` bytes (the same as ``bytes(count)``) into ``out[:count]``: a contiguous
        uint8 array with ``_AES_BLOCK - 1`` bytes of room after them (``update_into`` asks for it; what it may
        write there is the caller's to overwrite). For callers that lay several streams' bytes side by side."""
        count = int(count)
        if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous or out.size < count + _AES_BLOCK - 1:
            raise ValueError("MaskStream.fill: a contiguous uint8 vector with room for count + 15 bytes")
        for at in range(0, count, _CHUNK):
            n = min(_CHUNK, count - at)
            self._keystream.update_into(_ZEROS[:n], out[at:at + n + _AES_BLOCK - 1])

    def words(self, count: int) -> np.ndarray:
        """The stream's next ``count`` 64-bit words (uint64)."""
        return self.bytes(8 * int(count)).view(np.uint64)

    def draw(self, group, shape, device="cpu") -> torch.Tensor:
        return group.random(tuple(shape), self, device)

    def __reduce__(self):
        raise TypeError("a MaskStream is never pickled: its key is a secret (draw a fresh one where it is needed)")


_AES_BLOCK = 16
_CHUNK = 1 << 22                        # keystream made in chunks of 4 MiB (encrypting these zeros)
_ZEROS = memoryview(bytes(_CHUNK))


def derived_key(seed, label: bytes) -> bytes:
    """A 128-bit key for one purpose of a shared secret seed: SHA-256 of (label, seed), cut to 16 bytes. ``seed``: a
    tensor of int64 words (``comm.sharing.fresh_seed``) or an int of up to 128 bits. Streams of different labels
    from one seed are independent, so one seed between two parties keys all the masks they share."""
    if isinstance(seed, torch.Tensor):
        raw = b"".join((int(w) % (2 ** 64)).to_bytes(8, "little") for w in seed.reshape(-1).tolist())
    else:
        raw = (int(seed) % (2 ** 128)).to_bytes(16, "little")
    return hashlib.sha256(b"vfltorch/derived_key/" + label + b"/" + raw).digest()[:16]


class RowMasks:
    """Uniform Z_2^64 words addressed by row: row i's ``width`` words are the AES-128-CTR keystream from counter
    i * (blocks per row), so whoever holds the key draws any rows, in any order, as often as it likes, and always
    the same words. For masks that belong to a training row for the whole run (FDSKL's sealed protocol masks each
    row's features once and then meets the row again every epoch): drawn again at each visit instead of stored.
    Never pickled (the key is a secret)."""

    __slots__ = ("_key", "width", "_blocks", "_steps", "_scratch")

    def __init__(self, key: bytes, width: int):
        if len(key) != 16:
            raise ValueError("RowMasks: a 128-bit key")
        self._key, self.width = bytes(key), int(width)
        self._blocks = -(-8 * self.width // _AES_BLOCK)          # whole AES blocks per row
        self._steps = np.arange(self._blocks, dtype=np.uint64)
        self._scratch = np.zeros((0, 2), dtype=">u8")

    def _counters(self, rows: int) -> np.ndarray:
        """The counter blocks of ``rows`` rows (big-endian, high words 0): a buffer kept between calls (a fresh one
        costs its page faults, as much as the encryption)."""
        need = rows * self._blocks
        if self._scratch.shape[0] < need:
            self._scratch = np.zeros((need, 2), dtype=">u8")
        return self._scratch[:need]

    def rows(self, index) -> torch.Tensor:
        """The masks of rows ``index`` (a sequence or LongTensor of row numbers): int64, len(index) x width."""
        index = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64).reshape(-1)
        if index.size and int(index.min()) < 0:
            raise ValueError("RowMasks: row numbers are >= 0")
        per_row = self._blocks * _AES_BLOCK
        size = index.size * per_row
        flat = np.empty(size + _AES_BLOCK - 1, dtype=np.uint8)                  # (update_into's room)
        if index.size and int(index[-1]) - int(index[0]) == index.size - 1 and bool((np.diff(index) == 1).all()):
            # consecutive rows (the setup): one CTR keystream from the first row's counter
            counter = (int(index[0]) * self._blocks).to_bytes(16, "big")
            enc, data = Cipher(algorithms.AES(self._key), modes.CTR(counter)).encryptor(), _ZEROS
            step = _CHUNK
        else:
            # scattered rows (a batch): the CTR keystream is AES of the counter blocks, so all the rows' counters are
            # encrypted in one ECB call (one cipher context per batch, not one per row at 10 us each)
            counters = self._counters(index.size)
            np.add(index.astype(np.uint64)[:, None] * np.uint64(self._blocks), self._steps,
                   out=counters[:, 1].reshape(index.size, self._blocks))
            enc = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
            data, step = memoryview(counters.reshape(-1).view(np.uint8)), max(size, 1)
        for start in range(0, size, step):
            n = min(step, size - start)
            enc.update_into(data[:n] if data is _ZEROS else data[start:start + n],
                            flat[start:start + n + _AES_BLOCK - 1])
        out = flat[:size].reshape(index.size, per_row)
        if per_row != 8 * self.width:
            out = out[:, :8 * self.width].copy()
        return torch.from_numpy(out.view(np.int64))

    def __reduce__(self):
        raise TypeError("RowMasks are never pickled: their key is a secret")


def masked_sum(fed: Federation, value: torch.Tensor, *, keep: int, out: int, stream: MaskStream,
               group=None, reveal: bool = False, parties=None) -> torch.Tensor | None:
    """FDSKL Algorithm 3 on the parties (default: the data parties); ``out`` gets the result.

    ``value`` must already be in the group (float64 phases in [0, 2*pi), or
    int64 ring elements). Returns ``sum(values) + mask_of(keep)`` at ``out``
    (or the exact sum with ``reveal``), ``None`` at the other parties.
    """
    group = PhaseGroup() if group is None else group
    parties = fed.parties if parties is None else list(parties)
    if fed.rank not in parties:
        return None
    t1, t2 = totally_different_trees(parties, keep)
    mask = stream.draw(group, value.shape, value.device)
    with fed.phase(f"{fed.current_phase}/masked-sum"):
        if t1.root != out and fed.rank == out:
            # T1's total is the next message from its root (which sends nothing in either reduce): its receive is
            # posted before this rank's own sends, so the total leaves the root at once (``Federation.post_recv``).
            fed.post_recv(t1.root, value.shape, group.dtype)
        # Line 2: sum of masked parts over T1 (ends at T1's root, which is `keep`).
        total = reduce(fed, group.add(value.to(group.dtype), mask), t1, add=group.add)
        # Line 3: sum of every mask but keep's over T2.
        masks = reduce(fed, mask, t2, add=group.add) if t2 is not None and fed.rank != keep else None
        shape, dtype = value.shape, group.dtype
        if t1.root != out:
            if fed.rank == t1.root:
                fed.send(total, out)
            elif fed.rank == out:
                total = fed.recv(t1.root, shape, dtype, device=value.device)
        if t2 is not None and t2.root != out:
            if fed.rank == t2.root:
                fed.send(masks, out)
            elif fed.rank == out:
                masks = fed.recv(t2.root, shape, dtype, device=value.device)
        if reveal and keep != out:
            if fed.rank == keep:
                fed.send(mask, out)
            elif fed.rank == out:
                mask = fed.recv(keep, shape, dtype, device=value.device)
    if fed.rank != out:
        return None
    # Line 4: remove the other masks; keep's mask stays unless revealed.
    result = total if t2 is None else group.sub(total, masks)
    return group.sub(result, mask) if reveal else result


def secure_sum(fed: Federation, value: torch.Tensor, *, out: int, stream: MaskStream | None = None,
               frac_bits: int | None = None, parties=None) -> torch.Tensor | None:
    """Exact sum of real-valued parts at ``out`` through ring masks; no other party learns anything.

    With ``frac_bits=None`` the parties first agree on a power-of-two scale
    (the largest binary exponent of any part, by a max-reduction: it reveals
    the order of magnitude of the largest part, nothing else), so values of
    any size fit the ring with about 2**-50 relative precision. The kept party
    is the one after ``out`` in the party order, so the result is only
    unmasked at ``out``. ``stream`` defaults to a private one from the OS:
    ring masks cancel exactly, so the result never depends on them, and a
    stream seeded from a public seed would let ``out`` remove them.
    """
    parties = fed.parties if parties is None else list(parties)
    stream = MaskStream.private(fed.rank) if stream is None else stream
    if frac_bits is None:
        peak = float(value.abs().max()) if value.numel() else 0.0
        exponent = torch.tensor([math.frexp(peak)[1] if peak > 0 else -1000], dtype=torch.int64)
        exponent = int(allreduce(fed, exponent, "tree", add=torch.maximum, parties=parties))
        scale = 2.0 ** exponent
        frac_bits = 58 - math.ceil(math.log2(len(parties)))
    else:
        scale = 1.0
    fp = FixedPoint(frac_bits, summands=len(parties))
    keep = parties[(parties.index(out) + 1) % len(parties)]
    total = masked_sum(fed, fp.encode(value.to(torch.float64) / scale), keep=keep, out=out, stream=stream,
                       group=RingGroup(), reveal=True, parties=parties)
    return None if total is None else (fp.decode(total) * scale).to(value.dtype)


def secure_allreduce(fed: Federation, value: torch.Tensor, *, parties=None, root: int | None = None,
                     stream: MaskStream | None = None) -> torch.Tensor | None:
    """The exact sum of every party's ``value`` at every party of ``parties``; nobody sees another's part.

    ``secure_sum`` at ``root`` (default: the active party if it takes part,
    else the first party), then the total goes down the pairwise tree rooted
    there. Returns ``None`` at ranks outside ``parties``.
    """
    parties = fed.parties if parties is None else list(parties)
    if fed.rank not in parties:
        return None
    if len(parties) == 1:
        return value
    if root is None:
        root = fed.active if fed.active in parties else parties[0]
    total = secure_sum(fed, value, out=root, stream=stream, parties=parties)
    order = [root] + [p for p in parties if p != root]
    total = broadcast(fed, total, pairwise_tree(order), shape=value.shape, dtype=value.dtype)
    return total.to(value.device)
