"""The paper's synthetic data: single- and mixture-Gaussian matrices of shape [features, samples].

As in the reference implementation (``utils.get_guas_data``), feature j has a
centre mu_j and a width sigma_j; its n values are the Gaussian density
N(x; mu_j, sigma_j) at n points x drawn uniformly from [mu_j - 3 sigma_j,
mu_j + 3 sigma_j]. ``single``: mu_j = 0, sigma_j = 1 for every feature.
``mixture``: mu_j, sigma_j ~ U(0, m) with m features, so the features' scales
1 / sigma_j differ widely. Returned as samples x features (n x m), float64,
from a seeded generator (the reference draws from Python's unseeded
``random``).
"""

from __future__ import annotations

import math

import torch

PATTERNS = ("single", "mixture")

# The paper's shapes, [features, samples].
PAPER_SHAPES = [(1000, 200), (2000, 400), (5000, 1000), (10000, 2000), (20000, 4000)]


BLOCK = 256  # columns drawn from one generator: a party can draw its own columns alone


def gaussian_data(n_features: int, n_samples: int, pattern: str = "mixture", *, seed: int = 0,
                  columns=None) -> torch.Tensor:
    """An n_samples x n_features matrix of Gaussian densities (see the module docstring).

    ``columns`` (indices) returns only those columns, identical to the same
    columns of the whole matrix: the centres and widths come from one
    generator, the points of every block of 256 columns from their own, so a
    party of a simulated federation draws its own columns without the rest.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}: choose 'single' or 'mixture'")
    m = n_features
    columns = torch.arange(m) if columns is None else torch.as_tensor(columns, dtype=torch.long).reshape(-1)
    if pattern == "mixture":
        g = torch.Generator().manual_seed(int(seed))
        mu = torch.rand(m, generator=g, dtype=torch.float64) * m
        # U(0, m) as in the reference; the tiny floor only keeps an (improbable) zero width finite.
        sigma = (torch.rand(m, generator=g, dtype=torch.float64) * m).clamp_min(1e-9)
    else:
        mu = torch.zeros(m, dtype=torch.float64)
        sigma = torch.ones(m, dtype=torch.float64)
    z = torch.empty(n_samples, len(columns), dtype=torch.float64)
    blocks = columns // BLOCK
    for b in torch.unique(blocks).tolist():
        gb = torch.Generator().manual_seed(int(seed) * 1_000_003 + 7_919 * (b + 1))
        width = min(BLOCK, m - b * BLOCK)
        draw = 2.0 * torch.rand(n_samples, width, generator=gb, dtype=torch.float64) - 1.0
        mine = blocks == b
        z[:, mine] = draw[:, columns[mine] - b * BLOCK]
    mu, sigma = mu[columns], sigma[columns]
    x = mu + z * 3.0 * sigma
    return torch.exp(-((x - mu) ** 2) / (2.0 * sigma ** 2)) / (math.sqrt(2.0 * math.pi) * sigma)
