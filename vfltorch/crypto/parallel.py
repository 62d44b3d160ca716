"""Process parallelism for large encrypted tensors: a worker pool that keeps the key.

gmpy2 holds the GIL, so threads do not help; processes do. ``CryptoWorkers``
starts ``processes`` spawned workers once; each receives the modulus (and,
for decryption, the primes) through the pool initializer and keeps them, with
its own obfuscator generator (the DJN table is built once per worker). A call
then ships only ciphertexts and exponents, split into one contiguous chunk
per worker:

* encryption / decryption / elementwise products: the elements are split;
* dot products (``a @ X``, ``X @ a``): the output columns are split when there
  are at least as many as workers, otherwise the bases are split and the
  partial products multiplied together ([[x]] [[y]] = [[x + y]]).

Results are the same as the serial path (encryptions differ only in their
randomness). The private key crosses into the workers, which are children of
this process on this machine: the same trust boundary as the party itself.

Use it through the ``workers=`` argument of ``EncryptedTensor`` methods, or
``workers.encrypt`` / ``workers.decrypt``::

    with CryptoWorkers(public_key, private_key, processes=2) as workers:
        enc = workers.encrypt(residuals)
        grad = enc.matmul(X, workers=workers)
        values = workers.decrypt(grad)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor

from phe.paillier import PaillierPublicKey

from . import arith
from .errors import KeyMismatchError
from .keys import _public_math, private_math, private_math_from_primes, public_math
from .obfuscators import DEFAULT_METHOD, DEFAULT_WINDOW, METHODS, make_generator

# --------------------------------------------------------------- worker side
_STATE: dict = {}


def _init_worker(n: int, primes, method: str, window: int, parent: int | None = None) -> None:
    from .._lifetime import die_with_parent

    die_with_parent(parent=parent)          # the workers hold the key: they end with their party, even a killed one
    pm = _public_math(n, PaillierPublicKey(n))   # the parent already applied the key-size policy
    _STATE.clear()
    _STATE.update(pm=pm, sk=private_math_from_primes(*primes, pm) if primes else None,
                  method=method, window=window, generator=None)


def _generator():
    if _STATE["generator"] is None:
        pm = _STATE["pm"]
        _STATE["generator"] = make_generator(pm.n, _STATE["method"], _STATE["window"])
    return _STATE["generator"]


def _w_warm(delay: float) -> int:
    _generator()
    time.sleep(delay)          # hold this worker so the next warm-up task lands on another
    return os.getpid()


def _w_encrypt(ms) -> list:
    pm = _STATE["pm"]
    return arith.encrypt_raw(ms, _generator().generate(len(ms)), pm.n, pm.nsquare)


def _w_decrypt(cs) -> list:
    return arith.decrypt_with(cs, _STATE["sk"])


def _w_mul(cs, ks) -> list:
    return arith.mul_raw(cs, ks, _STATE["pm"].nsquare)


def _w_multiexp(bases, columns) -> list:
    return arith.multiexp_columns(bases, columns, _STATE["pm"].nsquare)


# --------------------------------------------------------------- parent side
def _chunks(count: int, parts: int) -> list[tuple[int, int]]:
    parts = max(1, min(parts, count))
    step, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + step + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


class CryptoWorkers:
    """A pool of ``processes`` workers holding ``public_key`` (and ``private_key`` if given)."""

    def __init__(self, public_key: PaillierPublicKey, private_key=None, processes: int | None = None, *,
                 obfuscation: str = DEFAULT_METHOD, window: int = DEFAULT_WINDOW):
        if obfuscation not in METHODS:
            raise ValueError(f"unknown obfuscator method {obfuscation!r}: choose one of {METHODS}")
        self._pm = public_math(public_key)
        self.public_key = public_key
        self._sk = None
        self._private_key = private_key
        primes = None
        if private_key is not None:
            self._sk = private_math(private_key)
            if self._sk.public.n != self._pm.n:
                raise KeyMismatchError("the private key does not belong to the public key")
            primes = (int(self._sk.p), int(self._sk.q))
        self.processes = int(processes or os.cpu_count() or 1)
        if self.processes < 1:
            raise ValueError("processes must be at least 1")
        self._executor = ProcessPoolExecutor(max_workers=self.processes, mp_context=mp.get_context("spawn"),
                                             initializer=_init_worker,
                                             initargs=(int(self._pm.n), primes, obfuscation, window, os.getpid()))

    # ------------------------------------------------------------- plumbing
    def _check(self, pm) -> None:
        if pm.n != self._pm.n:
            raise KeyMismatchError(f"these workers hold key {self._pm.fingerprint}, the data belongs to "
                                   f"{pm.fingerprint}")

    def _map(self, fn, chunks) -> list:
        futures = [self._executor.submit(fn, *args) for args in chunks]
        return [f.result() for f in futures]

    def warm_up(self, timeout: float = 120.0) -> "CryptoWorkers":
        """Start every worker and build its obfuscator table, so timings exclude start-up."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while len(seen) < self.processes and time.monotonic() < deadline:
            seen.update(self._map(_w_warm, [(0.2,)] * self.processes))
        return self

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "CryptoWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ raw kernels
    def encrypt_raw(self, pm, ms) -> list:
        self._check(pm)
        parts = self._map(_w_encrypt, [(ms[a:b],) for a, b in _chunks(len(ms), self.processes)])
        return [c for part in parts for c in part]

    def decrypt_raw(self, sk, cs) -> list:
        if self._sk is None:
            raise ValueError("these workers were started without the private key; pass private_key= to "
                             "CryptoWorkers to decrypt in parallel")
        if sk.public.n != self._pm.n:
            raise KeyMismatchError("the private key does not belong to these workers' key")
        parts = self._map(_w_decrypt, [(cs[a:b],) for a, b in _chunks(len(cs), self.processes)])
        return [r for part in parts for r in part]

    def mul_raw(self, pm, cs, ks) -> list:
        self._check(pm)
        parts = self._map(_w_mul, [(cs[a:b], ks[a:b]) for a, b in _chunks(len(cs), self.processes)])
        return [c for part in parts for c in part]

    def multiexp_columns(self, pm, bases, columns) -> list:
        self._check(pm)
        if len(columns) >= self.processes or len(bases) < 2:
            parts = self._map(_w_multiexp, [(bases, columns[a:b])
                                            for a, b in _chunks(len(columns), self.processes)])
            return [c for part in parts for c in part]
        # Few outputs: split the bases; the partial products multiply into the full sums.
        spans = _chunks(len(bases), self.processes)
        parts = self._map(_w_multiexp, [(bases[a:b], [col[a:b] for col in columns]) for a, b in spans])
        return [arith.product_raw(vals, pm.nsquare) for vals in zip(*parts)]

    # ------------------------------------------------------------ conveniences
    def encrypt(self, x, frac_bits: int | None = None, **kwargs):
        """``EncryptedTensor.encrypt`` with these workers."""
        from .encoding import DEFAULT_FRAC_BITS
        from .tensor import EncryptedTensor
        return EncryptedTensor.encrypt(self.public_key, x, DEFAULT_FRAC_BITS if frac_bits is None else frac_bits,
                                       workers=self, **kwargs)

    def decrypt(self, tensor, private_key=None, **kwargs):
        """Decrypt ``tensor`` with the workers' private key (or ``private_key``, which must match)."""
        private_key = private_key if private_key is not None else self._private_key
        if private_key is None:
            raise ValueError("these workers were started without the private key")
        return tensor.decrypt(private_key, workers=self, **kwargs)


__all__ = ["CryptoWorkers"]
