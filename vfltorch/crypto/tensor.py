"""``EncryptedTensor``: a tensor of Paillier ciphertexts with a fixed-point scale and a bound.

An encrypted tensor of shape S holds prod(S) ciphertexts [[m_i]] (gmpy2
``mpz`` in Z*_{n^2}, row-major), the public key, the number f of fractional
bits (value x_i = m_i / 2^f) and a bound B >= max |m_i| (see ``encoding.py``).

Operations follow the additive homomorphism, with torch broadcasting rules:

==========================  ======================================  ======================
operation                   ciphertext maths                        scale, bound
==========================  ======================================  ======================
``a + b`` (both encrypted)  [[a]] [[b]]                              max f, B_a + B_b
``a + x`` (x plaintext)     [[a]] (1 + m_x n)                        f_a, B_a + max|m_x|
``a * x``                   [[a]]^k, k = round(x 2^g) (sign: invert) f_a + g, B_a max|k|
``a @ X``  (sum_i a_i X_ij) prod_i [[a_i]]^{k_ij} (bucket method)     f_a + g, B_a max_j sum_i |k_ij|
``X @ a``  (sum_j X_ij a_j) the same with X's rows                   f_a + g, B_a max_i sum_j |k_ij|
``a.sum(dim)``              product along dim                        f_a, B_a size
``a.mean(dim)``             sum times round(2^h / size)              f_a + h, ...
==========================  ======================================  ======================

Plaintext multipliers use ``g = DEFAULT_SCALAR_FRAC_BITS`` (16) fractional
bits unless told otherwise (0 for integer tensors), with common trailing zero
bits stripped: the exponent is short, which is what makes ``a * x`` and
``a @ X`` fast. An operation whose bound could leave the safe range raises
``EncodingOverflowError`` before computing anything.

Obfuscation. A fresh encryption is randomised; the result of an operation is
not (it is a deterministic function of its inputs, and a holder of the inputs
could test guesses of the plaintext operand). ``obfuscated`` says which;
``rerandomize`` multiplies by fresh obfuscators, and ``transport.send_encrypted``
does so automatically before anything leaves the process.

Parallelism. ``encrypt``, ``decrypt``, ``mul``, ``matmul`` and ``rmatmul``
take ``workers=`` (a ``parallel.CryptoWorkers``) to spread the work over
processes; results are identical.
"""

from __future__ import annotations

import math
from fractions import Fraction

import gmpy2
import numpy as np
import phe
import torch
from gmpy2 import mpz

from . import arith
from .encoding import (DEFAULT_FRAC_BITS, as_plain_tensor, check_bound, check_frac_bits, encode_multiplier,
                       from_fixed, from_ring, plain_shape, to_fixed)
from .errors import EncodingOverflowError, KeyMismatchError
from .keys import PaillierPrivateKey, PaillierPublicKey, PublicMath, private_math, public_math
from .obfuscators import ObfuscatorPool, default_pool

MEAN_PRECISION_BITS = 32
"""Relative precision of the fixed-point 1/size used by ``mean`` and of divisors in ``/``."""


def _numel(shape) -> int:
    return math.prod(shape)


class EncryptedTensor:
    """Paillier ciphertexts shaped like a tensor. Build with ``EncryptedTensor.encrypt`` or ``from_phe``."""

    # numpy must not treat us as a scalar object and broadcast elementwise: defer to our operators.
    __array_ufunc__ = None

    def __init__(self, public_key: PaillierPublicKey, ciphertexts, shape, frac_bits: int, bound: int, *,
                 obfuscated: bool = False, _pm: PublicMath | None = None):
        self._pm = _pm if _pm is not None else public_math(public_key)
        self.public_key = public_key
        self._cs = list(ciphertexts)
        self.shape = torch.Size(shape)
        if len(self._cs) != _numel(self.shape):
            raise ValueError(f"{len(self._cs)} ciphertexts cannot have shape {tuple(self.shape)}")
        self.frac_bits = check_frac_bits(frac_bits)
        self.bound = int(bound)
        if self.bound < 0:
            raise ValueError("bound must be non-negative")
        self.obfuscated = bool(obfuscated)

    # ------------------------------------------------------------ construction
    @classmethod
    def encrypt(cls, public_key: PaillierPublicKey, x, frac_bits: int = DEFAULT_FRAC_BITS, *,
                max_abs: float | None = None, pool: ObfuscatorPool | None = None,
                workers=None) -> "EncryptedTensor":
        """Encrypt every element of ``x`` as round(x 2^frac_bits).

        ``max_abs`` declares a public bound on |x| (checked); the tracked bound,
        which travels in serialised headers, is then derived from it rather
        than from the data. Obfuscators come from ``pool`` (default: the key's
        process-wide pool, which makes them on the spot), or from the workers'
        own generators when ``workers`` is given.
        """
        pm = public_math(public_key)
        f = check_frac_bits(frac_bits)
        t = as_plain_tensor(x, "the tensor to encrypt")
        ms, mmax = to_fixed(t, f)
        bound = mmax
        if max_abs is not None:
            bound = declared_bound(max_abs, f)
            if mmax > bound:
                raise ValueError(f"a value of magnitude {mmax / 2 ** f:g} exceeds the declared max_abs={max_abs}")
        check_bound(bound, pm, f"encrypting with frac_bits={f}")
        if workers is not None:
            cs = workers.encrypt_raw(pm, ms)
        else:
            pool = _pool_for(pool, pm)
            cs = arith.encrypt_raw(ms, pool.take(len(ms)), pm.n, pm.nsquare)
        return cls(public_key, cs, t.shape, f, bound, obfuscated=True, _pm=pm)

    @classmethod
    def from_phe(cls, numbers, *, shape=None, max_abs: float | None = None) -> "EncryptedTensor":
        """Adopt phe ``EncryptedNumber`` s (a flat sequence, row-major) without decrypting.

        phe numbers carry base-16 exponents e (value = m 16^e); all are brought
        to the smallest exponent (min(e), 0) by [[m]]^{16^Δ}, giving f = -4 e
        fractional bits. phe does not know a bound on the values: pass
        ``max_abs`` to allow further arithmetic, otherwise the worst case (the
        whole safe range) is assumed and only decryption is possible.
        """
        numbers = list(numbers.ravel() if isinstance(numbers, np.ndarray) else numbers)
        if not numbers:
            raise ValueError("from_phe needs at least one EncryptedNumber (the key comes from them)")
        for e in numbers:
            if not isinstance(e, phe.EncryptedNumber):
                raise TypeError(f"from_phe expects phe.EncryptedNumber items, got {type(e).__name__}")
        public_key = numbers[0].public_key
        if any(e.public_key != public_key for e in numbers):
            raise KeyMismatchError("the phe numbers were encrypted under different public keys")
        pm = public_math(public_key)
        e_min = min(min(e.exponent for e in numbers), 0)
        f = -4 * e_min
        cs = []
        for e in numbers:
            c = mpz(e.ciphertext(be_secure=False))
            if e.exponent > e_min:
                c = gmpy2.powmod(c, mpz(16) ** (e.exponent - e_min), pm.nsquare)
            cs.append(c)
        bound = pm.max_int if max_abs is None else check_bound(declared_bound(max_abs, f), pm, "max_abs")
        obfuscated = all(getattr(e, "_EncryptedNumber__is_obfuscated", False) for e in numbers)
        shape = (len(numbers),) if shape is None else tuple(shape)
        return cls(public_key, cs, shape, f, bound, obfuscated=obfuscated, _pm=pm)

    def _like(self, cs, shape, frac_bits: int | None = None, bound: int | None = None,
              obfuscated: bool = False) -> "EncryptedTensor":
        return EncryptedTensor(self.public_key, cs, shape, self.frac_bits if frac_bits is None else frac_bits,
                               self.bound if bound is None else bound, obfuscated=obfuscated, _pm=self._pm)

    # -------------------------------------------------------------- properties
    @property
    def ciphertexts(self) -> list:
        """The ciphertexts (gmpy2 mpz, row-major); a copy. phe wants Python ints: ``int(c)``, or use ``to_phe``."""
        return list(self._cs)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return len(self._cs)

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d encrypted tensor")
        return (self[i] for i in range(self.shape[0]))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d encrypted tensor")
        return self.shape[0]

    @property
    def fingerprint(self) -> str:
        """The public key's fingerprint (``keys.key_fingerprint``)."""
        return self._pm.fingerprint

    @property
    def nbytes(self) -> int:
        """Bytes of the serialised ciphertexts (fixed width |n^2| bytes each), without the header."""
        return len(self._cs) * self._pm.width

    def __repr__(self) -> str:
        return (f"EncryptedTensor(shape={tuple(self.shape)}, frac_bits={self.frac_bits}, "
                f"bound=2^{self.bound.bit_length()}, key={self._pm.fingerprint}, obfuscated={self.obfuscated})")

    # -------------------------------------------------------------- decryption
    def decrypt_fixed(self, private_key: PaillierPrivateKey, *, workers=None) -> list[int]:
        """The signed fixed-point integers m_i (value m_i / 2^frac_bits), row-major."""
        sk = private_math(private_key)
        if sk.public.n != self._pm.n:
            raise KeyMismatchError(f"this private key belongs to key {sk.public.fingerprint}, the tensor to "
                                   f"{self._pm.fingerprint}")
        rs = workers.decrypt_raw(sk, self._cs) if workers is not None else arith.decrypt_with(self._cs, sk)
        ms = [from_ring(r, self._pm) for r in rs]
        if ms and max(abs(m) for m in ms) > self.bound:
            raise EncodingOverflowError(
                "a decrypted value is larger than the bound tracked for this tensor: a declared max_abs "
                "(or the bound received with it) was wrong, or the ciphertexts were tampered with")
        return [int(m) for m in ms]

    def decrypt(self, private_key: PaillierPrivateKey, *, dtype: torch.dtype = torch.float64,
                workers=None) -> torch.Tensor:
        """The plaintext tensor (float64 by default), each value correctly rounded from m / 2^f."""
        return from_fixed(self.decrypt_fixed(private_key, workers=workers), self.frac_bits, self.shape, dtype)

    # --------------------------------------------------------------- interop
    def to_phe(self) -> list:
        """phe ``EncryptedNumber`` s (row-major) that ``PaillierPrivateKey.decrypt`` reads.

        phe's exponents are base 16, so f must be a multiple of 4; otherwise the
        values are first lifted by (-f mod 4) bits.
        """
        pad = -self.frac_bits % 4
        t = self.lift(self.frac_bits + pad) if pad else self
        exponent = -(t.frac_bits // 4)
        return [phe.EncryptedNumber(self.public_key, int(c), exponent) for c in t._cs]

    # ------------------------------------------------------------ shape ops
    def _array(self) -> np.ndarray:
        arr = np.empty(len(self._cs), dtype=object)
        arr[:] = self._cs
        return arr.reshape(tuple(self.shape))

    def _from_array(self, arr, **kw) -> "EncryptedTensor":
        if not isinstance(arr, np.ndarray):        # a single element
            return self._like([arr], (), **kw)
        return self._like(arr.ravel().tolist(), arr.shape, **kw)

    def reshape(self, *shape) -> "EncryptedTensor":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        new = torch.empty(tuple(self.shape), device="meta").reshape(*shape).shape   # torch's rules, no data
        return self._like(self._cs, new, obfuscated=self.obfuscated)

    def flatten(self) -> "EncryptedTensor":
        return self.reshape(-1)

    def t(self) -> "EncryptedTensor":
        """Transpose of a 1-D or 2-D tensor."""
        if self.ndim > 2:
            raise ValueError("t() expects a tensor with at most 2 dimensions")
        if self.ndim < 2:
            return self
        return self._from_array(self._array().T, obfuscated=self.obfuscated)

    @property
    def T(self) -> "EncryptedTensor":
        return self.t()

    def __getitem__(self, index) -> "EncryptedTensor":
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        elif isinstance(index, tuple):
            index = tuple(i.cpu().numpy() if isinstance(i, torch.Tensor) else i for i in index)
        return self._from_array(self._array()[index], obfuscated=self.obfuscated)

    @staticmethod
    def cat(tensors, dim: int = 0) -> "EncryptedTensor":
        """Concatenate along ``dim`` (scales are aligned to the largest)."""
        tensors = list(tensors)
        if not tensors:
            raise ValueError("cat needs at least one tensor")
        first = tensors[0]
        for t in tensors[1:]:
            first._check_same_key(t)
        f = max(t.frac_bits for t in tensors)
        lifted = [t.lift(f) for t in tensors]
        arr = np.concatenate([t._array() for t in lifted], axis=dim)
        return first._from_array(arr, frac_bits=f, bound=max(t.bound for t in lifted),
                                 obfuscated=all(t.obfuscated for t in tensors))

    # ----------------------------------------------------------- arithmetic
    def _check_same_key(self, other: "EncryptedTensor") -> None:
        if other._pm.n != self._pm.n:
            raise KeyMismatchError(f"cannot combine ciphertexts of key {self._pm.fingerprint} with ciphertexts "
                                   f"of key {other._pm.fingerprint}")

    def _broadcast(self, other_shape) -> tuple[torch.Size, list]:
        out = torch.broadcast_shapes(self.shape, torch.Size(other_shape))
        if out == self.shape:
            return out, self._cs
        return out, np.broadcast_to(self._array(), tuple(out)).ravel().tolist()

    @staticmethod
    def _broadcast_plain(values: list, shape, out) -> list:
        if torch.Size(shape) == out:
            return values
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return np.broadcast_to(arr.reshape(tuple(shape)), tuple(out)).ravel().tolist()

    def lift(self, frac_bits: int) -> "EncryptedTensor":
        """The same values with more fractional bits: [[m]]^{2^Δ} (Δ squarings per element)."""
        frac_bits = check_frac_bits(frac_bits)
        shift = frac_bits - self.frac_bits
        if shift < 0:
            raise ValueError(f"cannot lower frac_bits from {self.frac_bits} to {frac_bits} without decrypting")
        if shift == 0:
            return self
        bound = check_bound(self.bound << shift, self._pm, f"lifting to frac_bits={frac_bits}")
        return self._like(arith.lift_raw(self._cs, shift, self._pm.nsquare), self.shape, frac_bits, bound)

    def add(self, other) -> "EncryptedTensor":
        """Elementwise sum with an encrypted tensor or a plaintext (tensor, array or number)."""
        if isinstance(other, EncryptedTensor):
            self._check_same_key(other)
            f = max(self.frac_bits, other.frac_bits)
            a, b = self.lift(f), other.lift(f)
            bound = check_bound(a.bound + b.bound, self._pm, "this sum")
            out, acs = a._broadcast(b.shape)
            _, bcs = b._broadcast(out)
            return self._like(arith.add_raw(acs, bcs, self._pm.nsquare), out, f, bound)
        shape = plain_shape(other)
        ms, mmax = to_fixed(other, self.frac_bits)
        bound = check_bound(self.bound + mmax, self._pm, "this sum")
        out, cs = self._broadcast(shape)
        ms = self._broadcast_plain(ms, shape, out)
        return self._like(arith.add_plain_raw(cs, ms, self._pm.n, self._pm.nsquare), out, self.frac_bits, bound)

    def add_fixed(self, ms) -> "EncryptedTensor":
        """Add raw fixed-point integers (units of 2^-frac_bits), exactly: [[m]] (1 + r n) = [[m + r]].

        This is how a protocol masks a ciphertext before someone else decrypts
        it: draw integer masks r (a sequence of Python ints or an integer
        tensor of the same shape), add them here, and remove them exactly from
        ``decrypt_fixed``'s integers (``from_fixed`` turns the result into
        floats). Doing this with float masks would lose the value to rounding.
        """
        if isinstance(ms, torch.Tensor):
            if ms.is_floating_point() or ms.is_complex():
                raise TypeError("add_fixed takes integers (fixed-point units); use + for real values")
            if tuple(ms.shape) != tuple(self.shape):
                raise ValueError(f"add_fixed needs shape {tuple(self.shape)}, got {tuple(ms.shape)}")
            ms = ms.reshape(-1).tolist()
        ms = [int(m) for m in ms]
        if len(ms) != len(self._cs):
            raise ValueError(f"add_fixed needs {len(self._cs)} integers, got {len(ms)}")
        bound = check_bound(self.bound + max((abs(m) for m in ms), default=0), self._pm, "this masked sum")
        return self._like(arith.add_plain_raw(self._cs, ms, self._pm.n, self._pm.nsquare), self.shape,
                          self.frac_bits, bound)

    def neg(self) -> "EncryptedTensor":
        """[[-a]] = [[a]]^{-1}."""
        return self._like(arith.negate_raw(self._cs, self._pm.nsquare), self.shape)

    def sub(self, other) -> "EncryptedTensor":
        if isinstance(other, EncryptedTensor):
            return self.add(other.neg())
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return self.add(-int(other))
        return self.add(-as_plain_tensor(other, "the plaintext to subtract"))

    def mul(self, other, frac_bits: int | None = None, *, workers=None) -> "EncryptedTensor":
        """Elementwise product with a plaintext, encoded with ``frac_bits`` fractional bits.

        ``frac_bits=None``: 16 for floating multipliers, 0 for integers. The
        result has ``self.frac_bits`` plus the multiplier's (stripped) bits.
        """
        if isinstance(other, EncryptedTensor):
            raise TypeError("Paillier cannot multiply two ciphertexts; decrypt one side or use a "
                            "plaintext multiplier")
        ks, fk, kshape = encode_multiplier(other, frac_bits)
        kmax = max((abs(k) for k in ks), default=0)
        bound = check_bound(self.bound * kmax, self._pm, "this product")
        out, cs = self._broadcast(kshape)
        nsq = self._pm.nsquare
        if len(ks) == 1:
            result = arith.mul_common_raw(cs, ks[0], nsq)
        else:
            ks = self._broadcast_plain(ks, kshape, out)
            result = workers.mul_raw(self._pm, cs, ks) if workers is not None else arith.mul_raw(cs, ks, nsq)
        return self._like(result, out, self.frac_bits + fk, bound)

    def div(self, other, precision_bits: int = MEAN_PRECISION_BITS) -> "EncryptedTensor":
        """Division by a plaintext: multiplication by 1/x in fixed point with ~``precision_bits`` relative bits."""
        t = as_plain_tensor(other, "the divisor").to(torch.float64)
        if bool((t == 0).any()):
            raise ZeroDivisionError("division of an encrypted tensor by zero")
        amax = float(t.abs().max()) if t.numel() else 1.0
        extra = max(0, math.ceil(math.log2(amax))) if amax > 0 else 0
        return self.mul(1.0 / t, frac_bits=precision_bits + extra)

    def matmul(self, other, frac_bits: int | None = None, *, workers=None) -> "EncryptedTensor":
        """``self @ other`` with a plaintext matrix or vector: out_j = sum_i [[a_i]] W_ij.

        For a 1-D ``self`` of length n and W of shape (n, f) this is the
        [[d]]^T X of vertical logistic regression: f outputs, each a product
        of n ciphertext powers computed by the bucket method.
        """
        W = as_plain_tensor(other, "the plaintext matrix")
        if self.ndim not in (1, 2) or W.ndim not in (1, 2):
            raise ValueError(f"matmul supports 1-D and 2-D operands, got {tuple(self.shape)} @ {tuple(W.shape)}")
        n = self.shape[-1]
        if W.shape[0] != n:
            raise ValueError(f"shapes do not match for matmul: {tuple(self.shape)} @ {tuple(W.shape)}")
        ks, fk, _ = encode_multiplier(W, frac_bits)
        fout = W.shape[1] if W.ndim == 2 else 1
        columns = [ks[j::fout] for j in range(fout)]
        colsum = max((sum(abs(k) for k in col) for col in columns), default=0)
        bound = check_bound(self.bound * colsum, self._pm, "this matrix product")
        rows = [self._cs] if self.ndim == 1 else [self._cs[r * n:(r + 1) * n] for r in range(self.shape[0])]
        result = []
        for row in rows:
            result.extend(self._multiexp(row, columns, workers))
        shape = tuple(self.shape[:-1]) + tuple(W.shape[1:])
        return self._like(result, shape, self.frac_bits + fk, bound)

    def rmatmul(self, other, frac_bits: int | None = None, *, workers=None) -> "EncryptedTensor":
        """``other @ self`` with a plaintext matrix or vector: out_i = sum_j X_ij [[a_j]]."""
        X = as_plain_tensor(other, "the plaintext matrix")
        if self.ndim not in (1, 2) or X.ndim not in (1, 2):
            raise ValueError(f"matmul supports 1-D and 2-D operands, got {tuple(X.shape)} @ {tuple(self.shape)}")
        n = self.shape[0]
        if X.shape[-1] != n:
            raise ValueError(f"shapes do not match for matmul: {tuple(X.shape)} @ {tuple(self.shape)}")
        ks, fk, _ = encode_multiplier(X, frac_bits)
        m = X.shape[0] if X.ndim == 2 else 1
        rows = [ks[i * n:(i + 1) * n] for i in range(m)]          # the exponents of output i
        rowsum = max((sum(abs(k) for k in row) for row in rows), default=0)
        bound = check_bound(self.bound * rowsum, self._pm, "this matrix product")
        kcols = self.shape[1] if self.ndim == 2 else 1
        per_column = [self._multiexp(self._cs[c::kcols], rows, workers) for c in range(kcols)]
        result = [per_column[c][i] for i in range(m) for c in range(kcols)]
        shape = tuple(X.shape[:-1]) + tuple(self.shape[1:])
        return self._like(result, shape, self.frac_bits + fk, bound)

    def _multiexp(self, bases, columns, workers):
        if workers is not None:
            return workers.multiexp_columns(self._pm, bases, columns)
        return arith.multiexp_columns(bases, columns, self._pm.nsquare)

    def sum(self, dim: int | None = None, keepdim: bool = False) -> "EncryptedTensor":
        """Sum over ``dim`` (all elements if None): the product of the ciphertexts along it."""
        nsq = self._pm.nsquare
        if dim is None:
            size = len(self._cs)
            bound = check_bound(self.bound * size, self._pm, "this sum")
            shape = (1,) * self.ndim if keepdim else ()
            return self._like([arith.product_raw(self._cs, nsq)], shape, bound=bound)
        dim = _normalise_dim(dim, self.ndim)
        size = self.shape[dim]
        bound = check_bound(self.bound * size, self._pm, "this sum")
        arr = np.moveaxis(self._array(), dim, -1)
        rest = arr.shape[:-1]
        rows = arr.reshape(-1, size) if size else np.empty((_numel(rest), 0), dtype=object)
        cs = [arith.product_raw(list(row), nsq) for row in rows]
        shape = list(self.shape)
        if keepdim:
            shape[dim] = 1
        else:
            del shape[dim]
        return self._like(cs, shape, bound=bound)

    def mean(self, dim: int | None = None, keepdim: bool = False,
             precision_bits: int = MEAN_PRECISION_BITS) -> "EncryptedTensor":
        """Mean over ``dim``: the sum times 1/size.

        For a power-of-two size this is exact and free (only f grows);
        otherwise 1/size is encoded as round(2^h / size) with
        h = precision_bits + bitlength(size), a relative error <= 2^-(precision_bits+1).
        """
        size = len(self._cs) if dim is None else self.shape[_normalise_dim(dim, self.ndim)]
        if size == 0:
            raise ValueError("mean of an empty dimension")
        total = self.sum(dim, keepdim)
        if size & (size - 1) == 0:
            return total._like(total._cs, total.shape, total.frac_bits + size.bit_length() - 1, total.bound)
        h = check_frac_bits(precision_bits, "precision_bits") + size.bit_length()
        k = (2 * (1 << h) + size) // (2 * size)           # round(2^h / size)
        z = (k & -k).bit_length() - 1                     # strip trailing zeros: shorter exponent
        k >>= z
        bound = check_bound(total.bound * k, self._pm, "this mean")
        return total._like(arith.mul_common_raw(total._cs, k, self._pm.nsquare), total.shape,
                           total.frac_bits + h - z, bound)

    def with_frac_bits(self, frac_bits: int) -> "EncryptedTensor":
        """Reinterpret the same integers with another scale (divides the values by 2^(new - old))."""
        return self._like(self._cs, self.shape, check_frac_bits(frac_bits), self.bound, self.obfuscated)

    def rerandomize(self, pool: ObfuscatorPool | None = None) -> "EncryptedTensor":
        """The same plaintexts under fresh randomness: [[m]] s for a new obfuscator s each."""
        pool = _pool_for(pool, self._pm)
        cs = arith.add_raw(self._cs, pool.take(len(self._cs)), self._pm.nsquare)
        return self._like(cs, self.shape, obfuscated=True)

    # ------------------------------------------------------------- operators
    def __add__(self, other):
        return self.add(other)

    def __radd__(self, other):
        return self.add(other)

    def __sub__(self, other):
        return self.sub(other)

    def __rsub__(self, other):
        return self.neg().add(other)

    def __neg__(self):
        return self.neg()

    def __mul__(self, other):
        return self.mul(other)

    def __rmul__(self, other):
        return self.mul(other)

    def __truediv__(self, other):
        if isinstance(other, EncryptedTensor):
            raise TypeError("Paillier cannot divide by a ciphertext")
        return self.div(other)

    def __matmul__(self, other):
        if isinstance(other, EncryptedTensor):
            raise TypeError("Paillier cannot multiply two ciphertexts")
        return self.matmul(other)

    def __rmatmul__(self, other):
        return self.rmatmul(other)


def declared_bound(max_abs, frac_bits: int) -> int:
    """ceil(max_abs 2^frac_bits): the fixed-point bound implied by a declared |x| <= max_abs."""
    try:
        v = Fraction(max_abs)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"max_abs must be a real number, got {max_abs!r}") from exc
    if v < 0 or not math.isfinite(float(max_abs)):
        raise ValueError(f"max_abs must be a finite non-negative number, got {max_abs!r}")
    return math.ceil(v * (1 << frac_bits))


def _normalise_dim(dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1) or ndim == 0:
        raise IndexError(f"dimension {dim} out of range for a {ndim}-d encrypted tensor")
    return dim % ndim


def _pool_for(pool: ObfuscatorPool | None, pm: PublicMath) -> ObfuscatorPool:
    if pool is None:
        return default_pool(pm.key)
    if public_math(pool.public_key).n != pm.n:
        raise KeyMismatchError("the obfuscator pool belongs to another public key")
    return pool


def encrypt(public_key: PaillierPublicKey, x, frac_bits: int = DEFAULT_FRAC_BITS, **kwargs) -> EncryptedTensor:
    """Shorthand for ``EncryptedTensor.encrypt``."""
    return EncryptedTensor.encrypt(public_key, x, frac_bits, **kwargs)


def decrypt(private_key: PaillierPrivateKey, tensor: EncryptedTensor, **kwargs) -> torch.Tensor:
    """Shorthand for ``tensor.decrypt(private_key)``."""
    if not isinstance(tensor, EncryptedTensor):
        raise TypeError(f"expected an EncryptedTensor, got {type(tensor).__name__}")
    return tensor.decrypt(private_key, **kwargs)


__all__ = ["EncryptedTensor", "MEAN_PRECISION_BITS", "declared_bound", "decrypt", "encrypt"]
