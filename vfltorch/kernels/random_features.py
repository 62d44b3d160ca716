"""Random Fourier features, drawn entry by entry from a counter so that any column slice is exact.

Bochner's theorem: a shift-invariant kernel is the Fourier transform of a
probability density p(w),

    k(x, x') = E_{w ~ p, b ~ U[0, 2*pi)} [ phi_w(x) phi_w(x') ],
    phi_w(x) = sqrt(2) cos(w^T x + b)                   (Rahimi & Recht 2007)

* RBF   k = exp(-||x - x'||^2 / (2 sigma^2))  <->  w ~ N(0, sigma^-2 I)
* Laplace k = exp(-||x - x'||_1 / sigma)      <->  w_c ~ Cauchy(0, 1/sigma), i.i.d. per coordinate

FDSKL (Gu et al., Algorithm 1 line 4) draws w_i "with the random seed i" at
every worker, and each worker uses only the coordinates of its own columns.
Here entry (c, j) of the d x D matrix W (column c of the data, feature j) is a
pure function of (seed, c, j): a SplitMix64 hash of the counter
``j * 2**32 + c`` gives a uniform u in (0, 1), turned into N(0, 1) by the
inverse normal CDF or into Cauchy(0, 1) by tan(pi (u - 1/2)). So a party
generates exactly the rows of W for its own columns, in one vectorised pass
on its device, and they are bit-identical to the same rows of the
centralised draw whatever the column partition; no party ever generates
(or could be asked for) another party's slice. The phase words b_j of the
kept party are drawn the same way from that party's private key.

SplitMix64 (Steele, Lea & Flood 2014; the finaliser of Stafford's "Mix13")
passes BigCrush as a counter-based generator; its multiplications wrap mod
2**64 in int64 arithmetic, and the logical right shifts are emulated with
arithmetic shifts and a mask.
"""

from __future__ import annotations

import math

import torch

KERNELS = ("rbf", "laplace")

_GOLDEN = -7046029254386353131          # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687            # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685            # 0x94D049BB133111EB


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 words."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(counter: torch.Tensor, key: int) -> torch.Tensor:
    """SplitMix64 output for state ``key + (counter + 1) * golden`` (int64 words, wrap-around)."""
    z = (counter + 1) * _GOLDEN + _signed(key)
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def splitmix64_int(counter: int, key: int) -> int:
    """``splitmix64`` of one counter in Python integers (no tensor: a per-iteration draw, e.g. the keeper's),
    the same word read unsigned, in [0, 2**64)."""
    mask = 2 ** 64 - 1
    z = ((int(counter) + 1) * (_GOLDEN & mask) + int(key)) & mask
    z = ((z ^ (z >> 30)) * (_MIX1 & mask)) & mask
    z = ((z ^ (z >> 27)) * (_MIX2 & mask)) & mask
    return z ^ (z >> 31)


def _signed(v: int) -> int:
    v = int(v) % (2 ** 64)
    return v - 2 ** 64 if v >= 2 ** 63 else v


def counter_uniform(key: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Uniform (0, 1) float64 for every (row, col) pair: entry = f(key, row, col) only."""
    counter = (cols.to(torch.int64).unsqueeze(0) << 32) + rows.to(torch.int64).unsqueeze(1)
    bits = _shr(splitmix64(counter, key), 11)                    # 53 random bits
    return (bits.to(torch.float64) + 0.5) * 2.0 ** -53


def counter_words(key: int, index: torch.Tensor, bits: int) -> torch.Tensor:
    """Uniform ``bits``-bit words (int16, int32 or int64) indexed by ``index``: f(key, index) only."""
    z = splitmix64(index.to(torch.int64), key)
    if bits == 64:
        return z
    return (z >> (64 - bits)).to(torch.int32 if bits == 32 else torch.int16)   # the top bits, signed


def derive_key(*parts: int) -> int:
    """Mix several integers into one 64-bit key (seeds for separate purposes stay independent)."""
    z = torch.tensor([0], dtype=torch.int64)
    key = 0x243F6A8885A308D3                                     # pi's fraction: any fixed constant
    for p in parts:
        key = int(splitmix64(z + (int(p) % (2 ** 62)), key)[0])
    return key


class FourierSampler:
    """The random directions w_j of a shift-invariant kernel, entry (c, j) from the counter (seed, c, j).

    ``omega(columns, features)`` is W[columns][:, features] of the centralised
    d x D matrix. ``sigma`` is the kernel width (see the module docstring).
    """

    def __init__(self, kernel: str = "rbf", sigma: float = 1.0, seed: int = 0):
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"the kernel width sigma must be a positive number, got {sigma!r}")
        self.kernel = kernel
        self.sigma = float(sigma)
        self.seed = int(seed)
        self._key = derive_key(self.seed, 0x0FEA7)

    def omega(self, columns, features, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
        columns = torch.as_tensor(columns, dtype=torch.int64, device=device).reshape(-1)
        features = torch.as_tensor(features, dtype=torch.int64, device=device).reshape(-1)
        u = counter_uniform(self._key, columns, features)
        if self.kernel == "rbf":
            w = torch.special.ndtri(u)
        else:
            w = torch.tan(math.pi * (u - 0.5))
        return (w / self.sigma).to(dtype)

    def kernel_matrix(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """The exact kernel k(a_i, b_j) this sampler approximates (a reference for tests)."""
        if self.kernel == "rbf":
            return torch.exp(-torch.cdist(A, B) ** 2 / (2 * self.sigma ** 2))
        return torch.exp(-torch.cdist(A, B, p=1) / self.sigma)


def feature_map(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """phi(x) = sqrt(2) cos(W^T x + b) for every row of X (the centralised, unmasked map)."""
    return math.sqrt(2.0) * torch.cos(X @ W + b)
