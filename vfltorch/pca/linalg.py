"""Local linear algebra of one party: centring, orthonormalisation, (block) power iteration.

Everything here runs inside one party on its own tensors; nothing talks to
the federation. Sample space is the shared space: a party holding X_i
(n x f_i) works with the n x n matrix A_i = X_i X_i^T, which is never formed,
only applied as ``X_i @ (X_i.T @ Q)`` (O(n f_i k) instead of O(n^2 f_i)).
"""

from __future__ import annotations

from typing import Callable

import torch

Operator = Callable[[torch.Tensor], torch.Tensor]


def center_columns(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract each column's mean: (X - 1 mean^T, mean).

    Column centring is local: the pooled centred matrix [X_1 - 1 m_1^T, ...,
    X_Q - 1 m_Q^T] is the centred pooled matrix, so the pooled sample-space
    covariance is the sum of the parties' ones, sum_i X_ic X_ic^T.
    """
    mean = X.mean(dim=0)
    return X - mean, mean


def gram_operator(X: torch.Tensor) -> Operator:
    """Q -> A Q with A = X X^T, without forming the n x n matrix."""
    return lambda Q: X @ (X.T @ Q)


def matrix_operator(A: torch.Tensor) -> Operator:
    """Q -> A Q for an explicit (kernel) matrix."""
    return lambda Q: A @ Q


def orthonormalize(Y: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis of span(Y) by QR, with the signs fixed so that diag(R) >= 0.

    With diag(R) >= 0 each column keeps the direction of the corresponding
    Gram-Schmidt step, so for one column this is exactly ``y / ||y||``
    (Algorithm 1's normalisation) and signs never flip at random.
    """
    if Y.shape[1] == 1:
        norm = torch.linalg.vector_norm(Y)
        return Y / norm if norm > 0 else Y
    Q, R = torch.linalg.qr(Y)
    d = torch.sign(torch.diagonal(R))
    d = torch.where(d == 0, torch.ones_like(d), d)
    return Q * d


def rayleigh_ritz(Q: torch.Tensor, AQ: torch.Tensor,
                  k: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best eigenpairs of A within span(Q) (Q orthonormal, AQ = A Q): (U, theta, AU), theta descending.

    Each Ritz vector keeps the sign of the basis column it is closest to, so
    the rotation changes no sign for one column and is deterministic otherwise.
    """
    B = Q.T @ AQ
    theta, W = torch.linalg.eigh((B + B.T) / 2)
    theta, W = theta.flip(0), W.flip(1)
    # Orient each Ritz vector towards the basis column with which it overlaps most.
    lead = W.abs().argmax(dim=0)
    signs = torch.sign(W[lead, torch.arange(W.shape[1], device=W.device)])
    W = W * torch.where(signs == 0, torch.ones_like(signs), signs)
    if k is not None:
        theta, W = theta[:k], W[:, :k]
    return Q @ W, theta, AQ @ W


def power_iteration(apply_A: Operator, start: torch.Tensor, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 (local power iteration), for a block of k vectors.

    ``a <- A a / ||A a||`` repeated ``iters`` times; for k > 1 the block is
    re-orthonormalised (QR) after each product, so the columns converge to
    the k leading eigenvectors (block power / subspace iteration). The
    eigenvalues are the Rayleigh quotients alpha_j = a_j^T A a_j; a final
    Rayleigh-Ritz step orders the k columns by them (a no-op for k = 1).

    For a positive semi-definite A and one column, a^T start >= 0 holds at
    every step (start^T A^t start >= 0): parties that start from the same
    vector return eigenvectors with consistent signs, which the merge needs.
    """
    if iters < 1:
        raise ValueError(f"the local power iteration needs at least 1 iteration, got {iters}")
    Q = orthonormalize(start)
    for _ in range(iters):
        Q = orthonormalize(apply_A(Q))
    U, alpha, _ = rayleigh_ritz(Q, apply_A(Q))
    return U, alpha


DENSE_LIMIT = 1500   # up to this size a full symmetric eigensolver is cheap enough


def float_work(flops: float) -> float:
    """Dense float work (eigensolves, products) in the units of ``Federation.expect_work``, whose rate is measured
    on ring products: LAPACK / BLAS run about ten float operations in the time of one ring product here."""
    return flops / 10


def top_eigenpairs(A: torch.Tensor, k: int, reference: torch.Tensor | None = None, *,
                   tol: float = 1e-11, max_iters: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """The k leading eigenpairs of a symmetric matrix, eigenvalues descending.

    Small matrices (n <= ``DENSE_LIMIT``) or large k: a dense solver. Otherwise
    block subspace iteration with Rayleigh-Ritz on k + 10 columns until every
    wanted residual ||A u_j - theta_j u_j|| <= tol * |theta_1| (O(n^2 k) per
    step instead of the O(n^3) of a full solve: 91 s of local eigensolve on
    abalone's 4177 x 4177 kernel was what made VFedAKPCA time out), falling
    back to the dense solver if it has not converged after ``max_iters``.
    Dense eigenvectors have arbitrary signs; with ``reference`` (n x k) each
    vector is flipped to have a non-negative inner product with its column.
    """
    A = (A + A.T) / 2
    n = A.shape[0]
    V = lam = None
    b = min(n, k + 10)
    if n > DENSE_LIMIT and 4 * b < n:
        g = torch.Generator(device="cpu").manual_seed(n * 7919 + k)
        Q = orthonormalize(torch.randn(n, b, generator=g, dtype=A.dtype).to(A.device))
        for _ in range(max_iters):
            Y = A @ Q
            U, theta, AU = rayleigh_ritz(Q, Y)
            r = torch.linalg.vector_norm(AU[:, :k] - U[:, :k] * theta[:k], dim=0)
            if float(r.max()) <= tol * float(theta.abs().max().clamp_min(torch.finfo(A.dtype).tiny)):
                V, lam = U[:, :k].contiguous(), theta[:k].contiguous()
                break
            Q = orthonormalize(Y)
    if V is None:
        lam, V = torch.linalg.eigh(A)
        lam, V = lam.flip(0)[:k], V.flip(1)[:, :k]
    if reference is not None:
        V = align_signs(V, reference)
    return V, lam


def align_signs(U: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Flip columns of U so that u_j^T r_j >= 0."""
    s = torch.sign((U * reference).sum(dim=0))
    return U * torch.where(s == 0, torch.ones_like(s), s)


def shared_start(n: int, k: int, seed: int, period: int, *, device, dtype=torch.float64,
                 positive: bool = True) -> torch.Tensor:
    """The start block every party draws from the shared seed (n x k), identical at every party.

    ``positive``: uniform on [0, 1), as the reference implementation's
    ``np.random.rand`` (a positive start orients every party's leading
    eigenvector the same way); otherwise standard normal (subspace iteration).
    """
    g = torch.Generator(device="cpu")
    g.manual_seed((int(seed) * 1_000_003 + 104_729 * (int(period) + 1)) % (2 ** 63))
    draw = torch.rand if positive else torch.randn
    return draw((n, k), generator=g, dtype=dtype).to(device)
