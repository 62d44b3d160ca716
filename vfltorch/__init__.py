"""vfltorch: vertical federated learning on PyTorch.

Several parties hold different columns about the same rows; one of them (the
*active* party) holds the labels. Every method here runs as one process per
party over ``torch.distributed`` (or TLS links between organisations) and keeps
each party's raw columns inside its own process.

The public API, importable from here (each imported on first use, so ``vfl``
starts without torch)::

    from vfltorch import FDSKLClassifier, launch
    est = FDSKLClassifier().fit(X, y)              # centralised (one party)
    launch(job, parties=3)                         # job(fed) in one process per party

* estimators (scikit-learn style, ``fed=`` for a federation): ``FDSKLClassifier``,
  ``FDSKLRegressor``, ``HeteroLogisticRegression``, ``DPSCD``, ``DPSGD``, ``VFedPCA``,
  ``VFedAKPCA``, ``ExactFederatedPCA``, ``ExactFederatedKernelPCA``, ``RandomFeatureKernelPCA``;
* the runtime: ``launch``, ``init_from_env``, ``connect_federation``, ``Federation``;
* data: ``DataConfig``, ``load_party_data``, ``load_dataset``.

``vfltorch.comm``, ``vfltorch.data``, ``vfltorch.kernels``, ``vfltorch.pca``,
``vfltorch.privacy``, ``vfltorch.linear`` and ``vfltorch.crypto`` hold the rest.
"""

from ._lazy import lazy_exports

__version__ = "0.2.0"

# "package.module" -> the names it exports, imported on first use (PEP 562).
__getattr__, __dir__, _PUBLIC = lazy_exports(__name__, {
    "kernels.estimator": "FDSKLClassifier FDSKLRegressor",
    "linear.estimator": "HeteroLogisticRegression",
    "privacy.estimator": "DPSCD",
    "privacy.dpsgd": "DPSGD",
    "pca.vfedpca": "VFedPCA",
    "pca.akpca": "VFedAKPCA",
    "pca.exact": "ExactFederatedPCA",
    "pca.exact_kernel": "ExactFederatedKernelPCA",
    "pca.rff_kpca": "RandomFeatureKernelPCA",
    "comm.launcher": "launch init_from_env",
    "comm.link": "connect_federation",
    "comm.federation": "Federation",
    "data.party": "DataConfig load_party_data",
    "data.registry": "load_dataset",
})
__all__ = [*_PUBLIC, "__version__"]
