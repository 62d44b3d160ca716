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
"""

from __future__ import annotations

import time

import torch

from ..comm import Federation
from ..data import VFLInputError
from .base import FederatedPCABase
from .exchange import check_topology, merge_round
from .kernels import center_kernel, check_kernel, kernel_matrix
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

    Attributes: ``sample_components_`` (n x k), ``loadings_`` (Z_i = X_i^T u, f_i x k),
    ``local_components_`` / ``local_eigenvalues_`` (the party's own kernel PCA),
    ``gamma_``, ``rounds_`` (1), ``bytes_``, ``fit_seconds_``.
    """

    method = "akpca"
    linear = False

    def _expected_failed_checks(self) -> dict:
        """scikit-learn checks that do not apply, with the reason (read by tests/test_sklearn_citizens.py)."""
        reason = ("VFedAKPCA embeds the training samples only: a kernel between new and training rows would need "
                  "every party's columns (transform(X_new) raises and says so); ExactFederatedKernelPCA does it")
        return dict.fromkeys((
            "check_estimators_dtypes", "check_dtype_object", "check_estimators_pickle",
            "check_f_contiguous_array_estimator", "check_transformer_data_not_an_array", "check_transformer_general",
            "check_transformer_preserve_dtypes", "check_methods_sample_order_invariance",
            "check_methods_subset_invariance", "check_dict_unchanged", "check_fit_idempotent"), reason)

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
                K = center_kernel(kernel_matrix(X, self.kernel, gamma=self.gamma_, degree=self.degree, coef0=self.coef0))
                reference = shared_start(n, k, self.seed, 1, device=self._device)
                if self.local_iters is None:
                    # Dense eigenvectors have arbitrary signs: orient them by the shared positive reference,
                    # as a power iteration from that start would, so that the merge adds like to like.
                    v, lam = top_eigenpairs(K, k, reference=reference)
                else:
                    v, lam = power_iteration(matrix_operator(K), reference, self.local_iters)
                self.local_components_, self.local_eigenvalues_ = v, lam
            with fed.phase(f"pca/{self.method}"):
                U = merge_round(fed, parties, self.topology, v, lam, n, k, weight_scaling=self.weight_scaling,
                                include_self=self.include_self, power=0.5, mode=self.merge,
                                reference=shared_start(n, k, self.seed, 1, device=self._device), device=self._device)
        self.history_ = [] if U is None else [U]
        self.rounds_ = 1
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        self._finish(fed, parties, X if client else None, U)
        return self

    def _transform(self, X=None, fed=None) -> torch.Tensor:
        """The training samples' embedding: the merged unit directions (n x k); no new samples (see base).

        Not U sqrt(lambda) like ``ExactFederatedKernelPCA.transform()``: the scale would be
        u_j^T K u_j for the pooled kernel K, which VFedAKPCA never forms (each party only has its
        local kernel K_i, and the merge weights sqrt(lambda_i) are not eigenvalues of K); any
        number put there would be a made-up scale. Multiply by the exact kernel PCA's
        sqrt(eigenvalues_) if both are fitted, or compare directions (``aligned_distances``).
        """
        if X is not None:
            return super()._transform(X, fed)
        if not hasattr(self, "sample_components_"):
            raise RuntimeError("VFedAKPCA is not fitted yet: call fit first")
        return self.sample_components_
