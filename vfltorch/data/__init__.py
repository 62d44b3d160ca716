"""Vertical data: named datasets, loaders, partitioning, per-party preprocessing, validation.

The names below are imported on first use (PEP 562), so that ``vfl --help`` and
option errors, which need only ``VFLInputError``, do not pay for torch, pandas
or scikit-learn.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Table": "loaders", "load_csv": "loaders", "load_file": "loaders", "load_svmlight": "loaders",
    "parse_groups": "partition", "partition_columns": "partition", "split_rows": "partition",
    "DataConfig": "party", "PartyData": "party", "load_party_data": "party",
    "federated_row_norms": "preprocess", "impute": "preprocess", "normalize_rows": "preprocess",
    "scale_columns": "preprocess",
    "REGISTRY": "registry", "Dataset": "registry", "DatasetSpec": "registry", "available": "registry",
    "load_dataset": "registry", "resolve_data_dir": "registry",
    "VFLInputError": "validation", "check_finite": "validation", "check_labels": "validation",
    "check_partition": "validation", "check_same_rows": "validation",
    "NotFittedError": "estimator_input",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
