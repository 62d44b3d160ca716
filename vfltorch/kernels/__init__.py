"""FDSKL: federated doubly stochastic kernel learning (Gu, Dang, Li & Huang, KDD 2020).

* ``random_features`` - random Fourier features drawn entry by entry from a
  counter, so each party generates exactly its slice of w (RBF, Laplace).
* ``circle`` - phases as fixed-point angles mod 2*pi; a party's mask stream.
* ``shared`` - the default protocol: dealt phase masks, f and gradients as
  additive shares (the active party learns f on its batch rows and g only).
* ``protocol`` - the paper's Algorithm 3 (masked phases over totally different trees) and
  Algorithm 2 (decision values), batched over rows and features.
* ``budget`` - the bounded model (default): D random features, O(n D) per epoch, O(m D) to score
  m rows, Adam or the paper's step; under both protocols.
* ``trainer`` - Algorithm 1, batched (B samples, r new features per iteration: the growing model).
* ``losses`` - square, logistic, smooth hinge (the paper's Table 1).
* ``bandwidth`` - the median-heuristic kernel width through a secure sum.
* ``estimator`` - ``FDSKLClassifier`` / ``FDSKLRegressor`` (scikit-learn style).
* ``cli`` - ``vfl fdskl``.
"""

from .._lazy import lazy_exports

# submodule -> the names it exports (imported on first use: `vfl --help` needs no torch)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "bandwidth": "median_sigma",
    "budget": "train_budget",
    "checks": "ScalingWarning",
    "circle": "Circle KeptPhases",
    "estimator": "FDSKLClassifier FDSKLRegressor LeakWarning",
    "losses": "LOSSES Loss LogisticLoss SmoothHingeLoss SquareLoss get_loss",
    "protocol": "FederatedFeatureMap",
    "random_features": "KERNELS FourierSampler feature_map",
    "trainer": "DSGConfig TrainResult train_dsg",
})
