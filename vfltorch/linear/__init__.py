"""Encrypted vertical logistic regression: Hardy et al.'s SGD and Yang et al.'s stochastic quasi-Newton (SQN).

Two or more data parties hold different columns of the same rows; the guest
(the active party) also holds the labels; a coordinator holds the Paillier
private key and no data. They train a logistic regression on the Taylor
loss log 2 - y u / 2 + u^2 / 8 without any party seeing another's columns,
labels or margins in the clear.

* ``HeteroLogisticRegression`` - the scikit-learn style estimator (``estimator.py``);
* the default protocol (``protocol="shared"``, ``shared.py``): the model as additive shares between
  the guest and the host, vector-free L-BFGS (``vlbfgs.py``); the paper's Paillier protocol
  (``protocol="paper"``) below; ``attacks.py``: the audits both are tested with;
* roles: ``guest.py``, ``host.py`` (with the host chain), ``coordinator.py``, shared
  data-party steps in ``party.py``, the centralised twin in ``local.py``;
* maths: ``taylor.py`` (loss, residual, gradient, Hessian-vector product),
  ``lbfgs.py`` (two-loop recursion, curvature memory), ``optimizers.py``
  (schedule, step sizes, iterate averages), ``stopping.py``;
* encryption: ``cipher.py`` (Paillier through ``vfltorch.crypto``, or the
  insecure plaintext stand-in), ``bounds.py`` (public fixed-point scales and
  bounds), ``masks.py`` (integer gradient masks);
* ``vfl hetero-lr`` (``cli.py``).

See ``docs/hetero_lr.md`` for what each role learns and the measured figures.
"""

from .._lazy import lazy_exports

# submodule -> the names it exports (imported on first use: `vfl --help` needs no torch)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "bounds": "DivergenceError PublicBounds",
    "cipher": "PLAINTEXT_LABEL PaillierScheme PlaintextScheme",
    "estimator": "DEFAULT_DECAY DEFAULT_LR HeteroLogisticRegression",
    "lbfgs": "CurvatureMemory two_loop",
    "taylor": "gradient hessian_vector logistic_loss residual taylor_loss",
})
