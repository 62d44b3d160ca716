"""Vertical partitioning: which columns each party owns, and the shared train/test split of rows.

Both are computed from a seed that every party knows, so every party derives
the same answer without talking.
"""

from __future__ import annotations

import numpy as np

from .validation import VFLInputError, check_partition


def partition_columns(n_features: int, parties: int, scheme: str = "contiguous", *, seed: int = 0,
                      groups=None) -> list[np.ndarray]:
    """Column indices per party.

    ``contiguous``: equal-sized runs 0..k-1, k..2k-1, ...; ``random``: a seeded
    permutation cut into equal parts (each part sorted); ``explicit``: ``groups``,
    a list of index lists or the CLI string form ``"0-9;10-17;18,20-22"``.
    """
    if parties < 1:
        raise VFLInputError(f"need at least one party, got {parties}")
    if scheme == "explicit" or groups is not None:
        groups = parse_groups(groups) if isinstance(groups, str) else [np.asarray(g, dtype=np.int64) for g in groups]
        if len(groups) != parties:
            raise VFLInputError(f"--feature-groups gives {len(groups)} groups for {parties} parties: give one "
                                f"group per party, separated by ';'")
    elif scheme == "contiguous":
        if parties > n_features:
            check_partition([[]] * parties, n_features)
        groups = np.array_split(np.arange(n_features), parties)
    elif scheme == "random":
        if parties > n_features:
            check_partition([[]] * parties, n_features)
        perm = np.random.default_rng(seed).permutation(n_features)
        groups = [np.sort(g) for g in np.array_split(perm, parties)]
    else:
        raise VFLInputError(f"unknown partition scheme {scheme!r}: choose contiguous, random or explicit")
    groups = [np.asarray(g, dtype=np.int64) for g in groups]
    check_partition(groups, n_features)
    return groups


def parse_groups(text: str) -> list[np.ndarray]:
    """``"0-9;10-17;18,20-22"`` -> three index arrays (inclusive ranges, 0-based)."""
    groups = []
    for part in text.split(";"):
        idx = []
        for item in filter(None, (s.strip() for s in part.split(","))):
            try:
                if "-" in item:
                    lo, hi = (int(v) for v in item.split("-", 1))
                    if hi < lo:
                        raise ValueError
                    idx.extend(range(lo, hi + 1))
                else:
                    idx.append(int(item))
            except ValueError:
                raise VFLInputError(f"cannot read feature group item {item!r}: use 0-based indices and "
                                    f"inclusive ranges, e.g. '0-9;10-17;18,20-22'") from None
        groups.append(np.asarray(idx, dtype=np.int64))
    return groups


def split_rows(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic shuffle-split of row indices from the shared seed: (train, test)."""
    if not 0.0 <= test_fraction < 1.0:
        raise VFLInputError(f"--test-fraction must be in [0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    if n - n_test < 1:
        raise VFLInputError(f"only {n} rows: nothing left to train on with --test-fraction {test_fraction}")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])
