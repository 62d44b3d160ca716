"""VFedPCA (Cheung et al., Algorithms 1-5): merged local power iterations over T communication periods.

Client i holds X_i (n x f_i, columns centred). In every period t = 1..T:

1. Local power iteration (Algorithm 1) on A_i = X_i X_i^T for ``local_iters``
   steps gives the k leading local eigenvectors a_i (n x k) and eigenvalues
   alpha_i = a_i^T A_i a_i. The start block is drawn from the shared seed
   (positive, as the reference code's ``np.random.rand``; the same block in
   every period), or, with ``warm_start`` (Algorithm 3), from period 2 on it
   is the merged u of the previous period.
2. Merge (Algorithm 2): u = sum_i w_i a_i with w_i = alpha_i / sum_l alpha_l,
   per component (``merge="paper"``; the default ``merge="subspace"`` takes the
   leading eigenvectors of sum_i w_i a_i a_i^T instead, which does not depend
   on the local vectors' signs: ``merge.py``); with ``weight_scaling`` (Algorithm 4) the larger-eigenvalue
   half of the members gets (1 + eta) w_i and the rest (1 - eta) w_i,
   eta = mean(w). Server-client: the server (coordinator) merges everything.
   Decentralised (Algorithm 5): each client merges its neighbourhood in a
   complete graph, ring or star.
3. Local data update (Algorithm 2): X_i <- X_i M M^T / ||M M^T||_F with
   M = X_i^T u (f_i x k), i.e. the projection of X_i's rows onto span(M)
   (``update_local_data``).

After the first update X_i has rank k and its column space is span(A_i u);
the update is idempotent, so from period 2 on every client works on the
same rank-k matrix A_i' = X_i P X_i^T in every period. For k = 1 its
eigenvector is A_i u_1 / ||A_i u_1||, reached in one local step, and the
merged u is the same in every period from the second on (up to the signs a
cold start gives; warm start keeps them aligned with u). The scheme is a
one-shot estimate refined once, not an iterative solver of the pooled
problem (see docs/pca.md for what that means for accuracy). With one party and k = 1, one
period of l iterations is the plain power iteration with l steps, and T >= 2
periods with warm start are exactly l + 1 steps (``tests/test_pca_core.py``
checks both).
"""

from __future__ import annotations

import time
import warnings

import torch

from ..comm import Federation
from ..data import VFLInputError
from .base import FederatedPCABase
from .exchange import check_topology, merge_round
from .linalg import center_columns, gram_operator, power_iteration, shared_start
from .merge import check_merge


def update_local_data(X: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Algorithm 2's local update X <- X M M^T / ||M M^T||_F with M = X^T U (f_i x k).

    For k = 1, M M^T / ||M M^T||_F = m m^T / ||m||^2 is the orthogonal projector
    onto m, and that is how this generalises to k > 1: X <- X P with P the
    orthogonal projector onto span(M), computed as (X B) B^T for an orthonormal
    basis B of span(M) (no f_i x f_i matrix). The literal k > 1 formula,
    X M M^T / ||M M^T||_F, raises the singular values of X to the third power
    in every period and loses the smaller components to rounding within a few
    periods; the projector is idempotent. If M = 0 the data is kept.
    """
    M = X.T @ U
    B, s, _ = torch.linalg.svd(M, full_matrices=False)
    if s.numel() == 0 or s[0] == 0:
        return X
    # Rank of M: directions with (numerically) zero singular value are not part of span(M).
    B = B[:, s > s[0] * max(M.shape) * torch.finfo(M.dtype).eps]
    return (X @ B) @ B.T


class VFedPCA(FederatedPCABase):
    """Vertical federated PCA by merged local power iterations (see the module docstring).

    Parameters
    ----------
    n_components : k, the number of leading directions.
    periods : T, communication periods.
    local_iters : l, local power iterations per period.
    topology : 'server' (needs a coordinator rank), 'complete', 'ring' or 'star'.
    warm_start : Algorithm 3: start each period's local iteration from the merged u.
    weight_scaling : Algorithm 4.
    include_self : in the decentralised graphs, a client merges its own eigenvectors with
        its neighbours' (the reference code merges the neighbours' only: ``include_self=False``).
    update_data : Algorithm 2's local data update after each period (``False`` keeps the data,
        so every period is a warm- or cold-started local iteration on the original data).
    center : centre each party's columns first.
    merge : 'subspace' (default: sign-free, the leading eigenvectors of the weighted sum of the
        local projectors) or 'paper' (Algorithm 2's weighted sum of the vectors, for reproduction).
    seed : the shared seed of the start vectors (and of the reference that orients the result).

    Attributes (after ``fit``; arrays: numpy, on the host; see ``base.py``): ``sample_components_`` (n x k),
    ``loadings_`` (f_i x k, the paper's Z_i = X_i^T u), ``local_components_`` / ``local_eigenvalues_``
    (the party's own eigenpairs of the first period: what it has without federation),
    ``history_`` (the merged block after each period), ``rounds_``, ``bytes_``,
    ``fit_seconds_``, explained variance.
    """

    method = "vfedpca"

    def __init__(self, n_components: int = 1, *, periods: int = 10, local_iters: int = 10,
                 topology: str = "server", warm_start: bool = False, weight_scaling: bool = False,
                 include_self: bool = True, update_data: bool = True, center: bool = True,
                 merge: str = "subspace", seed: int = 0, whiten: bool = False, fed: Federation | None = None):
        self.n_components = n_components
        self.fed = fed
        self.periods = periods
        self.local_iters = local_iters
        self.topology = topology
        self.warm_start = warm_start
        self.weight_scaling = weight_scaling
        self.include_self = include_self
        self.update_data = update_data
        self.center = center
        self.merge = merge
        self.seed = seed
        self.whiten = whiten

    def _fit(self, X: torch.Tensor | None, fed: Federation | None, parties) -> "VFedPCA":
        check_topology(self.topology)
        check_merge(self.merge)
        for name in ("periods", "local_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise VFLInputError(f"{name} must be a positive integer, got {value!r}")
        fed, parties, X, n = self._setup(X, fed, parties, needs_coordinator=self.topology == "server")
        started = time.perf_counter()
        k, client = self.n_components, fed.rank in parties
        Xc, work = None, None
        if client:
            Xc, self._mean_ = center_columns(X) if self.center else (X, torch.zeros(X.shape[1], dtype=X.dtype,
                                                                                      device=X.device))
            if Xc.shape[1] <= k:
                warnings.warn(f"{fed.name()} holds {Xc.shape[1]} column(s) and sends {k} local eigenvector(s) with "
                              f"their eigenvalues: these determine its columns up to an orthogonal rotation "
                              f"(one column: exactly, up to sign). See docs/pca.md, privacy.", stacklevel=2)
            work = Xc
        U, history = None, []
        cold = shared_start(n, k, self.seed, 1, device=self._device)
        with fed.phase(f"pca/{self.method}"):
            for t in range(1, self.periods + 1):
                a = alpha = None
                if client:
                    # Cold start: the same shared positive block in every period (in period 1 every party's
                    # eigenvectors then point the same way, a^T start >= 0; later, A_i u is orthogonal to the
                    # ones vector and its sign against the start is arbitrary). Warm start (Algorithm 3): the
                    # merged u, which orients every party's vector towards u (docs/pca.md).
                    start = U if (self.warm_start and U is not None) else cold
                    a, alpha = power_iteration(gram_operator(work), start, self.local_iters)   # Algorithm 1
                    if t == 1:
                        self._local_components_, self._local_eigenvalues_ = a, alpha
                U = merge_round(fed, parties, self.topology, a, alpha, n, k, weight_scaling=self.weight_scaling,
                                include_self=self.include_self, mode=self.merge, reference=cold,
                                device=self._device)
                if client and self.update_data:
                    work = update_local_data(work, U)                                      # Algorithm 2
                if U is not None:
                    history.append(U)
        self._history_ = history
        self.rounds_ = self.periods
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        self._finish(fed, parties, Xc, U, shared=self.topology == "server")
        return self
