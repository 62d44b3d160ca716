"""The two ways the protocol's messages travel: Paillier-encrypted, or in the clear (insecure).

The protocol code (``guest.py``, ``host.py``, ``coordinator.py``) is written
once against this small interface; the scheme decides what a "ciphertext" is:

================  =========================================  =============================================
operation         ``PaillierScheme``                          ``PlaintextScheme`` (``--insecure-plaintext``)
================  =========================================  =============================================
encrypt(x, f)     ``EncryptedTensor`` [[round(x 2^f)]]        ``PlainTensor``: x itself (float64)
t * a, t + x      homomorphic (crypto module)                 float64 arithmetic
matmul(t, X, F_X) [[t]]^T X, bucket method, X at F_X bits     t^T X (X already quantised to F_X bits)
fixed(t, F)       lift to F fractional bits                   ``PlainFixed``: round(t 2^F) as Python ints
add_fixed(t, r)   [[m]] (1 + r n) = [[m + r]]                 m + r on the integers
send / recv       re-randomised ciphertexts (uint8 payload)   float64 tensors / JSON integers
open(t)           decrypt to the integers m (key holder)      the integers m
================  =========================================  =============================================

Both schemes send the same messages, in the same order, with the same
fixed-point integers and the same masks where the protocol masks; only
encryption is missing from the plaintext one. Features are quantised to F_X
fractional bits in both modes before training (``HeteroLogisticRegression``),
so the two runs differ only by the fixed-point rounding of encrypted values
at 40-58 fractional bits (about 1e-12 relative).

``PlaintextScheme`` is INSECURE: every party sees the residuals in the clear,
which reveal the labels. It exists for debugging and for measuring what
encryption costs.
"""

from __future__ import annotations

import time

import torch

from ..crypto import (CryptoWorkers, EncryptedTensor, ObfuscatorPool, recv_encrypted, recv_public_key,
                      send_encrypted, send_public_key)
from ..crypto.encoding import to_fixed

PLAINTEXT_LABEL = "none (INSECURE plaintext mode)"


class PlainTensor:
    """A float64 tensor standing in for an encrypted one in plaintext mode (same operators)."""

    __array_ufunc__ = None

    def __init__(self, value: torch.Tensor):
        self.value = value.to(torch.float64)

    @property
    def shape(self):
        return self.value.shape

    def numel(self) -> int:
        return self.value.numel()

    def __add__(self, other):
        return PlainTensor(self.value + (other.value if isinstance(other, PlainTensor) else _as_tensor(other)))

    __radd__ = __add__

    def __mul__(self, other):
        return PlainTensor(self.value * _as_tensor(other))

    __rmul__ = __mul__


class PlainFixed:
    """Fixed-point integers m (value m / 2^frac_bits): what the key holder would decrypt."""

    def __init__(self, ints, frac_bits: int, shape):
        self.ints = [int(m) for m in ints]
        self.frac_bits = int(frac_bits)
        self.shape = torch.Size(shape)

    def __add__(self, other):
        if isinstance(other, PlainFixed):
            raise TypeError("add fixed-point integers with add_fixed")
        ms, _ = to_fixed(_as_tensor(other).expand(self.shape), self.frac_bits)
        return PlainFixed([a + b for a, b in zip(self.ints, ms)], self.frac_bits, self.shape)

    __radd__ = __add__


def _as_tensor(x):
    return x.to(torch.float64).cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)


class PaillierScheme:
    """Paillier through ``vfltorch.crypto``: the coordinator holds the private key, the parties the public one.

    ``pool`` is this party's ``ObfuscatorPool``: obfuscators r^n for fresh
    encryptions and for the re-randomisation of every ciphertext that leaves
    the process (``send_encrypted``); ``prepare(count)`` fills it ahead of
    need and the time it takes is counted as offline time.

    ``processes`` > 1 starts a ``CryptoWorkers`` pool of that many processes
    (started and warmed up here, during setup): the obfuscators of ``prepare``
    (encryptions of zero), [[d]]^T X and, at the key holder, decryption are
    spread over them; the protocol's processes mostly wait on each other, so
    the workers use the cores they leave idle.
    """

    encrypted = True

    def __init__(self, public_key, private_key=None, *, background: bool = False, method: str = "djn",
                 processes: int = 1):
        self.public_key = public_key
        self.private_key = private_key
        self.key_bits = int(public_key.n).bit_length()
        parallel = f", {int(processes)} crypto processes" if int(processes) > 1 else ""
        self.label = f"paillier ({self.key_bits}-bit keys, {method} obfuscators{parallel})"
        self.pool = (ObfuscatorPool(public_key, method=method, background=background) if private_key is None
                     else None)
        self.workers = None
        if int(processes) > 1:
            self.workers = CryptoWorkers(public_key, private_key, int(processes), obfuscation=method).warm_up()

    # ---------------------------------------------------------------- keys
    @staticmethod
    def share_key(fed, public_key, parties) -> None:
        for r in parties:
            send_public_key(fed, public_key, r)

    @classmethod
    def receive_key(cls, fed, src: int, *, insecure: bool, background: bool = False,
                    method: str = "djn", processes: int = 1) -> "PaillierScheme":
        return cls(recv_public_key(fed, src, insecure=insecure), background=background, method=method,
                   processes=processes)

    # ---------------------------------------------------------- obfuscators
    def prepare(self, count: int) -> float:
        """Make ``count`` obfuscators now (offline); returns the seconds spent."""
        if self.pool is None or count <= 0 or self.pool.background:
            return 0.0      # a background pool fills itself on another core
        started = time.perf_counter()
        if self.workers is not None:
            self.pool.fill_with(self.workers, count)
        else:
            self.pool.fill(count)
        return time.perf_counter() - started

    def offline_stats(self) -> dict:
        return dict(self.pool.stats) if self.pool is not None else {}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    # ----------------------------------------------------------- arithmetic
    def encrypt(self, x: torch.Tensor, frac_bits: int, max_abs: float) -> EncryptedTensor:
        return EncryptedTensor.encrypt(self.public_key, x.to(torch.float64).cpu(), frac_bits, max_abs=max_abs,
                                       pool=self.pool)

    def matmul(self, t: EncryptedTensor, X: torch.Tensor, frac_bits: int) -> EncryptedTensor:
        workers = self.workers if X.dim() == 2 else None        # a single dot product is not worth shipping
        return t.matmul(X.to(torch.float64).cpu(), frac_bits=frac_bits, workers=workers)

    @staticmethod
    def fixed(t: EncryptedTensor, frac_bits: int) -> EncryptedTensor:
        if t.frac_bits > frac_bits:
            raise ValueError(f"a ciphertext with {t.frac_bits} fractional bits cannot be brought to {frac_bits}")
        return t.lift(frac_bits)

    @staticmethod
    def add_fixed(t: EncryptedTensor, ints) -> EncryptedTensor:
        return t.add_fixed(ints)

    # ------------------------------------------------------------- transport
    def send(self, fed, t: EncryptedTensor, dst: int, bound_bits: int) -> None:
        send_encrypted(fed, t, dst, pool=self.pool, bound_bits=bound_bits)

    def recv(self, fed, src: int, *, fixed: bool = False) -> EncryptedTensor:
        return recv_encrypted(fed, src, self.public_key)

    def open(self, t: EncryptedTensor) -> tuple[list[int], int]:
        """Decrypt to the fixed-point integers (the coordinator)."""
        return t.decrypt_fixed(self.private_key, workers=self.workers), t.frac_bits


class PlaintextScheme:
    """The same protocol without encryption. INSECURE: for debugging and for measuring encryption's cost."""

    encrypted = False
    label = PLAINTEXT_LABEL
    key_bits = 0

    @staticmethod
    def prepare(count: int) -> float:
        return 0.0

    @staticmethod
    def offline_stats() -> dict:
        return {}

    def close(self) -> None:
        pass

    @staticmethod
    def encrypt(x: torch.Tensor, frac_bits: int, max_abs: float) -> PlainTensor:
        if x.numel() and float(x.abs().max()) > max_abs:
            raise ValueError(f"a value of magnitude {float(x.abs().max()):g} exceeds the declared max_abs={max_abs}")
        # The values an encryption would hold: round(x 2^f) / 2^f (exact scalings by powers of two).
        x = x.to(torch.float64).cpu()
        return PlainTensor(torch.round(x * 2.0 ** frac_bits) / 2.0 ** frac_bits)

    @staticmethod
    def matmul(t: PlainTensor, X: torch.Tensor, frac_bits: int) -> PlainTensor:
        return PlainTensor(t.value @ X.to(torch.float64).cpu())

    @staticmethod
    def fixed(t, frac_bits: int) -> PlainFixed:
        ms, _ = to_fixed(t.value, frac_bits)
        return PlainFixed(ms, frac_bits, t.value.shape)

    @staticmethod
    def add_fixed(t: PlainFixed, ints) -> PlainFixed:
        ints = list(ints)
        if len(ints) != len(t.ints):
            raise ValueError(f"add_fixed needs {len(t.ints)} integers, got {len(ints)}")
        return PlainFixed([a + int(b) for a, b in zip(t.ints, ints)], t.frac_bits, t.shape)

    @staticmethod
    def send(fed, t, dst: int, bound_bits: int) -> None:
        if isinstance(t, PlainFixed):
            fed.send_json({"frac_bits": t.frac_bits, "shape": list(t.shape), "ints": t.ints}, dst)
        else:
            fed.send_tensor(t.value, dst)

    @staticmethod
    def recv(fed, src: int, *, fixed: bool = False):
        if fixed:
            msg = fed.recv_json(src)
            return PlainFixed(msg["ints"], msg["frac_bits"], msg["shape"])
        return PlainTensor(fed.recv_tensor(src, device="cpu"))

    @staticmethod
    def open(t: PlainFixed) -> tuple[list[int], int]:
        return list(t.ints), t.frac_bits


__all__ = ["PLAINTEXT_LABEL", "PaillierScheme", "PlainFixed", "PlainTensor", "PlaintextScheme"]
