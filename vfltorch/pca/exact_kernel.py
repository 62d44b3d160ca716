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

New rows (``transform(X_new)``): every party sends [X_new,i X_i^T | row norms
of X_new,i] (m x (n + 1)) into a masked sum at the holder, which evaluates the
cross-kernel from the pooled cross-Gram matrix (and, for RBF, the pooled
training diagonal it kept), centres it with the training kernel's means as
scikit-learn's ``KernelPCA`` does, projects on U / sqrt(lambda) and sends the
m x k scores down the tree. The holder thereby learns the new rows' inner
products with the training rows (their geometry, as for the training rows);
the other parties learn the scores only.

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

import numpy as np
import torch

from ..comm import Federation, MaskStream, broadcast, build, pairwise_tree, reduce, secure_sum
from ..data import VFLInputError
from ..devices import to_device, to_numpy
from .base import FederatedPCABase, as_tensor
from .exact import SUM_TOPOLOGIES
from .kernels import center_cross_kernel, center_kernel, check_kernel, cross_kernel_from_gram, kernel_from_gram
from .linalg import float_work, shared_start, top_eigenpairs


class ExactFederatedKernelPCA(FederatedPCABase):
    """Exact kernel PCA of the pooled data (see the module docstring).

    Parameters: ``n_components``; ``kernel`` ('linear', 'rbf', 'poly', 'sigmoid'),
    ``gamma`` (default 1 / total features; 'scale': 1 / (F var(X))), ``degree``, ``coef0``; ``secure``
    (masked sum, default True) or ``sum_topology`` for a plain reduction;
    ``seed`` (sign reference); ``mask_seed``.

    Attributes (arrays: numpy, on the host): ``sample_components_`` (n x k), ``eigenvalues_`` (of the centred kernel),
    ``loadings_`` (Z_i = X_i^T U), ``gamma_``, ``rounds_`` (1), ``bytes_``,
    ``fit_seconds_``.
    """

    method = "exact-kernel"
    linear = False

    def __init__(self, n_components: int = 1, *, kernel: str = "rbf", gamma: float | str | None = None,
                 degree: int = 3, coef0: float = 1.0, secure: bool = True, sum_topology: str = "tree", seed: int = 0,
                 mask_seed: int | None = None, fed: Federation | None = None):
        self.n_components = n_components
        self.fed = fed
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.secure = secure
        self.sum_topology = sum_topology
        self.seed = seed
        self.mask_seed = mask_seed

    def _fit(self, X: torch.Tensor | None, fed: Federation | None, parties) -> "ExactFederatedKernelPCA":
        check_kernel(self.kernel)
        if self.sum_topology not in SUM_TOPOLOGIES:
            raise VFLInputError(f"unknown sum topology {self.sum_topology!r}: "
                                f"choose one of {', '.join(SUM_TOPOLOGIES)}")
        fed, parties, X, n = self._setup(X, fed, parties)
        if fed.rank not in parties:
            self._sample_components_, self._loadings_, self.bytes_, self.messages_, self.rounds_ = None, None, 0, 0, 0
            return self
        started = time.perf_counter()
        k = self.n_components
        self.gamma_ = self._kernel_gamma(fed, parties, X)
        holder = parties[0]
        G_part = X @ X.T
        # The holder's n x n eigensolve (about n^3 float operations) runs while the others wait for its broadcast:
        # announced, so that their waits follow the work (Federation.expect_work).
        with fed.phase(f"pca/{self.method}"), fed.expect_work(float_work(n ** 3), "the kernel eigensolve"):
            if len(parties) == 1:
                G = G_part
            elif self.secure:
                stream = MaskStream(secrets.randbits(62) if self.mask_seed is None else self.mask_seed, fed.rank)
                G = secure_sum(fed, G_part, out=holder, stream=stream, parties=parties)
            else:
                G = reduce(fed, G_part, build(self.sum_topology, parties, root=holder))
            block = None
            if fed.rank == holder:
                K_raw = kernel_from_gram(G, self.kernel, gamma=self.gamma_, degree=self.degree, coef0=self.coef0)
                # Kept at the holder only, for transforming new rows: the training kernel's means, diag(G).
                self._holder_state = (K_raw.mean(dim=0), K_raw.mean(), torch.diagonal(G).clone())
                K = center_kernel(K_raw)
                del K_raw
                U, lam = top_eigenpairs(K, k, reference=shared_start(n, k, self.seed, 1, device=X.device))
                block = torch.cat([U, lam[None, :]])
            block = broadcast(fed, block, pairwise_tree(parties), shape=(n + 1, k), dtype=torch.float64)
        block = block.to(X.device)
        self._X_fit_ = X                     # this party's own training columns (as scikit-learn's X_fit_)
        U, self._eigenvalues_ = block[:n].contiguous(), block[n].contiguous()
        self._history_ = [U]
        self.rounds_ = 1
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        self._finish(fed, parties, X, U)
        return self

    def _transform(self, X=None, fed=None) -> torch.Tensor:
        """Kernel PCA scores: ``X=None``: the training samples', U sqrt(lambda); new rows: this party's
        columns of them (m x f_i), through the masked cross-Gram sum (module docstring), at every party."""
        if not hasattr(self, "_sample_components_"):
            raise RuntimeError("ExactFederatedKernelPCA is not fitted yet: call fit first")
        if X is None:
            return self._sample_components_ * self._eigenvalues_.clamp_min(0).sqrt()
        if self._sample_components_ is None:
            raise VFLInputError("only a data party can transform its columns of new samples")
        X = as_tensor(X)
        if not isinstance(X, torch.Tensor) or X.dim() != 2 or X.shape[1] != self._X_fit_.shape[1]:
            raise VFLInputError(f"expected this party's {self._X_fit_.shape[1]} columns of the new samples "
                                f"(m x {self._X_fit_.shape[1]}), got {getattr(X, 'shape', type(X).__name__)}")
        X = X.to(self._X_fit_.device, torch.float64)
        fed = Federation.local(X.device) if fed is None else fed
        parties, holder = self.parties_, self.parties_[0]
        m, n, k = X.shape[0], self.n_samples_, self.n_components
        part = torch.cat([X @ self._X_fit_.T, (X ** 2).sum(dim=1, keepdim=True)], dim=1)
        with fed.phase(f"pca/{self.method}/transform"):
            total = part if len(parties) == 1 else secure_sum(fed, part, out=holder, parties=parties)
            scores = None
            if fed.rank == holder:
                col_mean, grand_mean, diag = self._holder_state
                Gx, sq = total[:, :n], total[:, n]
                Kx = cross_kernel_from_gram(Gx, sq, diag, self.kernel, gamma=self.gamma_, degree=self.degree,
                                            coef0=self.coef0)
                Kc = center_cross_kernel(Kx, col_mean, grand_mean)
                lam = self._eigenvalues_
                scale = torch.where(lam > 0, lam.clamp_min(0).sqrt(), torch.ones_like(lam))
                scores = Kc @ (self._sample_components_ / scale)
            if len(parties) > 1:
                scores = broadcast(fed, scores, pairwise_tree(parties), shape=(m, k), dtype=torch.float64)
        return scores.to(X.device)

    # -------------------------------------------------- save / load: what transforming new rows needs
    def _shard_state(self):
        """A data party's own training columns (``X_fit_``: its own data, in its own shard), the shared
        sample-space components and eigenvalues, gamma; the holder also the training kernel's column means
        and diag(G), which it computed from the pooled Gram matrix it already holds (module docstring)."""
        if not hasattr(self, "_sample_components_"):
            raise VFLInputError(f"{type(self).__name__} is not fitted yet: call fit first")
        state = {**self._layout_state(), "gamma": None if self._sample_components_ is None else float(self.gamma_)}
        if self._sample_components_ is None:
            return state, {}
        arrays = {"X_fit": self._X_fit_, "sample_components": self._sample_components_,
                  "eigenvalues": self._eigenvalues_}
        held = getattr(self, "_holder_state", None)
        if held is not None:
            arrays.update(col_mean=held[0], grand_mean=held[1].reshape(1), diag=held[2])
        return state, {k: to_numpy(v, np.float64) for k, v in arrays.items()}

    def _restore_fitted(self, manifest, arrays, fed):
        state = manifest["state"]
        self._restore_layout(state)
        self._sample_components_ = self._loadings_ = self._components_ = None
        if "X_fit" not in arrays:
            return
        t = {k: to_device(v, fed.device, torch.float64) for k, v in arrays.items()}   # (on the loading party's device)
        self._X_fit_, self._sample_components_ = t["X_fit"], t["sample_components"]
        self._eigenvalues_ = t["eigenvalues"]
        self.gamma_ = state["gamma"]
        self.n_features_in_ = int(self._X_fit_.shape[1])
        if "col_mean" in t:
            self._holder_state = (t["col_mean"], t["grand_mean"][0], t["diag"])

