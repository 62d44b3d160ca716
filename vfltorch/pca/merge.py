"""The merge of local eigenvectors: eigenvalue weights, weight scaling (Algorithm 4), weighted sum.

A merge takes the local eigenvectors of the members of a neighbourhood (the
server's: every client; a decentralised client's: its neighbours, Algorithm 5)
stacked as ``vectors`` (m x n x k) with their eigenvalues ``values`` (m x k),
and returns

    u_j = orth( sum_i w_ij a_ij ),    w_ij = alpha_ij / sum_l alpha_lj       (Algorithm 2)

column by column (j = 1..k). ``orth`` normalises (k = 1) or orthonormalises by
QR with diag(R) >= 0 (k > 1), so the merged directions are unit vectors;
the paper's u is the raw weighted sum, whose direction is the same.

VFedAKPCA weights by sqrt(lambda) instead of lambda (``weight_power=0.5``).
"""

from __future__ import annotations

import torch

from .linalg import orthonormalize


def eigenvalue_weights(values: torch.Tensor, power: float = 1.0) -> torch.Tensor:
    """w_ij = alpha_ij^power / sum_l alpha_lj^power (columns sum to 1)."""
    v = values.clamp_min(0.0) ** power
    total = v.sum(dim=0, keepdim=True)
    # A column of all-zero eigenvalues (no variance anywhere) falls back to equal weights.
    equal = torch.full_like(v, 1.0 / v.shape[0])
    return torch.where(total > 0, v / torch.where(total > 0, total, torch.ones_like(total)), equal)


def scale_weights(weights: torch.Tensor) -> torch.Tensor:
    """Algorithm 4 (weight scaling), per column.

    eta = mean of the weights (1/m for weights summing to 1); the floor(m/2)
    members with the largest weights get (1 + eta) w, the others (1 - eta) w.
    The result is not renormalised (as in the paper; the merged vector is
    normalised anyway). A neighbourhood of one member is left as it is: the
    rule would give it weight 1 - 1 = 0.
    """
    m = weights.shape[0]
    if m < 2:
        return weights.clone()
    eta = weights.mean(dim=0, keepdim=True)
    order = torch.argsort(weights, dim=0, descending=True, stable=True)
    enhanced = torch.zeros_like(weights, dtype=torch.bool)
    enhanced.scatter_(0, order[: m // 2], True)
    return torch.where(enhanced, (1 + eta) * weights, (1 - eta) * weights)


def merge_weights(values: torch.Tensor, *, weight_scaling: bool = False, power: float = 1.0) -> torch.Tensor:
    """The weights a merge applies to its members' eigenvectors (m x k)."""
    w = eigenvalue_weights(values, power)
    return scale_weights(w) if weight_scaling else w


def merge(vectors: torch.Tensor, values: torch.Tensor, *, weight_scaling: bool = False,
          power: float = 1.0) -> torch.Tensor:
    """u = orth(sum_i w_i a_i) over the members (see the module docstring): n x k."""
    w = merge_weights(values, weight_scaling=weight_scaling, power=power)
    return orthonormalize((w[:, None, :] * vectors).sum(dim=0))


def equal_merge(vectors: torch.Tensor) -> torch.Tensor:
    """The reference code's 'isolated' baseline: the plain average of the local eigenvectors."""
    return orthonormalize(vectors.mean(dim=0))
