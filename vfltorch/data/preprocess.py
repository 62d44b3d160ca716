"""Preprocessing, each party on its own columns; row normalisation through a secure sum.

Column-wise steps (imputation, min-max, standardisation) need nothing from the
other parties: each party fits them on the training rows of its own columns
and applies them to its test rows.

Per-sample L2 normalisation needs each row's norm over *all* columns: every
party computes the squared norm of its part of each row, the parts are summed
with ring masks (``vfltorch.comm.secure_sum``) at the active party, and the
norms are broadcast. The parties learn the row norms (one number per row, the
quantity the methods need), never each other's columns.
"""

from __future__ import annotations

import numpy as np
import torch

from ..comm import Federation, secure_allreduce
from .validation import VFLInputError

SCALERS = ("none", "minmax", "standard", "maxabs")
IMPUTERS = ("none", "median", "mean")


def impute(X_train: np.ndarray, X_test: np.ndarray | None, how: str):
    """Fill NaN with the training-row median or mean of each column."""
    if how == "none":
        return X_train, X_test
    if how not in IMPUTERS:
        raise VFLInputError(f"unknown imputation {how!r}: choose one of {IMPUTERS}")
    stat = np.nanmedian if how == "median" else np.nanmean
    with np.errstate(all="ignore"):
        fill = stat(X_train, axis=0)
    fill = np.where(np.isfinite(fill), fill, 0.0)  # an all-NaN column becomes 0
    def apply(X):
        if X is None:
            return None
        X = X.copy()
        rows, cols = np.nonzero(np.isnan(X))
        X[rows, cols] = fill[cols]
        return X
    return apply(X_train), apply(X_test)


def scale_columns(X_train: np.ndarray, X_test: np.ndarray | None, how: str):
    """Fit a column scaling on the training rows and apply it to both. Constant columns are left at 0."""
    if how == "none":
        return X_train, X_test
    if how == "minmax":
        lo, hi = X_train.min(axis=0), X_train.max(axis=0)
        shift, div = lo, hi - lo
    elif how == "standard":
        shift, div = X_train.mean(axis=0), X_train.std(axis=0)
    elif how == "maxabs":
        shift, div = np.zeros(X_train.shape[1]), np.abs(X_train).max(axis=0)
    else:
        raise VFLInputError(f"unknown scaling {how!r}: choose one of {SCALERS}")
    div = np.where(div > 0, div, 1.0)
    f = lambda X: None if X is None else (X - shift) / div  # noqa: E731
    return f(X_train), f(X_test)


def clip_columns(X_train: np.ndarray, X_test: np.ndarray | None, bound: float | None):
    """Winsorise every value to [-bound, bound] (after scaling): heavy tails such as Give Me Some Credit's
    standardised values in the hundreds otherwise dominate a gradient step. Purely local, per party."""
    if bound is None:
        return X_train, X_test
    if not bound > 0:
        raise VFLInputError(f"--clip-values must be a positive number (a bound on the scaled values), got {bound}")
    return np.clip(X_train, -bound, bound), None if X_test is None else np.clip(X_test, -bound, bound)


def federated_row_norms(fed: Federation, X_local: torch.Tensor) -> torch.Tensor:
    """L2 norm of every row over all parties' columns, at every data party.

    Squared norms of the local parts are summed with private ring masks at the
    active party (no party sees another's part) and broadcast down the
    pairwise tree (``vfltorch.comm.secure_allreduce``).
    """
    part = (X_local.to(torch.float64) ** 2).sum(dim=1)
    with fed.phase("preprocess/row-norms"):
        total = secure_allreduce(fed, part)
    return total.clamp_min(0).sqrt()


def normalize_rows(fed: Federation, X_local: torch.Tensor) -> torch.Tensor:
    """Divide each row (all parties' columns together) by its L2 norm; all-zero rows stay zero."""
    norms = federated_row_norms(fed, X_local)
    return X_local / torch.where(norms > 0, norms, torch.ones_like(norms)).to(X_local.dtype).unsqueeze(1)


class ColumnPreprocessing:
    """One party's fitted column steps (imputation, scaling, clipping): what a saved model keeps.

    ``fit`` learns the statistics from the training rows exactly as ``impute`` / ``scale_columns`` /
    ``clip_columns`` do; ``impute_rows`` and ``scale_rows`` apply them to any rows, so rows scored
    later by a saved model (``vfl predict``) go through the training transformation, not a refit.
    ``state()`` is (JSON metadata, numpy arrays) for a model shard; ``from_state`` rebuilds it.
    """

    def __init__(self, impute: str = "none", fill=None, scale: str = "none", shift=None, div=None,
                 clip: float | None = None):
        self.impute = impute
        self.fill = None if fill is None else np.asarray(fill, dtype=np.float64)
        self.scale = scale
        self.shift = None if shift is None else np.asarray(shift, dtype=np.float64)
        self.div = None if div is None else np.asarray(div, dtype=np.float64)
        self.clip = clip

    @classmethod
    def fit(cls, X_train: np.ndarray, impute: str, scale: str, clip: float | None) -> "ColumnPreprocessing":
        if impute not in IMPUTERS:
            raise VFLInputError(f"unknown imputation {impute!r}: choose one of {IMPUTERS}")
        if scale not in SCALERS:
            raise VFLInputError(f"unknown scaling {scale!r}: choose one of {SCALERS}")
        if clip is not None and not clip > 0:
            raise VFLInputError(f"--clip-values must be a positive number (a bound on the scaled values), got {clip}")
        fill = None
        if impute != "none":
            stat = np.nanmedian if impute == "median" else np.nanmean
            with np.errstate(all="ignore"):
                fill = stat(X_train, axis=0)
            fill = np.where(np.isfinite(fill), fill, 0.0)
        pre = cls(impute, fill, "none", None, None, clip)
        if scale != "none":
            X = pre.impute_rows(X_train)
            if scale == "minmax":
                lo, hi = X.min(axis=0), X.max(axis=0)
                shift, div = lo, hi - lo
            elif scale == "standard":
                shift, div = X.mean(axis=0), X.std(axis=0)
            else:
                shift, div = np.zeros(X.shape[1]), np.abs(X).max(axis=0)
            pre.scale, pre.shift, pre.div = scale, shift, np.where(div > 0, div, 1.0)
        return pre

    def impute_rows(self, X: np.ndarray | None):
        if X is None or self.fill is None:
            return X
        X = X.copy()
        rows, cols = np.nonzero(np.isnan(X))
        X[rows, cols] = self.fill[cols]
        return X

    def scale_rows(self, X: np.ndarray | None):
        if X is None:
            return None
        if self.shift is not None:
            X = (X - self.shift) / self.div
        if self.clip is not None:
            X = np.clip(X, -self.clip, self.clip)
        return X

    def check_columns(self, n: int) -> None:
        for name in ("fill", "shift", "div"):
            a = getattr(self, name)
            if a is not None and a.shape != (n,):
                raise VFLInputError(f"the saved preprocessing has {a.shape[0]} columns, the data {n}: score rows "
                                    f"with the same columns the model was trained on")

    def state(self) -> tuple[dict, dict]:
        meta = {"impute": self.impute, "scale": self.scale, "clip": self.clip}
        arrays = {f"preprocess_{k}": getattr(self, k) for k in ("fill", "shift", "div") if getattr(self, k) is not None}
        return meta, arrays

    @classmethod
    def from_state(cls, meta: dict, arrays: dict) -> "ColumnPreprocessing":
        return cls(meta.get("impute", "none"), arrays.get("preprocess_fill"), meta.get("scale", "none"),
                   arrays.get("preprocess_shift"), arrays.get("preprocess_div"), meta.get("clip"))
