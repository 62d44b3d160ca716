"""Differential privacy: the noise calibration (opacus' accountants), DP-SCD and its variants, DP-SGD.

* ``accountant.py`` - sigma for (epsilon, delta, q, T) and the epsilon a run has spent (opacus PRV / RDP / GDP).
* ``randomness.py`` - secret randomness from OS entropy, or an explicit simulation seed that voids the guarantee.
* ``glm.py`` - ridge, logistic regression, L2-SVM: losses, conjugates, the one-dimensional coordinate steps.
* ``dpscd.py`` (Algorithm 1, DP-SCD), ``seqdpscd.py`` (Algorithm 3, seqDP-SCD, and plain SCD),
  ``primal.py`` (Algorithm 2, primal DP-SCD, and the row-batch ``primal-rows``): one step generator each,
  with its sensitivity.
* ``solver.py`` - ``fit_glm``: one party's run of any variant; Q = 1 is the centralised algorithm.
* ``vertical.py`` - the messages of the vertical run (the encrypted update protocol, the paper's);
  ``noise.py`` - private noise streams; ``sampling.py`` - the secret batch schedule.
* ``estimator.py`` - ``DPSCD``; ``dpsgd.py`` - ``DPSGD`` (opacus); ``cli.py`` - ``vfl dpscd`` / ``vfl dpsgd``.
"""

from .._lazy import lazy_exports

# submodule -> the names it exports (imported on first use: `vfl --help` needs no torch)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "accountant": "MECHANISMS PrivacyAccountant PrivacyBudgetError calibrate_sigma check_budget epsilon_spent",
    "dpsgd": "DPSGD",
    "estimator": "DPSCD",
    "glm": "TASKS Hinge Logistic Ridge make_glm",
    "solver": "VARIANTS DPSCDConfig FitResult fit_glm",
})
