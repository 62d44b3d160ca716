"""Exact federated kernel PCA for kernels of inner products: sum the Gram matrices, then evaluate.

Linear, polynomial, sigmoid and RBF kernels are functions of the pooled Gram
matrix G = X X^T = sum_i X_i X_i^T (``kernels.py``; for RBF,
K = prod_i exp(-gamma D_i) = exp(-gamma D) with D computed from G). So:

1. every party computes G_i = X_i X_i^T (n x n) from its own columns;
2. the parts are summed at one party, the *kernel holder* (the first party):
   by a masked ring sum (``secure=True``, the default: no party sees another's
   G_i) or a plain reduction over a tree / star / ring;
3. the kernel holder evaluates K = k(G), centres it (H K H) and takes its k
   leading eigenpairs (U, lambda) with a dense solver;
4. U and lambda go back to every party down the pairwise tree; each party
   projects its own data, Z_i = X_i^T U.

One communication round, n^2 numbers per party. What it reveals: the kernel
holder learns the pooled Gram matrix G, that is, every inner product and
distance between samples over all features: the pooled data up to an
orthogonal transformation of the feature space. That is what any exact
kernel PCA needs (the kernel matrix itself is a function of G, and for RBF
determines D, hence the centred G), so it suits parties that accept the
sample geometry being known to the holder, not parties whose columns must
stay secret as a set. The other parties learn only U and lambda. See
docs/pca.md.
"""

from __future__ import annotations

import secrets
import time

import torch

from ..comm import Federation, MaskStream, broadcast, build, pairwise_tree, reduce, secure_sum
from ..data import VFLInputError
from .base import FederatedPCABase
from .exact import SUM_TOPOLOGIES
from .kernels import center_kernel, check_kernel, kernel_from_gram
from .linalg import shared_start, top_eigenpairs


class ExactFederatedKernelPCA(FederatedPCABase):
    """Exact kernel PCA of the pooled data (see the module docstring).

    Parameters: ``n_components``; ``kernel`` ('linear', 'rbf', 'poly', 'sigmoid'),
    ``gamma`` (default 1 / total features; 'scale': 1 / (F var(X))), ``degree``, ``coef0``; ``secure``
    (masked sum, default True) or ``sum_topology`` for a plain reduction;
    ``seed`` (sign reference); ``mask_seed``.

    Attributes: ``components_`` (n x k), ``eigenvalues_`` (of the centred kernel),
    ``loadings_`` (Z_i = X_i^T U), ``gamma_``, ``rounds_`` (1), ``bytes_``,
    ``fit_seconds_``.
    """

    method = "exact-kernel"
    linear = False

    def __init__(self, n_components: int = 1, *, kernel: str = "rbf", gamma: float | str | None = None,
                 degree: int = 3, coef0: float = 1.0, secure: bool = True, sum_topology: str = "tree", seed: int = 0,
                 mask_seed: int | None = None):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.secure = secure
        self.sum_topology = sum_topology
        self.seed = seed
        self.mask_seed = mask_seed

    def fit(self, X: torch.Tensor | None = None, fed: Federation | None = None,
            parties=None) -> "ExactFederatedKernelPCA":
        check_kernel(self.kernel)
        if self.sum_topology not in SUM_TOPOLOGIES:
            raise VFLInputError(f"unknown sum topology {self.sum_topology!r}: "
                                f"choose one of {', '.join(SUM_TOPOLOGIES)}")
        fed, parties, X, n = self._setup(X, fed, parties)
        if fed.rank not in parties:
            self.components_, self.loadings_, self.bytes_, self.messages_, self.rounds_ = None, None, 0, 0, 0
            return self
        started = time.perf_counter()
        k = self.n_components
        self.gamma_ = self._kernel_gamma(fed, parties, X)
        holder = parties[0]
        G_part = X @ X.T
        with fed.phase(f"pca/{self.method}"):
            if len(parties) == 1:
                G = G_part
            elif self.secure:
                stream = MaskStream(secrets.randbits(62) if self.mask_seed is None else self.mask_seed, fed.rank)
                G = secure_sum(fed, G_part, out=holder, stream=stream, parties=parties)
            else:
                G = reduce(fed, G_part, build(self.sum_topology, parties, root=holder))
            block = None
            if fed.rank == holder:
                K = center_kernel(kernel_from_gram(G, self.kernel, gamma=self.gamma_, degree=self.degree,
                                                   coef0=self.coef0))
                U, lam = top_eigenpairs(K, k, reference=shared_start(n, k, self.seed, 1, device=X.device))
                block = torch.cat([U, lam[None, :]])
            block = broadcast(fed, block, pairwise_tree(parties), shape=(n + 1, k), dtype=torch.float64)
        block = block.to(X.device)
        U, self.eigenvalues_ = block[:n].contiguous(), block[n].contiguous()
        self.history_ = [U]
        self.rounds_ = 1
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        self._finish(fed, parties, X, U)
        return self

    def transform(self, X=None, fed=None) -> torch.Tensor:
        """The training samples' kernel PCA scores, U sqrt(lambda) (no new samples: see base)."""
        if X is not None:
            return super().transform(X, fed)
        if not hasattr(self, "components_"):
            raise RuntimeError("ExactFederatedKernelPCA is not fitted yet: call fit first")
        return self.components_ * self.eigenvalues_.clamp_min(0).sqrt()
