"""Exact federated PCA: subspace iteration on the pooled matrix, one sum over the parties per round.

The pooled sample-space matrix is a sum over the parties,
A = X X^T = sum_i X_i X_i^T, so its product with a block Q (n x b) is

    A Q = sum_i X_i (X_i^T Q),

an n x b part per party summed over the federation (``vfltorch.comm``): a
pairwise tree, star or ring sum, or, with ``secure=True`` (the default), a
masked ring sum (``vfltorch.comm.secure_sum``) at the first party followed
by a tree broadcast, so that no party sees another's part. Round t:

    Y = sum_i X_i (X_i^T Q_t)                (the one exchange)
    Rayleigh-Ritz: eig(Q_t^T Y) -> Ritz pairs (U, theta) of A in span(Q_t)
    stop when ||A u_j - theta_j u_j|| <= tol * theta_1 for j <= k
    Q_{t+1} = orth(Y)

Every party holds the same Q and Y, so every party computes the same Ritz
vectors; the stop decision is agreed by a one-number minimum over the
parties. The block has b = k + ``oversample`` columns (from the shared seed):
the error falls like (theta_{b+1} / theta_k)^t. The result is the pooled
PCA's leading subspace to the tolerance: this is not an approximation of
the method, it is the method, federated.
"""

from __future__ import annotations

import secrets
import time

import torch

from ..comm import Federation, MaskStream, allreduce, secure_allreduce
from ..data import VFLInputError
from .base import FederatedPCABase
from .linalg import align_signs, center_columns, orthonormalize, rayleigh_ritz, shared_start

SUM_TOPOLOGIES = ("tree", "star", "ring")


def federated_sum(fed: Federation, part: torch.Tensor, parties, *, secure: bool, topology: str = "tree",
                  stream: MaskStream | None = None) -> torch.Tensor:
    """sum_i part_i at every party of ``parties``: a plain all-reduce, or a masked sum + tree broadcast."""
    if len(parties) == 1:
        return part
    if not secure:
        return allreduce(fed, part, topology, parties=parties)
    return secure_allreduce(fed, part, parties=parties, root=parties[0], stream=stream)


class ExactFederatedPCA(FederatedPCABase):
    """Exact federated PCA by subspace iteration (see the module docstring).

    Parameters: ``n_components`` (k); ``oversample`` (extra block columns, default
    min(10, n - k)); ``tol`` (relative residual, default 1e-10); ``max_rounds``;
    ``secure`` (masked sums, default True) or ``sum_topology`` ('tree', 'star',
    'ring') for a plain all-reduce; ``center``; ``seed`` (the shared start block);
    ``mask_seed`` (this party's private mask seed; default: drawn from the OS).

    Attributes: ``components_`` (n x k), ``eigenvalues_`` (of X X^T), ``loadings_``,
    ``history_`` (the k Ritz vectors after each round), ``residuals_``,
    ``rounds_``, ``converged_``, ``bytes_``, ``fit_seconds_``, explained variance.
    """

    method = "exact"

    def __init__(self, n_components: int = 1, *, oversample: int | None = None, tol: float = 1e-10,
                 max_rounds: int = 1000, secure: bool = True, sum_topology: str = "tree", center: bool = True,
                 seed: int = 0, mask_seed: int | None = None):
        self.n_components = n_components
        self.oversample = oversample
        self.tol = tol
        self.max_rounds = max_rounds
        self.secure = secure
        self.sum_topology = sum_topology
        self.center = center
        self.seed = seed
        self.mask_seed = mask_seed

    def fit(self, X: torch.Tensor | None = None, fed: Federation | None = None, parties=None) -> "ExactFederatedPCA":
        if self.sum_topology not in SUM_TOPOLOGIES:
            raise VFLInputError(f"unknown sum topology {self.sum_topology!r}: "
                                f"choose one of {', '.join(SUM_TOPOLOGIES)}")
        if not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise VFLInputError(f"max_rounds must be a positive integer, got {self.max_rounds!r}")
        fed, parties, X, n = self._setup(X, fed, parties)
        if fed.rank not in parties:        # the coordinator, if any, has nothing to do here
            self.components_, self.loadings_, self.bytes_, self.messages_, self.rounds_ = None, None, 0, 0, 0
            return self
        started = time.perf_counter()
        k = self.n_components
        Xc, self.mean_ = center_columns(X) if self.center else (X, torch.zeros(X.shape[1], dtype=X.dtype,
                                                                                  device=X.device))
        extra = min(10, n - k) if self.oversample is None else int(self.oversample)
        b = max(k, min(n, k + max(extra, 0)))
        stream = MaskStream(secrets.randbits(62) if self.mask_seed is None else self.mask_seed, fed.rank)
        Q = orthonormalize(shared_start(n, b, self.seed, 0, device=X.device, positive=False))
        history, residuals, converged = [], [], False
        with fed.phase(f"pca/{self.method}"):
            for t in range(1, self.max_rounds + 1):
                Y = federated_sum(fed, Xc @ (Xc.T @ Q), parties, secure=self.secure, topology=self.sum_topology,
                                  stream=stream)
                U, theta, AU = rayleigh_ritz(Q, Y)
                r = torch.linalg.vector_norm(AU[:, :k] - U[:, :k] * theta[:k], dim=0)
                scale = theta[0].abs().clamp_min(torch.finfo(theta.dtype).tiny)
                residual = float((r / scale).max())
                history.append(U[:, :k])
                residuals.append(residual)
                # Agree on stopping (every party computed the same numbers; the minimum makes it certain).
                vote = torch.tensor([1.0 if residual <= self.tol else 0.0], dtype=torch.float64, device=X.device)
                if len(parties) > 1:
                    vote = allreduce(fed, vote, "tree", add=torch.minimum, parties=parties)
                if vote.item() == 1.0:
                    converged = True
                    break
                Q = orthonormalize(Y)
        self.eigenvalues_ = theta[:k]
        self.history_, self.residuals_, self.converged_ = history, residuals, converged
        self.rounds_ = len(history)
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        # Eigenvectors have no sign: orient them as a power iteration from the shared positive start would.
        U = align_signs(U[:, :k].contiguous(), shared_start(n, k, self.seed, 1, device=X.device))
        self._finish(fed, parties, Xc, U)
        return self
