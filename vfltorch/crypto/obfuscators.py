"""Obfuscators r^n mod n^2, made ahead of need: the offline half of Paillier encryption.

A Paillier encryption is (1 + m n) s mod n^2 with s = r^n a random n-th
residue. Everything expensive is in s, and s does not depend on the message,
so it can be made before the message exists (offline) and kept in a pool;
the online part is then one cheap product (``arith.encrypt_raw``).

Two ways to make s:

* ``"full"`` - python-paillier's way: r uniform in [1, n), s = r^n mod n^2, one
  exponentiation with the |n|-bit exponent n (about 9 ms at 2048 bits here).
* ``"djn"`` (default) - the variant of Damgard, Jurik and Nielsen (*A
  generalization of Paillier's public-key system with applications to
  electronic voting*, IJIS 2010; also SecretFlow HEU's "dj" scheme and the
  DJN mode of Intel's Paillier library): pick x in Z*_n once, h = -x^2 mod n
  and h_s = h^n mod n^2 (an n-th residue); then s = h_s^a for a random a of
  ceil(|n|/2) bits. Since h_s is fixed, h_s^a is a *fixed-base*
  exponentiation: with a table of h_s^(d 2^(w j)) for every w-bit digit d and
  window j, it costs one multiplication per window (128 for 2048-bit keys with
  w = 8, table 17 MB) instead of ~3000 for r^n. Security rests on DJN's assumption that h_s^a
  with a of |n|/2 bits is indistinguishable from a uniform n-th residue.
  Ciphertexts are ordinary Paillier ciphertexts: phe decrypts them.

``ObfuscatorPool`` holds a stock of obfuscators. ``fill`` makes them now
(ahead of the protocol step that needs them); with ``background=True`` a
separate process keeps the stock topped up, using a core the protocol is not
using. ``take`` serves from the stock and makes any shortfall inline, so the
caller never waits on the background process and never reuses an obfuscator
(reuse would let anyone divide two ciphertexts and learn m1 - m2).
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import queue as queue_mod
import time

import gmpy2
from gmpy2 import mpz

from .keys import PaillierPublicKey, public_math

METHODS = ("djn", "full")
DEFAULT_METHOD = "djn"
DEFAULT_WINDOW = 8


class FullObfuscators:
    """s = r^n mod n^2 for r uniform in [1, n) (phe's obfuscation)."""

    method = "full"

    def __init__(self, n, nsquare):
        self.n, self.nsquare = mpz(n), mpz(nsquare)
        self._nbytes = (int(self.n).bit_length() + 7) // 8 + 8   # 64 extra bits: negligible modulo bias
        self.table_bytes = 0

    def generate(self, count: int) -> list:
        if count <= 0:
            return []
        nm1 = self.n - 1
        rs = [mpz(int.from_bytes(os.urandom(self._nbytes), "big")) % nm1 + 1 for _ in range(count)]
        # r shares a factor with n only if it reveals p or q: probability ~2^-1000.
        return gmpy2.powmod_base_list(rs, self.n, self.nsquare)


class DJNObfuscators:
    """s = h_s^a mod n^2 with a random a of ceil(|n|/2) bits, by fixed-base windows of ``window`` bits."""

    method = "djn"

    def __init__(self, n, nsquare, window: int = DEFAULT_WINDOW, *, seed_x=None):
        if not isinstance(window, int) or not 1 <= window <= 16:
            raise ValueError(f"window must be an int in [1, 16], got {window!r}")
        self.n, self.nsquare, self.window = mpz(n), mpz(nsquare), window
        bits = int(self.n).bit_length()
        # DJN's exponent length ceil(|n|/2), rounded up to whole windows (more randomness, never less).
        self.windows = -(-((bits + 1) // 2) // window)
        self.exponent_bits = self.windows * window
        x = mpz(seed_x) if seed_x is not None else self._random_unit()
        h = (-x * x) % self.n
        self.hs = gmpy2.powmod(h, self.n, self.nsquare)
        self._table = self._build_table()
        self.table_bytes = sum(v.bit_length() // 8 + 1 for row in self._table for v in row[1:])

    def _random_unit(self):
        nbytes = (int(self.n).bit_length() + 7) // 8 + 8
        while True:
            x = mpz(int.from_bytes(os.urandom(nbytes), "big")) % self.n
            if x > 1 and gmpy2.gcd(x, self.n) == 1:
                return x

    def _build_table(self) -> list:
        # row j holds h_s^(d 2^(w j)) for d = 0 .. 2^w - 1 (index 0 unused).
        nsq, size = self.nsquare, 1 << self.window
        table, base = [], self.hs
        for _ in range(self.windows):
            row = [None, base]
            for _d in range(2, size):
                row.append(row[-1] * base % nsq)
            table.append(row)
            base = row[-1] * base % nsq    # h_s^(2^w 2^(w j)) = base of the next window
        return table

    def generate(self, count: int) -> list:
        out = []
        nsq, table, w = self.nsquare, self._table, self.window
        nbytes = self.exponent_bits // 8
        while len(out) < count:
            acc = None
            if w == 8:
                digits = os.urandom(nbytes)   # each byte is one 8-bit digit of a
            else:
                a = int.from_bytes(os.urandom(-(-self.exponent_bits // 8)), "big") >> (-self.exponent_bits % 8)
                mask = (1 << w) - 1
                digits = [(a >> (w * j)) & mask for j in range(self.windows)]
            for row, d in zip(table, digits):
                if d:
                    acc = row[d] if acc is None else acc * row[d] % nsq
            if acc is not None:       # a = 0 (probability 2^-1024) would give s = 1: draw again
                out.append(acc)
        return out


def make_generator(n, method: str = DEFAULT_METHOD, window: int = DEFAULT_WINDOW):
    """An obfuscator generator for modulus ``n`` (``"djn"`` or ``"full"``)."""
    n = mpz(n)
    if method == "djn":
        return DJNObfuscators(n, n * n, window)
    if method == "full":
        return FullObfuscators(n, n * n)
    raise ValueError(f"unknown obfuscator method {method!r}: choose one of {METHODS}")


def _background_main(n: int, method: str, window: int, out_queue, stop, batch: int, parent: int | None = None) -> None:
    from .._lifetime import die_with_parent

    die_with_parent(parent=parent)          # a killed party must not leave its filler running
    gen = make_generator(n, method, window)
    while not stop.is_set():
        block = [int(s) for s in gen.generate(batch)]
        while not stop.is_set():
            try:
                out_queue.put(block, timeout=0.2)
                break
            except queue_mod.Full:
                continue


class ObfuscatorPool:
    """A stock of obfuscators for one public key.

    Parameters
    ----------
    public_key: phe ``PaillierPublicKey`` (size policy of ``keys.py`` applies).
    method: ``"djn"`` (fixed-base, default) or ``"full"`` (r^n, as phe).
    window: fixed-base window in bits for ``"djn"`` (table of ceil(|n|/2w) 2^w entries).
    background: start a process that keeps up to ``capacity`` obfuscators ready.

    ``stats`` counts what was made where, so benchmarks can report the offline
    cost honestly: ``offline_seconds`` is time spent making obfuscators in
    this process (``fill`` and shortfalls in ``take``), ``inline`` how many
    ``take`` had to make on the spot.
    """

    def __init__(self, public_key: PaillierPublicKey, method: str = DEFAULT_METHOD, *,
                 window: int = DEFAULT_WINDOW, background: bool = False, capacity: int = 4096,
                 batch: int = 128):
        if method not in METHODS:
            raise ValueError(f"unknown obfuscator method {method!r}: choose one of {METHODS}")
        if capacity < 1 or batch < 1:
            raise ValueError("capacity and batch must be positive")
        self.public_key = public_key
        self._pm = public_math(public_key)
        self.method, self.window = method, window
        self.capacity, self.batch = capacity, batch
        self._generator = None
        self._stock: collections.deque = collections.deque()
        self._proc = self._queue = self._stop = None
        self.stats = {"made_here": 0, "received": 0, "inline": 0, "taken": 0, "offline_seconds": 0.0,
                      "setup_seconds": 0.0}
        if background:
            self.start()

    # ------------------------------------------------------------ generation
    @property
    def generator(self):
        """The generator of this process, built on first use (the DJN table takes a moment)."""
        if self._generator is None:
            t0 = time.perf_counter()
            self._generator = make_generator(self._pm.n, self.method, self.window)
            self.stats["setup_seconds"] += time.perf_counter() - t0
        return self._generator

    def _make(self, count: int) -> list:
        gen = self.generator
        t0 = time.perf_counter()
        out = gen.generate(count)
        self.stats["offline_seconds"] += time.perf_counter() - t0
        self.stats["made_here"] += count
        return out

    def fill(self, count: int) -> "ObfuscatorPool":
        """Make obfuscators now until at least ``count`` are in stock."""
        self._drain()
        missing = count - len(self._stock)
        if missing > 0:
            self._stock.extend(self._make(missing))
        return self

    def fill_with(self, workers, count: int) -> "ObfuscatorPool":
        """``fill``, with the missing obfuscators made by a ``CryptoWorkers`` pool in parallel.

        Each worker encrypts zeros with its own generator: E(0) = (1 + 0 n) s = s, an obfuscator.
        """
        self._drain()
        missing = count - len(self._stock)
        if missing > 0:
            t0 = time.perf_counter()
            self._stock.extend(mpz(c) for c in workers.encrypt_raw(self._pm, [0] * missing))
            self.stats["offline_seconds"] += time.perf_counter() - t0
            self.stats["made_by_workers"] = self.stats.get("made_by_workers", 0) + missing
        return self

    @property
    def available(self) -> int:
        self._drain()
        return len(self._stock)

    def take(self, count: int) -> list:
        """``count`` fresh obfuscators, each used once; any shortfall is made inline."""
        if count < 0:
            raise ValueError("count must be non-negative")
        self._drain()
        have = min(count, len(self._stock))
        out = [self._stock.popleft() for _ in range(have)]
        if have < count:
            self.stats["inline"] += count - have
            out.extend(self._make(count - have))
        self.stats["taken"] += count
        return out

    # ------------------------------------------------------------ background
    @property
    def background(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> "ObfuscatorPool":
        """Start the background filler process (idempotent)."""
        if self._proc is not None:
            return self
        ctx = mp.get_context("spawn")
        self._queue = ctx.Queue(maxsize=max(1, self.capacity // self.batch))
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_background_main, name="vfl-obfuscators", daemon=True,
                                 args=(int(self._pm.n), self.method, self.window, self._queue, self._stop,
                                       self.batch, os.getpid()))
        self._proc.start()
        return self

    def wait_for(self, count: int, timeout: float = 60.0) -> int:
        """Block until ``count`` obfuscators are in stock or ``timeout`` passes; returns the stock size."""
        deadline = time.monotonic() + timeout
        while self.available < count and self.background and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(self._stock)

    def _drain(self) -> None:
        if self._queue is None:
            return
        while len(self._stock) < self.capacity:
            try:
                block = self._queue.get_nowait()
            except (queue_mod.Empty, OSError, ValueError):
                break
            self._stock.extend(mpz(s) for s in block)
            self.stats["received"] += len(block)

    def close(self) -> None:
        """Stop the background process, if any (the stock stays usable)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._stop.set()
        deadline = time.monotonic() + 5.0
        while proc.is_alive() and time.monotonic() < deadline:
            try:   # unblock a put() that waits for room
                self._queue.get(timeout=0.05)
            except (queue_mod.Empty, OSError, ValueError):
                pass
        proc.join(timeout=1.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=1.0)
        self._queue.close()
        self._queue.cancel_join_thread()
        self._queue = self._stop = None

    def __enter__(self) -> "ObfuscatorPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"ObfuscatorPool(key={self._pm.fingerprint}, method={self.method!r}, stock={len(self._stock)}, "
                f"background={self.background})")


_default_pools: "collections.OrderedDict[str, ObfuscatorPool]" = collections.OrderedDict()
_MAX_DEFAULT_POOLS = 4


def default_pool(public_key: PaillierPublicKey) -> ObfuscatorPool:
    """The process-wide DJN pool of a key (no background process), made on first use.

    Encryption without an explicit pool draws here, so it pays the offline
    cost inline; pass a filled ``ObfuscatorPool`` to keep that cost off the
    protocol's critical path.
    """
    pm = public_math(public_key)
    pool = _default_pools.get(pm.fingerprint)
    if pool is None:
        pool = ObfuscatorPool(public_key)
        _default_pools[pm.fingerprint] = pool
        while len(_default_pools) > _MAX_DEFAULT_POOLS:   # DJN tables are large: keep a few keys only
            _default_pools.popitem(last=False)
    else:
        _default_pools.move_to_end(pm.fingerprint)
    return pool


__all__ = ["DEFAULT_METHOD", "DEFAULT_WINDOW", "DJNObfuscators", "FullObfuscators", "METHODS", "ObfuscatorPool",
           "default_pool", "make_generator"]
