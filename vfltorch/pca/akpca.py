"""VFedAKPCA (Cheung et al.): merged local kernel PCA; every party projects its own data on the result.

Client i builds the kernel matrix of the samples over its own features,
K_i = k(X_i, X_i) (n x n: RBF, sigmoid or polynomial, ``kernels.py``), centres
it in feature space (H K_i H), and takes its k leading eigenvectors v_i and
eigenvalues lambda_i (a dense solver by default, as the reference code's
``np.linalg.eig``, or ``local_iters`` power iterations, Algorithm 1). The
merge is Algorithm 2's with weights sqrt(lambda_i) / sum sqrt(lambda_l) (sign-free
subspace merge by default, the paper's weighted sum with ``merge="paper"``)
(and Algorithm 4 on top if ``weight_scaling``), over the server or a
decentralised graph, in one communication period. Each party then projects
its own data, Z_i = X_i^T u (``loadings_``): nonlinear features of its own
columns, as the paper's case study uses them.

The RBF gamma defaults to 1 / (total number of features): the same gamma at
every party makes the pooled RBF kernel the elementwise product of the
parties' kernels, which is what the exact kernel PCA (``exact_kernel.py``)
computes and what ``distance`` compares against.

New rows (``transform(X_new)``, collective over the data parties). Both
merges are linear in the local vectors: U = sum_i v_i C_i with a k x k block
C_i per party (``merge.merge_with_coefficients``); in the server topology the
server sends each client its own C_i, to it alone, after the merged block. A
local eigenvector extends to a new row x by Nystrom's formula,
v_i(x) = k~_i(x^i, X_i) v_i / lambda_i, with the cross-kernel centred as the
training kernel was (``kernels.center_cross_kernel``): party i computes it
from its own columns alone, and on a training row it gives back that row of
v_i. Each party's m x k part v_i(x) C_i is summed over the parties by the
masked sum of the linear estimators' transform (``secure_allreduce``), so
every data party gets the scores sum_i v_i(x) C_i, and transform(X_train) is
the training embedding U (to the eigensolver's precision; with
``local_iters``, to the power iteration's residual).

What this adds to what fit reveals. Fit: the server receives every party's
(v_i, lambda_i) and every client the merged U (decentralised: each client
its neighbours' pairs). For new rows the server topology's fit also sends
client i its own C_i (k x k; a decentralised client computes it): with
U and its own v_i it then knows sum_{l != i} v_l C_l, the other parties'
part of U on the training rows (with two parties, the other's v_l C_l: its
k local kernel eigenvectors up to the k x k map C_l). At transform, every
data party receives the m x k sums and nothing else (ring-masked parts;
as in every masked sum, the binary exponent of the largest entry); with two
parties each learns the other's part v_l(x) C_l of each new row, k numbers
per row - the same functions of the other's columns as its part of U on the
training rows, now at rows it chose its own columns for. The server takes
no part.
"""

from __future__ import annotations

import time

import torch

from ..comm import Federation, secure_allreduce
from ..data import VFLInputError
from .base import FederatedPCABase, as_tensor
from .exchange import check_topology, merge_round, neighbours
from .kernels import center_cross_kernel, center_kernel, check_kernel, cross_kernel_from_gram, kernel_matrix
from .merge import check_merge
from .linalg import float_work, matrix_operator, power_iteration, shared_start, top_eigenpairs


class VFedAKPCA(FederatedPCABase):
    """Vertical federated "advanced" kernel PCA (see the module docstring).

    Parameters: ``n_components``; ``kernel`` ('rbf', 'sigmoid', 'poly'; 'linear'
    gives one period of VFedPCA with sqrt weights); ``gamma`` ('scale', the default: scikit-learn's
    1 / (F var(X)) over every entry of the pooled matrix, from one masked sum of three numbers per party;
    None: 1 / total features, which on unscaled columns such as breast_cancer's makes the RBF kernel
    nearly the identity and the merged direction meaningless, distance 1.37; a number), ``degree``,
    ``coef0`` (scikit-learn's kernel conventions); ``local_iters`` (None: dense eigensolver; else power
    iterations); ``topology``, ``weight_scaling``, ``include_self`` as in
    ``VFedPCA``; ``seed`` (the shared start / sign reference).

    Attributes (arrays: numpy, on the host): ``sample_components_`` (n x k), ``loadings_`` (Z_i = X_i^T u, f_i x k),
    ``local_components_`` / ``local_eigenvalues_`` (the party's own kernel PCA),
    ``merge_coefficients_`` (k x k: this party's C_i, U = sum_i local_components_i C_i), ``X_fit_``
    (this party's own training columns, for new rows), ``gamma_``, ``rounds_`` (1), ``bytes_``,
    ``fit_seconds_``.

    ``transform()``: the training rows' embedding U. ``transform(X_new)``: every data party passes its
    columns of the same new rows and gets the m x k scores, sum_i v_i(x) C_i (module docstring: how, and
    what each party receives); transform(X_train) gives U back. Server topology, or a decentralised graph
    in which every party merged every party's pair (the complete graph with ``include_self``); elsewhere
    each party holds its own estimate and new rows are refused.
    """

    method = "akpca"
    linear = False

    def __init__(self, n_components: int = 1, *, kernel: str = "rbf", gamma: float | str | None = "scale",
                 degree: int = 3, coef0: float = 1.0, local_iters: int | None = None, topology: str = "server",
                 weight_scaling: bool = False, include_self: bool = True, merge: str = "subspace",
                 seed: int = 0, fed: Federation | None = None):
        self.n_components = n_components
        self.fed = fed
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.local_iters = local_iters
        self.topology = topology
        self.weight_scaling = weight_scaling
        self.include_self = include_self
        self.merge = merge
        self.seed = seed

    def _fit(self, X: torch.Tensor | None, fed: Federation | None, parties) -> "VFedAKPCA":
        check_kernel(self.kernel)
        check_topology(self.topology)
        check_merge(self.merge)
        if self.local_iters is not None and (not isinstance(self.local_iters, int) or self.local_iters < 1):
            raise VFLInputError(f"local_iters must be None (dense solver) or a positive integer, "
                                f"got {self.local_iters!r}")
        fed, parties, X, n = self._setup(X, fed, parties, needs_coordinator=self.topology == "server")
        started = time.perf_counter()
        k, client = self.n_components, fed.rank in parties
        self.gamma_ = self._kernel_gamma(fed, parties, X)
        v = lam = None
        # The local n x n eigensolve (about n^3 float operations) runs while the server waits: announced, so that
        # waits follow the work (Federation.expect_work).
        flops = n ** 3 if self.local_iters is None else n * n * k * self.local_iters
        with fed.expect_work(float_work(flops), "the local kernel eigensolve"):
            if client:
                K = kernel_matrix(X, self.kernel, gamma=self.gamma_, degree=self.degree, coef0=self.coef0)
                # New rows are centred with the training kernel's column means and grand mean (kernels.py).
                self._kernel_means = (K.mean(dim=0), K.mean())
                K = center_kernel(K)
                reference = shared_start(n, k, self.seed, 1, device=self._device)
                if self.local_iters is None:
                    # Dense eigenvectors have arbitrary signs: orient them by the shared positive reference,
                    # as a power iteration from that start would, so that the merge adds like to like.
                    v, lam = top_eigenpairs(K, k, reference=reference)
                else:
                    v, lam = power_iteration(matrix_operator(K), reference, self.local_iters)
                self._local_components_, self._local_eigenvalues_ = v, lam
            with fed.phase(f"pca/{self.method}"):
                U, C = merge_round(fed, parties, self.topology, v, lam, n, k, weight_scaling=self.weight_scaling,
                                   include_self=self.include_self, power=0.5, mode=self.merge,
                                   reference=shared_start(n, k, self.seed, 1, device=self._device),
                                   device=self._device, coefficients=True)
        self._merge_coefficients_ = C
        self._X_fit_ = X if client else None
        self._history_ = [] if U is None else [U]
        self.rounds_ = 1
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        self._finish(fed, parties, X if client else None, U)
        return self

    def _merged_alike(self) -> bool:
        """Whether every party holds the same U, merged from every party's pair: then one sum scores new rows."""
        parties = self.parties_
        if self.topology == "server" or len(parties) == 1:
            return True
        return bool(self.include_self) and all(
            set(neighbours(self.topology, parties, r)) | {r} == set(parties) for r in parties)

    def _local_extension(self, X: torch.Tensor) -> torch.Tensor:
        """v_i(x) = k~_i(x, X_i) v_i / lambda_i for the rows of X (m x k), from this party's columns alone.

        A component with no variance (lambda_i <= n eps lambda_max) extends by 0: its vector is noise, and the
        merge gave it (almost) no weight.
        """
        X_fit = self._X_fit_
        Kx = cross_kernel_from_gram(X @ X_fit.T, (X ** 2).sum(dim=1), (X_fit ** 2).sum(dim=1), self.kernel,
                                    gamma=self.gamma_, degree=self.degree, coef0=self.coef0)
        Kc = center_cross_kernel(Kx, *self._kernel_means)
        lam = self._local_eigenvalues_
        floor = X_fit.shape[0] * torch.finfo(lam.dtype).eps * lam.max().clamp_min(0)
        inv = torch.where(lam > floor, 1.0 / torch.where(lam > floor, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        return Kc @ (self._local_components_ * inv)

    def _new_rows(self, X, fed) -> torch.Tensor:
        """Scores of new rows (this party's columns of them), summed over the parties (module docstring)."""
        if getattr(self, "_X_fit_", None) is None:
            raise VFLInputError("only a data party can transform its columns of new samples (the server holds no "
                                "columns)")
        if not self._merged_alike():
            raise VFLInputError(f"transform(X_new) needs one merged estimate shared by every party: with topology="
                                f"{self.topology!r}{'' if self.include_self else ' and include_self=False'} each "
                                f"party holds its own. Fit with topology='server' (the default) or 'complete' (with "
                                f"include_self=True), or use transform() for the training rows")
        X = as_tensor(X)
        f = self._X_fit_.shape[1]
        if not isinstance(X, torch.Tensor) or X.dim() != 2 or X.shape[1] != f:
            raise VFLInputError(f"expected this party's {f} columns of the new samples (m x {f}), got "
                                f"{tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__}")
        X = X.to(self._X_fit_.device, torch.float64)
        if not bool(torch.isfinite(X).all()):
            raise VFLInputError(f"{'this party' if fed is None else fed.name()}'s columns of the new samples contain "
                                f"NaN or inf: impute them as the training columns were")
        part = self._local_extension(X) @ self._merge_coefficients_.to(X.device)
        if len(self.parties_) == 1:
            return part
        fed = Federation.local(X.device) if fed is None else fed
        with fed.phase(f"pca/{self.method}/transform"):
            # Masked: a tree parent would otherwise see its child's m x k part.
            return secure_allreduce(fed, part, parties=self.parties_)

    def _transform(self, X=None, fed=None) -> torch.Tensor:
        """The training samples' embedding: the merged unit directions (n x k); new rows: their scores on them,
        the same combination of the parties' Nystrom extensions (``_new_rows``, collective).

        Not U sqrt(lambda) like ``ExactFederatedKernelPCA.transform()``: the scale would be
        u_j^T K u_j for the pooled kernel K, which VFedAKPCA never forms (each party only has its
        local kernel K_i, and the merge weights sqrt(lambda_i) are not eigenvalues of K); any
        number put there would be a made-up scale. Multiply by the exact kernel PCA's
        sqrt(eigenvalues_) if both are fitted, or compare directions (``aligned_distances``).
        """
        if not hasattr(self, "_sample_components_"):
            raise RuntimeError("VFedAKPCA is not fitted yet: call fit first")
        if X is not None:
            return self._new_rows(X, fed)
        return self._sample_components_
