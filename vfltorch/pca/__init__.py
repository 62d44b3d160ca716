"""Vertical federated PCA: VFedPCA, VFedAKPCA (Cheung et al.), and exact federated (kernel) PCA.

Every party holds the same n samples and its own columns X_i (n x f_i). The
principal directions in sample space (length-n vectors, the left singular
vectors of the pooled matrix: ``sample_components_``) are what the parties
share; no column leaves its owner. ``components_`` is scikit-learn's (k x f_i:
each party's slice of V^T). VFedPCA / VFedAKPCA merge the local eigenvectors
sign-free by default (``merge.py``; the paper's weighted sum: ``merge="paper"``).

* ``VFedPCA`` - merged local power iterations, server-client or decentralised,
  with warm start and weight scaling (Algorithms 1-5) (``vfedpca.py``).
* ``VFedAKPCA`` - merged local kernel PCA; each party projects its own data
  (``akpca.py``).
* ``ExactFederatedPCA`` - the pooled PCA, federated (``exact.py``): by default
  ("auto") the secretly rotated d x d covariance from Beaver products dealt by a
  coordinator, opened there by one masked sum ("covariance", when d <= n), or one
  masked sum of secretly rotated n x n Gram matrices ("rotated"); the coordinator
  learns only the spectrum. Or subspace iteration, one sum per round, which
  lets every party rebuild the others' Gram matrix ("krylov", warns).
* All estimators are scikit-learn ``BaseEstimator`` / ``TransformerMixin``s.
* ``ExactFederatedKernelPCA`` - kernel PCA of the pooled data through one
  (masked) sum of Gram matrices (``exact_kernel.py``).
* ``metrics`` - distances and angles to the pooled references; ``synthetic`` -
  the paper's Gaussian data.

``vfl pca --method vfedpca|exact|akpca ...`` runs them from the command line
(``cli.py``). Design notes, measured results and the privacy discussion are in
docs/pca.md.
"""

from .akpca import VFedAKPCA
from .exact import ExactFederatedPCA, federated_sum
from .exact_kernel import ExactFederatedKernelPCA
from .exchange import TOPOLOGIES, merge_round, neighbours
from .kernels import KERNELS, center_kernel, kernel_from_gram, kernel_matrix
from .linalg import center_columns, orthonormalize, power_iteration, shared_start
from .merge import MERGES, eigenvalue_weights, equal_merge, merge, merge_weights, scale_weights, subspace_merge
from .metrics import (aligned_distances, compare, pooled_kernel_pca, pooled_pca, principal_angles,
                      unaligned_distances)
from .synthetic import PAPER_SHAPES, gaussian_data
from .vfedpca import VFedPCA, update_local_data

__all__ = [
    "ExactFederatedKernelPCA", "ExactFederatedPCA", "KERNELS", "MERGES", "PAPER_SHAPES", "TOPOLOGIES", "VFedAKPCA", "VFedPCA",
    "aligned_distances", "center_columns", "center_kernel", "compare", "eigenvalue_weights", "equal_merge",
    "federated_sum", "gaussian_data", "kernel_from_gram", "kernel_matrix", "merge", "merge_round",
    "merge_weights", "neighbours", "orthonormalize", "pooled_kernel_pca", "pooled_pca", "power_iteration",
    "principal_angles", "scale_weights", "shared_start", "subspace_merge", "unaligned_distances", "update_local_data",
]
