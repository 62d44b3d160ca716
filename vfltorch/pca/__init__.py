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
* ``RandomFeatureKernelPCA`` - private random-feature RBF kernel PCA (``rff_kpca.py``): O(n D) memory,
  phases hidden by a kept mask, features in secret shares between two parties, a D x D rotated matrix
  opened at the coordinator (``vfl pca --method rffkpca``).
* ``metrics`` - distances and angles to the pooled references; ``synthetic`` -
  the paper's Gaussian data.

``vfl pca --method vfedpca|exact|akpca ...`` runs them from the command line
(``cli.py``). Design notes, measured results and the privacy discussion are in
docs/pca.md.
"""

from .._lazy import lazy_exports

# submodule -> the names it exports (imported on first use: `vfl --help` needs no torch)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "akpca": "VFedAKPCA",
    "exact": "ExactFederatedPCA federated_sum",
    "exact_kernel": "ExactFederatedKernelPCA",
    "exchange": "TOPOLOGIES merge_round neighbours",
    "kernels": "KERNELS center_kernel kernel_from_gram kernel_matrix",
    "linalg": "center_columns orthonormalize power_iteration shared_start",
    "merge": "MERGES eigenvalue_weights equal_merge merge merge_weights scale_weights subspace_merge",
    "rff_kpca": "RandomFeatureKernelPCA",
    "metrics": "aligned_distances compare pooled_kernel_pca pooled_pca principal_angles unaligned_distances",
    "synthetic": "PAPER_SHAPES gaussian_data",
    "vfedpca": "VFedPCA update_local_data",
})
