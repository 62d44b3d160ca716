"""``DPSCD``: a scikit-learn style estimator for (DP-)SCD on one machine.

    model = DPSCD(task="logistic", epsilon=1.0, delta=1e-3, L=100, C=0.01, lam=1e-4, epochs=10)
    model.fit(X, y)              # rows are divided by their L2 norm first (normalize_rows, as `vfl dpscd`)
    model.predict(X_test); model.epsilon_, model.sigma_, model.history_

It runs ``fit_glm`` on a single-party federation, the very code a vertical
federation runs at each party (``vfl dpscd --parties Q``). ``lam`` is the
paper's lambda (``lambda`` is a Python keyword).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils._tags import ClassifierTags, RegressorTags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import column_or_1d

from ..comm import Federation
from ..data import VFLInputError
from ..model_store import ShardedModelMixin
from ..devices import to_numpy
from ..data.estimator_input import BinaryLabels, check_fitted, features, proba_columns, require_y
from .glm import make_glm
from .solver import DPSCDConfig, fit_glm


def as_matrix(X, what: str = "X") -> np.ndarray:
    X = to_numpy(X, np.float64)
    if X.ndim != 2:
        raise VFLInputError(f"{what} must be a 2-D array (rows x features), got shape {X.shape}")
    if not np.isfinite(X).all():
        raise VFLInputError(f"{what} contains NaN or infinite values: impute or drop them first")
    return X


def unit_rows(X: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def clip_batch(est, name: str, value, limit: int, what: str = "training rows"):
    """A batch size above ``limit`` (the training rows) clipped to it with a warning, as scikit-learn's MLP
    clips ``batch_size``; anything else is returned as given (the solver's own checks explain bad values).

    Clipping keeps the DP accounting exact: the accountant is calibrated for the clipped size (q = L / N)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > limit >= 1:
        warnings.warn(f"{type(est).__name__}: {name}={value} exceeds the {limit} {what}; it is clipped to {limit} "
                      f"(the privacy accounting uses the clipped size)", UserWarning, stacklevel=3)
        return limit
    return value


# Why DP estimators at their defaults cannot pass these checks of scikit-learn's check_estimator (read by
# tests/test_sklearn_citizens.py; scikit-learn >= 1.6 takes expected failures as an argument, not as a tag).
# Fits that draw their noise and batches from OS entropy never repeat: the ``non_deterministic`` tag says so
# to scikit-learn, which then skips its idempotence checks; these compare two fits in other ways.
DP_NOISE = ("the DP noise and batch schedule come from OS entropy (the tag non_deterministic is set): two fits on "
            "the same data differ by design; simulation_seed=N makes fits repeat (and voids the guarantee)")


def _is_logistic(est) -> bool:
    return est.task == "logistic"


class GLMPredictions(ShardedModelMixin):
    """Edge validation, labels, predict / predict_proba / score / objective / save / load of a fitted linear GLM.

    Shared by DPSCD and the DP-SGD baseline, so both are scored the same way:
    ``classes_`` is None for ridge (predictions are the margins, score R^2),
    else the two labels (sign of the margin, score accuracy). scikit-learn
    sees a classifier (logistic, svm) or a regressor (ridge), by ``task``.
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        regression = self.task == "ridge"
        tags.estimator_type = "regressor" if regression else "classifier"
        tags.classifier_tags = None if regression else ClassifierTags(multi_class=False)
        tags.regressor_tags = RegressorTags() if regression else None
        # DP noise from OS entropy: two fits differ (unless simulation_seed is set, which voids the guarantee).
        tags.non_deterministic = self._is_random()
        return tags

    def _is_random(self) -> bool:
        return self.simulation_seed is None

    def _expected_failed_checks(self) -> dict:
        """scikit-learn checks that cannot pass at these settings, each with the reason (see DP_NOISE)."""
        if not self._is_random():
            return {}
        # The checks that compare two fits' predictions (measured at the defaults, scikit-learn 1.9.1).
        data = "check_regressor_data_not_an_array" if self.task == "ridge" else "check_classifier_data_not_an_array"
        return {name: DP_NOISE for name in (data, "check_supervised_y_2d", "check_fit_idempotent")}

    def _fit_inputs(self, X, y):
        """(X float64 numpy, y as the method trains on it: -1 / +1 for the binary tasks), ``classes_`` set."""
        X, _ = features(self, X, reset=True)
        X = as_matrix(X)
        require_y(self, y)
        if make_glm(self.task).kind == "regression":
            if isinstance(y, torch.Tensor):
                y = to_numpy(y)
            y = column_or_1d(y, warn=True).astype(np.float64)
            if y.shape[0] != X.shape[0]:
                raise VFLInputError(f"y has {y.shape[0]} targets for {X.shape[0]} rows of X")
            if not np.isfinite(y).all():
                raise VFLInputError("y contains NaN or infinite values")
            self.classes_ = None
            return X, y
        return X, BinaryLabels.fit(self, y, X.shape[0])

    def _predict_rows(self, X) -> np.ndarray:
        check_fitted(self, "coef_")
        X, _ = features(self, X, reset=False)
        X = as_matrix(X)
        return unit_rows(X) if self._unit_rows() else X

    def _unit_rows(self) -> bool:
        """``normalize_rows``, None resolved: unit rows except for primal DP-SCD, whose bound is on columns."""
        if self.normalize_rows is None:
            return getattr(self, "variant", None) != "primal"
        return bool(self.normalize_rows)

    def decision_function(self, X) -> np.ndarray:
        """Margins x^T theta (numpy)."""
        return self._predict_rows(X) @ self.coef_

    def predict(self, X) -> np.ndarray:
        """Labels (the two classes of fit) for the binary tasks, the fitted values for ridge."""
        margin = self.decision_function(X)
        if self.classes_ is None:
            return margin
        return BinaryLabels.decode(self, margin > 0)

    @available_if(_is_logistic)
    def predict_proba(self, X) -> np.ndarray:
        """task='logistic': [P(classes_[0]), P(classes_[1])] = [sigmoid(-m), sigmoid(m)] of the margin m."""
        m = self.decision_function(X)
        return proba_columns(1.0 / (1.0 + np.exp(-np.clip(m, -500, 500))))

    def score(self, X, y) -> float:
        """Accuracy for the binary tasks, R^2 for ridge (scikit-learn's conventions)."""
        from sklearn.metrics import accuracy_score, r2_score

        pred = self.predict(X)
        return float(r2_score(y, pred) if self.classes_ is None else accuracy_score(y, pred))

    def _shard_state(self):
        """theta and the label encoding (one party: these estimators are centralised)."""
        if not hasattr(self, "coef_"):
            raise VFLInputError(f"this {type(self).__name__} model is not fitted yet: call fit(X, y) first")
        classes = None if self.classes_ is None else [c.item() if hasattr(c, "item") else c for c in self.classes_]
        state = {"classes": classes, "n_features_in": int(self.n_features_in_),
                 **{k: getattr(self, k + "_", None) for k in ("epsilon", "delta", "sigma", "steps")},
                 "guarantee_void": bool(getattr(self, "guarantee_void_", False))}
        return state, {"coef": np.asarray(self.coef_, dtype=np.float64)}

    def _restore_shard(self, manifest, arrays, fed):
        state = manifest["state"]
        if "coef" not in arrays:
            from ..model_store import ModelStoreError

            raise ModelStoreError("this is a model of `vfl dpscd` (one block of theta per party): score it with "
                                  "`vfl predict --model DIR`; the DPSCD estimator loads what DPSCD.save wrote")
        self.coef_ = np.asarray(arrays["coef"], dtype=np.float64)
        self.classes_ = None if state["classes"] is None else np.asarray(state["classes"])
        self.n_features_in_ = state["n_features_in"]
        for k in ("epsilon", "delta", "sigma", "steps"):
            setattr(self, k + "_", state.get(k))
        self.guarantee_void_ = state.get("guarantee_void", False)

    def objective(self, X, y) -> float:
        """The primal objective P(theta) = mean loss + (lam/2) ||theta||^2 on (X, y)."""
        margins = torch.as_tensor(self.decision_function(X))
        glm = make_glm(self.task)
        y = np.asarray(y, dtype=np.float64) if self.classes_ is None else BinaryLabels.encode(self, y)
        return float(glm.loss(margins, torch.as_tensor(y)).mean()) + 0.5 * self.lam * float(self.coef_ @ self.coef_)


class DPSCD(GLMPredictions, BaseEstimator):
    """Differentially private stochastic coordinate descent for ridge, logistic regression and the L2-SVM.

    Parameters follow the paper: ``epsilon``, ``delta`` the budget; ``L`` the
    mini-batch size; ``C`` the clipping bound of a coordinate step; ``lam``
    the L2 regularisation lambda; ``epochs`` passes over the data. ``C=None``
    (the default) is 0.01 for the private variants (as ``vfl dpscd``: with unit
    rows a larger bound only adds noise; C=1 gave one class on breast_cancer)
    and no clipping (inf) for ``nonprivate``.
    ``variant``: ``dual`` (DP-SCD), ``seq`` (seqDP-SCD), ``primal`` (primal
    DP-SCD) or ``nonprivate`` (SCD). ``accountant``: opacus' ``rdp``, ``prv``
    or ``gdp`` (``prv``, the default, is the tightest). ``L`` above the
    training rows N is clipped to N with a warning (q = 1), as scikit-learn's
    MLP clips its batch size. ``normalize_rows`` (None, the default: True
    except for ``variant="primal"``; ``vfl dpscd`` normalises too) divides
    each row by its L2 norm before training and prediction: the row variants'
    sensitivity bounds need norms <= 1, and a per-row map keeps neighbouring
    data sets neighbours, so the accounting is unchanged. With
    ``normalize_rows=False`` rows of norm > 1 are refused (scale them
    yourself). Primal DP-SCD bounds column norms instead; dividing a column
    by its norm would make every row depend on the others, so columns of
    norm > 1 are refused with the fix, never rescaled. The batch schedule and
    the noise come from OS entropy; ``simulation_seed`` seeds them for a
    reproducible simulation, and then the DP guarantee is void
    (``guarantee_void_`` is True and a ``SimulationWarning`` is raised).

    Learned: ``coef_`` (theta, the private release), ``sigma_`` (noise
    multiplier), ``noise_std_`` (sigma times the sensitivity), ``sample_rate_``
    (q = L / N), ``steps_``, ``epsilon_`` (towards an outsider, from opacus),
    ``observers_`` (epsilon per observer), ``history_`` (epsilon after each
    epoch; the training objective too only with ``monitor_objective=True``,
    which is not private), ``classes_``. ``dual_coef_`` (alpha) exists only for
    the non-private variant: the dual variables are not noised enough to be
    released (their support shows which rows were in each batch).
    """

    _model_method = "dpscd"

    def __init__(self, task: str = "logistic", variant: str = "dual", epsilon: float = 1.0, delta: float = 1e-3,
                 L: int = 100, C: float | None = None, lam: float = 1e-4, epochs: float = 10, accountant: str = "prv",
                 sampling: str | None = None, newton_steps: int = 1, sigma: float | None = None,
                 normalize_rows: bool | None = None, simulation_seed: int | None = None, device: str = "cpu",
                 monitor_every: int = 1, monitor_objective: bool = False):
        self.task = task
        self.variant = variant
        self.epsilon = epsilon
        self.delta = delta
        self.L = L
        self.C = C
        self.lam = lam
        self.epochs = epochs
        self.accountant = accountant
        self.sampling = sampling
        self.newton_steps = newton_steps
        self.sigma = sigma
        self.normalize_rows = normalize_rows
        self.simulation_seed = simulation_seed
        self.device = device
        self.monitor_every = monitor_every
        self.monitor_objective = monitor_objective

    def _config(self, L=None) -> DPSCDConfig:
        C = self.C if self.C is not None else (math.inf if self.variant == "nonprivate" else 0.01)
        return DPSCDConfig(task=self.task, variant=self.variant, epsilon=self.epsilon, delta=self.delta,
                           L=self.L if L is None else L,
                           C=C, lam=self.lam, epochs=self.epochs, accountant=self.accountant,
                           sampling=self.sampling, newton_steps=self.newton_steps, sigma=self.sigma)

    def fit(self, X, y, *, noise_blocks=None, on_step=None):
        """Train on rows ``X`` and labels ``y`` (binary: any two values, the larger is the positive class)."""
        X, y = self._fit_inputs(X, y)
        if self._unit_rows():
            X = unit_rows(X)
        fed = Federation.local(self.device)
        dev = fed.device
        Xt = torch.as_tensor(X, dtype=torch.float64, device=dev)
        yt = torch.as_tensor(y, dtype=torch.float64, device=dev)
        self.history_ = []
        # Primal DP-SCD draws L coordinates (features) per step, the others L rows.
        primal = self.variant == "primal"
        self.L_ = clip_batch(self, "L", self.L, X.shape[1] if primal else X.shape[0],
                             "features" if primal else "training rows")
        result = fit_glm(fed, Xt, yt, self._config(self.L_), simulation_seed=self.simulation_seed,
                         noise_blocks=noise_blocks, monitor_every=self.monitor_every,
                         monitor_objective=self.monitor_objective, on_epoch=self.history_.append, on_step=on_step)
        self.coef_ = to_numpy(result.theta)
        if self.variant == "nonprivate":
            self.dual_coef_ = to_numpy(result.alpha)
        elif hasattr(self, "dual_coef_"):
            del self.dual_coef_
        self.observers_ = result.observers
        self.guarantee_void_ = result.simulated
        self.sigma_ = result.sigma
        self.noise_std_ = result.noise_std
        self.sensitivity_ = result.sensitivity
        self.sample_rate_ = result.sample_rate
        self.steps_ = result.steps
        self.epsilon_ = result.epsilon
        self.delta_ = result.delta
        self.sampling_ = result.sampling
        self.train_seconds_ = result.train_seconds
        self.n_features_in_ = X.shape[1]
        return self
