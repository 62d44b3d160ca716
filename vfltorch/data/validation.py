"""Input validation at the boundary: every message says what is wrong and how to fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class VFLInputError(ValueError):
    """Bad input from the user: data, labels, partition or options."""


def check_finite(X: np.ndarray, feature_names=None, where: str = "the data") -> None:
    """No NaN or inf; names the offending columns."""
    import numpy as np  # not at the top: the launcher imports this module for VFLInputError alone

    X = np.asarray(X)
    bad = ~np.isfinite(X)
    if bad.any():
        cols = np.flatnonzero(bad.any(axis=0))
        names = [str(feature_names[c]) if feature_names is not None else str(c) for c in cols[:8]]
        more = f" and {len(cols) - 8} more" if len(cols) > 8 else ""
        raise VFLInputError(
            f"{where} has {int(bad.sum())} NaN or infinite values in column(s) {', '.join(names)}{more}. "
            f"Impute them (--impute median or --impute mean), or drop those rows/columns before loading.")


MAX_ABS_VALUE = 1e100


def check_file_values(X, feature_names, source: str, first_line: int = 1, *, impute: str = "none") -> None:
    """Values of a file as read: no infinity, no absurd magnitude, no NaN unless it will be imputed.

    Names the file, the column and the line of the first offending value, so the user can go and look.
    """
    import numpy as np  # not at the top: the launcher imports this module for VFLInputError alone

    import scipy.sparse as sp

    if sp.issparse(X):
        X = X.tocsr()
        values = X.data
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        cols = X.indices
    else:
        X = np.asarray(X, dtype=np.float64)
        values, rows, cols = X.ravel(), None, None
    checks = [(np.isinf(values), "an infinite value", "infinite values cannot be imputed: fix or drop that row"),
              (np.isfinite(values) & (np.abs(np.nan_to_num(values)) > MAX_ABS_VALUE),
               f"a value beyond +-{MAX_ABS_VALUE:g}",
               "no method can compute with such magnitudes: rescale that column in the file (e.g. to other "
               "units) or drop it")]
    if impute in (None, "none"):
        checks.append((np.isnan(values), "a missing value (NaN)",
                       "pass --impute median (or mean) to fill missing values, or fix the file"))
    for bad, what, fix in checks:
        hits = np.flatnonzero(bad)
        if len(hits) == 0:
            continue
        k = int(hits[0])
        if rows is None:
            row, col = divmod(k, X.shape[1])
        else:
            row, col = int(rows[k]), int(cols[k])
        name = feature_names[col] if feature_names is not None else str(col)
        raise VFLInputError(f"{source}: column {name!r} holds {what} ({values[k]:g}) at line {row + first_line}"
                            f"{f', and {len(hits) - 1} more such values' if len(hits) > 1 else ''}: {fix}")


def check_labels(y: np.ndarray, task: str, where: str = "the labels") -> None:
    """Labels must be finite; binary labels in {-1, +1}."""
    import numpy as np  # not at the top: the launcher imports this module for VFLInputError alone

    y = np.asarray(y)
    if y.ndim != 1:
        raise VFLInputError(f"{where} must be one column, got shape {y.shape}")
    if y.dtype.kind in "fc" and not np.isfinite(y).all():
        raise VFLInputError(f"{where} contain NaN or infinite values: drop those rows or fix the label column")
    if task == "binary":
        values = set(np.unique(y).tolist())
        if not values <= {-1.0, 1.0}:
            shown = sorted(values)[:6]
            raise VFLInputError(
                f"{where} of a binary task must be -1 and +1, got {shown}{'...' if len(values) > 6 else ''}. "
                f"Map the negative class to -1 and the positive class to +1 (named datasets do this on load; "
                f"for your own file pass --positive-label VALUE).")


def check_same_rows(counts: dict, what: str = "training rows") -> None:
    """Every party must hold the same number of rows (the rows are the shared sample axis)."""
    values = set(counts.values())
    if len(values) > 1:
        listing = ", ".join(f"party {p}: {n}" for p, n in sorted(counts.items()))
        raise VFLInputError(
            f"the parties disagree on the number of {what} ({listing}). Vertical federated learning needs the "
            f"same rows at every party: align the files on a shared ID column (--id-column) or fix the inputs.")


def check_partition(groups, n_features: int) -> None:
    """Feature groups: non-empty, disjoint, in range, covering every column."""
    import numpy as np  # not at the top: the launcher imports this module for VFLInputError alone

    if len(groups) > n_features:
        raise VFLInputError(
            f"{len(groups)} parties but only {n_features} features: every party needs at least one column. "
            f"Use at most {n_features} parties.")
    seen = np.zeros(n_features, dtype=int)
    for p, g in enumerate(groups):
        g = np.asarray(g)
        if g.size == 0:
            raise VFLInputError(f"party {p} has no columns: give it at least one feature")
        if g.min() < 0 or g.max() >= n_features:
            raise VFLInputError(f"party {p} has column indices outside 0..{n_features - 1}: {g[(g < 0) | (g >= n_features)][:5].tolist()}")
        seen[g] += 1
    if (seen > 1).any():
        raise VFLInputError(f"columns {np.flatnonzero(seen > 1)[:8].tolist()} are assigned to more than one party")
    if (seen == 0).any():
        raise VFLInputError(f"columns {np.flatnonzero(seen == 0)[:8].tolist()} belong to no party: "
                            f"every column must have an owner")
