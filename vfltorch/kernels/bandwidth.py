"""The kernel width sigma by the median heuristic, computed federatedly.

RBF: sigma = sqrt(median ||x_a - x_b||^2 / 2) over random pairs of training
rows, so that k(x_a, x_b) = exp(-||x_a - x_b||^2 / (2 sigma^2)) is exp(-1)
for the median pair: neither all near 0 nor all near 1. Laplace: sigma =
median ||x_a - x_b||_1, so that exp(-||x_a - x_b||_1 / sigma) is exp(-1) too.

A (squared or L1) distance is a sum of per-party parts, e.g.
||x_a - x_b||^2 = sum_l ||(x_a)_l - (x_b)_l||^2, so every party computes its
parts for the same seeded pairs and the parts are added with ring masks
(``vfltorch.comm.secure_sum``) at the active party, which takes the median and
broadcasts sigma. The pairs are disjoint (each sampled row appears in one pair
only), so the active party learns P distances between unrelated rows and
cannot triangulate rows from them; the other parties learn sigma only.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..comm import Federation, MaskStream, secure_sum
from ..data.validation import VFLInputError
from ..devices import to_numpy


def median_pairs(n: int, pairs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``pairs`` disjoint random pairs of rows (a_p, b_p), the same at every party."""
    count = min(int(pairs), n // 2)
    if count < 1:
        raise VFLInputError(f"the median heuristic needs at least 2 training rows, got {n}: pass a sigma")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed) % (2 ** 63)))
    return perm[:count], perm[count:2 * count]


def median_sigma(fed: Federation, X: torch.Tensor, *, seed: int, pairs: int = 1000,
                 mask_seed: int | None = None, kernel: str = "rbf") -> float:
    """The median-heuristic sigma over all parties' columns; every party gets the same value."""
    a, b = median_pairs(X.shape[0], pairs, seed)
    a, b = a.to(X.device), b.to(X.device)
    diff = (X[a] - X[b]).to(torch.float64)
    part = diff.abs().sum(dim=1) if kernel == "laplace" else (diff ** 2).sum(dim=1)
    with fed.phase("fdskl/sigma"):
        if fed.num_parties > 1:
            stream = MaskStream(seed if mask_seed is None else mask_seed, fed.rank)
            total = secure_sum(fed, part, out=fed.active, stream=stream)
        else:
            total = part
        sigma = None
        error = None
        if fed.is_active:
            d2 = to_numpy(total)
            med = float(np.median(d2))
            if med <= 0:
                positive = d2[d2 > 0]
                med = float(positive.mean()) if positive.size else 0.0
            if med > 0 and math.isfinite(med):
                sigma = med if kernel == "laplace" else math.sqrt(med / 2.0)
            else:
                error = ("the median heuristic found no two distinct training rows among the sampled pairs: "
                         "pass a kernel width (--sigma VALUE / sigma=VALUE)")
        verdict = fed.broadcast_json({"sigma": sigma, "error": error}, fed.active, ranks=fed.parties)
    if verdict["error"]:
        raise VFLInputError(verdict["error"])
    return float(verdict["sigma"])
