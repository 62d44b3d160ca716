"""The merge of local eigenvectors: eigenvalue weights, weight scaling (Algorithm 4), weighted sum.

A merge takes the local eigenvectors of the members of a neighbourhood (the
server's: every client; a decentralised client's: its neighbours, Algorithm 5)
stacked as ``vectors`` (m x n x k) with their eigenvalues ``values`` (m x k),
and returns

    u_j = orth( sum_i w_ij a_ij ),    w_ij = alpha_ij / sum_l alpha_lj       (Algorithm 2)

column by column (j = 1..k). ``orth`` normalises (k = 1) or orthonormalises by
QR with diag(R) >= 0 (k > 1), so the merged directions are unit vectors;
the paper's u is the raw weighted sum, whose direction is the same. This is
``mode="paper"``, kept for reproduction: it depends on the signs of the
local vectors, which nothing fixes once the columns are centred (a centred
eigenvector is orthogonal to the all-ones vector, so a positive start no
longer orients it), and opposite signs cancel.

``mode="subspace"`` (the default) is sign-free: the merged block is the k
leading eigenvectors of

    M = sum_i sum_j c_ij a_ij a_ij^T,    c_ij = w_ij * sum_l alpha_lj,

that is of the sum of the members' weighted rank-one projectors. Flipping
any a_ij leaves M, hence the result, unchanged. The column factor sum_l
alpha_lj undoes the per-column normalisation of the weights, so that for
k > 1 the members' components keep their relative sizes (with the plain
eigenvalue weights M = sum_i a_i diag(alpha_i) a_i^T, the sum of the members'
rank-k approximations of A_i, whose eigenvectors estimate those of
A = sum_i A_i); for k = 1 it is a constant and M = sum_i w_i a_i a_i^T. M is
never formed: the eigenvectors are the left singular vectors of the n x mk
block [sqrt(c_ij) a_ij]. Their signs are fixed by ``reference`` (u_j^T r_j >= 0;
the federated estimators pass the shared positive start) or, without one, by
making each column's largest entry positive.

VFedAKPCA weights by sqrt(lambda) instead of lambda (``weight_power=0.5``).

Both merges are linear in the members' vectors: U = sum_i a_i C_i with a k x k block C_i per member
(``merge_with_coefficients``). VFedAKPCA's ``transform`` of new rows applies the same C_i to each
member's own extension of its vectors to the new rows.
"""

from __future__ import annotations

import torch

from .linalg import orthonormalize

MERGES = ("subspace", "paper")


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


def check_merge(mode: str) -> str:
    if mode not in MERGES:
        raise ValueError(f"unknown merge {mode!r}: choose 'subspace' (sign-free, default) or 'paper' "
                         f"(the paper's weighted sum, which depends on the local vectors' signs)")
    return mode


def column_signs(U: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
    """The sign (+-1) per column that ``orient_columns`` multiplies by."""
    if reference is not None:
        s = torch.sign((U * reference.to(U.device, U.dtype)).sum(dim=0))
    else:
        lead = U.abs().argmax(dim=0)
        s = torch.sign(U[lead, torch.arange(U.shape[1], device=U.device)])
    return torch.where(s == 0, torch.ones_like(s), s)


def orient_columns(U: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
    """A fixed sign per column: u_j^T r_j >= 0 for ``reference``, else the largest |entry| positive."""
    return U * column_signs(U, reference)


def _subspace_block(vectors: torch.Tensor, values: torch.Tensor, weight_scaling: bool,
                    power: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The n x mk block [sqrt(c_ij) a_ij] whose left singular vectors are the merge, and sqrt(c) (m x k)."""
    m, n, k = vectors.shape
    w = merge_weights(values, weight_scaling=weight_scaling, power=power)
    c = (w * (values.clamp_min(0.0) ** power).sum(dim=0, keepdim=True)).clamp_min(0.0)
    if not bool((c > 0).any()):
        c = torch.ones_like(c)                  # no variance anywhere: every vector counts the same
    return (vectors * c.sqrt()[:, None, :]).permute(1, 0, 2).reshape(n, m * k), c.sqrt()


def subspace_merge(vectors: torch.Tensor, values: torch.Tensor, *, weight_scaling: bool = False,
                   power: float = 1.0, reference: torch.Tensor | None = None) -> torch.Tensor:
    """The k leading eigenvectors of sum_ij c_ij a_ij a_ij^T (see the module docstring): n x k, sign-free."""
    return merge_with_coefficients(vectors, values, weight_scaling=weight_scaling, power=power, mode="subspace",
                                   reference=reference)[0]


def merge(vectors: torch.Tensor, values: torch.Tensor, *, weight_scaling: bool = False,
          power: float = 1.0, mode: str = "subspace", reference: torch.Tensor | None = None) -> torch.Tensor:
    """The merged n x k block of the members (see the module docstring).

    ``mode="subspace"``: sign-free (default); ``mode="paper"``: u = orth(sum_i w_i a_i)
    (Algorithm 2 as written; ``reference`` is not used).
    """
    return merge_with_coefficients(vectors, values, weight_scaling=weight_scaling, power=power, mode=mode,
                                   reference=reference)[0]


def merge_with_coefficients(vectors: torch.Tensor, values: torch.Tensor, *, weight_scaling: bool = False,
                            power: float = 1.0, mode: str = "subspace",
                            reference: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge``'s block U (n x k) and the coefficients C (m x k x k) with U = sum_i vectors[i] @ C[i].

    ``paper``: U = Y R^-1 D for Y = sum_i a_i diag(w_i) = QR (D: the signs that make diag(R) >= 0; for one
    column R = ||y||), so C_i = diag(w_i) R^-1 D. ``subspace``: the block B = [a_ij sqrt(c_ij)] = P S W^T
    gives U = P_k D = B W_k S_k^-1 D, so C_i = diag(sqrt(c_i)) (W_k S_k^-1 D)[rows of member i]. A
    direction with no support (R or S singular there) gets coefficients 0: U has no combination for it.
    """
    check_merge(mode)
    m, n, k = vectors.shape
    if mode == "subspace":
        block, root_c = _subspace_block(vectors, values, weight_scaling, power)
        P, S, Wh = torch.linalg.svd(block, full_matrices=False)
        U0 = P[:, :k].contiguous()
        signs = column_signs(U0, reference)
        inv_s = torch.where(S[:k] > 0, 1.0 / torch.where(S[:k] > 0, S[:k], torch.ones_like(S[:k])),
                            torch.zeros_like(S[:k]))
        G = (Wh[:k].T * inv_s * signs).reshape(m, k, k)      # member i, its vector j, merged column
        return U0 * signs, root_c[:, :, None] * G
    w = merge_weights(values, weight_scaling=weight_scaling, power=power)
    Y = (w[:, None, :] * vectors).sum(dim=0)
    U = orthonormalize(Y)
    if k == 1:
        norm = torch.linalg.vector_norm(Y)
        R_inv = (1.0 / norm if norm > 0 else torch.ones_like(norm)).reshape(1, 1)
    else:
        R = torch.linalg.qr(Y)[1]
        d = torch.sign(torch.diagonal(R))
        d = torch.where(d == 0, torch.ones_like(d), d)
        R_inv = torch.linalg.pinv(R) * d                       # R^-1 D
    return U, torch.diag_embed(w) @ R_inv


def equal_merge(vectors: torch.Tensor) -> torch.Tensor:
    """The reference code's 'isolated' baseline: the plain average of the local eigenvectors."""
    return orthonormalize(vectors.mean(dim=0))
