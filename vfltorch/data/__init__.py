"""Vertical data: named datasets, loaders, partitioning, per-party preprocessing, validation."""

from .loaders import Table, load_csv, load_file, load_svmlight
from .partition import parse_groups, partition_columns, split_rows
from .party import DataConfig, PartyData, load_party_data
from .preprocess import federated_row_norms, impute, normalize_rows, scale_columns
from .registry import REGISTRY, Dataset, DatasetSpec, available, load_dataset, resolve_data_dir
from .validation import VFLInputError, check_finite, check_labels, check_partition, check_same_rows

__all__ = [
    "DataConfig", "Dataset", "DatasetSpec", "PartyData", "REGISTRY", "Table", "VFLInputError", "available",
    "check_finite", "check_labels", "check_partition", "check_same_rows", "federated_row_norms", "impute",
    "load_csv", "load_dataset", "load_file", "load_party_data", "load_svmlight", "normalize_rows",
    "parse_groups", "partition_columns", "resolve_data_dir", "scale_columns", "split_rows",
]
