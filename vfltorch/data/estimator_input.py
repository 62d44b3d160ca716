"""What every estimator does at its edge: validate inputs, encode two-class labels, refuse unfitted use.

One helper module for all estimators (FDSKL, hetero-LR, DP-SCD / DP-SGD, the PCA family), so that they
behave as scikit-learn citizens the same way:

* ``features(est, X, reset=...)``: numpy arrays, pandas frames and lists go through scikit-learn's
  ``validate_data`` (2-D, float64, finite, at least one row and one column, ``n_features_in_`` /
  ``feature_names_in_`` set at fit and checked afterwards). torch tensors are accepted as they are
  (2-D, floating or integer; the device is kept) and ``n_features_in_`` is set and checked the same way.
  Returns ``(X, was_torch)``: an estimator answers numpy with numpy and torch with torch.
  In a federation (``federated=True``) a party must not raise alone before the parties agree (the others
  would wait for it until the timeout): only the conversion is done here, and the estimator's agreed
  checks (NaN, column counts) report the problem at every party together.
* ``BinaryLabels``: any two labels (strings, {0, 1}, {-1, +1}, booleans) as ``classes_`` (sorted, the
  second is the positive class, as scikit-learn's), mapped to the -1 / +1 every method here trains on,
  and back for ``predict``.
* ``NotFittedError``: scikit-learn's (and still a ``VFLInputError``, so old ``except`` clauses hold).
* ``resolve_fed``: the federation handle is a constructor argument everywhere (``Est(fed=fed)``); an
  old ``fit(X, fed)`` keeps working with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sklearn.exceptions import NotFittedError as _SkNotFittedError
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d, validate_data

from ..devices import to_numpy
from .validation import VFLInputError


class NotFittedError(_SkNotFittedError, VFLInputError):
    """An estimator used before ``fit``: scikit-learn's ``NotFittedError`` and the toolkit's ``VFLInputError``."""


def check_fitted(est, attribute: str) -> None:
    if not hasattr(est, attribute):
        raise NotFittedError(f"This {type(est).__name__} instance is not fitted yet. Call 'fit' with appropriate "
                             f"arguments before using this estimator.")


def _check_count(est, n_features: int, reset: bool) -> None:
    if reset:
        est.n_features_in_ = int(n_features)
        if hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
        return
    expected = getattr(est, "n_features_in_", None)
    if expected is not None and n_features != expected:
        raise VFLInputError(f"X has {n_features} features, but {type(est).__name__} is expecting {expected} "
                            f"features as input.")


def features(est, X, *, reset: bool, federated: bool = False, ensure_min_samples: int = 1):
    """This party's columns as float64 numpy (from numpy / pandas / lists) or as the torch tensor given.

    Returns ``(X, was_torch)``. ``reset=True`` at fit (sets ``n_features_in_``), False afterwards
    (checks it). ``federated=True``: convert (and set ``n_features_in_``, this party's columns) only; the
    estimator checks the rest together with the other parties.
    """
    if isinstance(X, torch.Tensor):
        if X.dim() != 2:
            raise VFLInputError(f"X must be a 2-D array (rows x columns), got a tensor of shape {tuple(X.shape)}")
        if reset or not federated:
            _check_count(est, X.shape[1], reset)
        return X, True
    if federated:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise VFLInputError(f"X must be a 2-D array (rows x columns), got shape {X.shape}")
        if reset:
            _check_count(est, X.shape[1], reset)
        return X, False
    return validate_data(est, X, reset=reset, dtype=np.float64, ensure_min_samples=ensure_min_samples), False


def output(values: np.ndarray | torch.Tensor, as_torch: bool, like: torch.Tensor | None = None):
    """numpy in, numpy out; torch in, torch out."""
    if as_torch:
        t = torch.as_tensor(values)
        return t.to(like.device) if like is not None else t
    return to_numpy(values)


class BinaryLabels:
    """Any two labels <-> the -1 / +1 the methods train on. ``classes_[1]`` is the positive class."""

    @staticmethod
    def fit(est, y, n_rows: int | None = None) -> np.ndarray:
        """Set ``est.classes_`` and return y as float64 -1 / +1 (numpy)."""
        require_y(est, y)
        if isinstance(y, torch.Tensor):
            y = to_numpy(y)
        y = column_or_1d(y, warn=True)
        if n_rows is not None and y.shape[0] != n_rows:
            raise VFLInputError(f"y has {y.shape[0]} labels for {n_rows} rows of X: one label per row")
        if y.dtype.kind in "fc" and not np.isfinite(y).all():
            raise VFLInputError("the labels contain NaN or infinite values: drop those rows or fix the label column")
        check_classification_targets(y)
        classes = np.unique(y)
        if len(classes) != 2:
            shown = classes[:6].tolist()
            more = "..." if len(classes) > 6 else ""
            if len(classes) > 2:
                raise VFLInputError(f"Only binary classification is supported: {type(est).__name__} needs exactly "
                                    f"two classes in y, got {len(classes)} classes {shown}{more}")
            raise VFLInputError(f"{type(est).__name__} needs two classes in y, got only one class {shown}")
        est.classes_ = classes
        return np.where(y == classes[1], 1.0, -1.0)

    @staticmethod
    def encode(est, y) -> np.ndarray:
        """Labels of fitted classes as -1 / +1 (for scoring and monitoring)."""
        if isinstance(y, torch.Tensor):
            y = to_numpy(y)
        y = np.asarray(y).reshape(-1)
        return np.where(y == est.classes_[1], 1.0, -1.0)

    @staticmethod
    def decode(est, positive, as_torch: bool = False, like: torch.Tensor | None = None):
        """Original labels from a boolean mask of positive predictions."""
        if isinstance(positive, torch.Tensor):
            positive = to_numpy(positive)
        labels = np.where(np.asarray(positive, dtype=bool), est.classes_[1], est.classes_[0])
        if as_torch and labels.dtype.kind in "biuf":
            t = torch.as_tensor(labels.astype(np.float64))
            return t.to(like.device) if like is not None else t
        return labels


def require_y(est, y) -> None:
    """A supervised fit without labels: scikit-learn's wording."""
    if y is None:
        raise VFLInputError(f"{type(est).__name__} requires y to be passed, but the target y is None")


def proba_columns(p_positive) -> np.ndarray:
    """(n, 2) probabilities [P(classes_[0]), P(classes_[1])] from P(positive)."""
    if isinstance(p_positive, torch.Tensor):
        p_positive = to_numpy(p_positive)
    p = np.asarray(p_positive, dtype=np.float64).reshape(-1)
    return np.column_stack([1.0 - p, p])


def binary_classifier_tags(tags):
    """scikit-learn tags of a two-class classifier."""
    tags.classifier_tags.multi_class = False
    return tags


def resolve_fed(est, fed, where: str = "fit"):
    """The federation to use: the constructor's ``fed``; a ``fed`` passed to ``fit`` still works, deprecated."""
    if fed is None:
        return est.fed
    warnings.warn(f"{type(est).__name__}.{where}(..., fed) is deprecated: pass the federation to the constructor, "
                  f"{type(est).__name__}(..., fed=fed), as for every vfltorch estimator", DeprecationWarning,
                  stacklevel=3)
    if est.fed is not None and est.fed is not fed:
        raise VFLInputError(f"{type(est).__name__} got two federations: one in the constructor and another in "
                            f"{where}(); pass it to the constructor only")
    return fed


__all__ = ["BinaryLabels", "NotFittedError", "binary_classifier_tags", "check_fitted", "features", "output",
           "proba_columns", "require_y", "resolve_fed"]
