"""A party's share of the data: its own columns, and the labels only at the active party.

``load_party_data(fed, config)`` runs inside each party process. With a named
dataset or a single file, every process reads the file (the simulation of Q
organisations on one machine), keeps its own columns and drops the rest at
once. With ``party_files`` each party reads only its own file and the rows are
aligned on an ID column (the hashed IDs are exchanged with the active party
in the clear: vfltorch does no private set intersection).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from ..comm import Federation
from .loaders import load_file, stable_id_hash
from .partition import partition_columns, split_rows
from .preprocess import clip_columns, impute, normalize_rows, scale_columns
from .registry import REGISTRY, Dataset, load_dataset
from .validation import VFLInputError, check_finite, check_labels, check_same_rows


@dataclass
class DataConfig:
    """Everything that decides which rows and columns a party holds. Built from the CLI's common options."""

    dataset: str = "breast_cancer"
    test_dataset: str | None = None
    data_dir: str | None = None
    task: str | None = None                 # for user files: binary | regression | multiclass
    label_column: str | None = None
    positive_label: str | None = None
    id_column: str | None = None
    party_files: list[str] = field(default_factory=list)
    partition: str = "contiguous"
    feature_groups: str | None = None
    test_fraction: float = 0.25
    seed: int = 0
    impute: str | None = None               # None: the dataset's default
    scale: str = "none"
    clip: float | None = None               # winsorise scaled values to [-clip, clip]
    normalize_rows: bool = False
    dtype: str = "float64"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class PartyData:
    """One party's data. ``y_*`` are ``None`` except at the active party."""

    party: int
    num_parties: int
    dataset: str
    task: str
    columns: np.ndarray                    # global indices of this party's columns
    feature_names: list[str]
    n_features_total: int
    X_train: torch.Tensor
    X_test: torch.Tensor | None
    y_train: torch.Tensor | None
    y_test: torch.Tensor | None
    classes: list | None = None

    @property
    def n_train(self) -> int:
        return self.X_train.shape[0]

    @property
    def n_test(self) -> int:
        return 0 if self.X_test is None else self.X_test.shape[0]

    def check_local_only(self, active: int) -> None:
        """Assert the privacy invariant: this party holds exactly its columns; labels only if active."""
        assert self.X_train.shape[1] == len(self.columns), "a party holds columns it does not own"
        if self.X_test is not None:
            assert self.X_test.shape[1] == len(self.columns), "a party holds test columns it does not own"
        if self.party != active:
            assert self.y_train is None and self.y_test is None, "a passive party holds labels"


def load_party_data(fed: Federation, config: DataConfig) -> PartyData:
    """This party's columns (and labels, if active) of the configured dataset, split and preprocessed."""
    if not fed.is_data_party:
        raise VFLInputError("the coordinator holds no data")
    party, q = fed.parties.index(fed.rank), fed.num_parties
    if config.party_files:
        table = _load_own_file(fed, config)
    else:
        table = _load_whole(config)
    n_total = table.n_features
    if config.party_files:
        columns = np.arange(n_total)  # the party's file is its columns
    else:
        groups = partition_columns(n_total, q, config.partition, seed=config.seed,
                                   groups=config.feature_groups)
        columns = groups[party]
        # Keep only this party's columns; the full matrix is dropped here.
        table.X = table.X[:, columns]
        table.X_test = None if table.X_test is None else table.X_test[:, columns]
        table.feature_names = [table.feature_names[c] for c in columns]
    # Sparse inputs (LIBSVM) become dense only now, for this party's columns alone.
    table.X = _dense(table.X)
    table.X_test = None if table.X_test is None else _dense(table.X_test)

    X_tr, X_te, y_tr, y_te = _split(table, config)
    how = config.impute if config.impute is not None else table.impute
    X_tr, X_te = impute(X_tr, X_te, how)
    check_finite(X_tr, table.feature_names, f"party {party}'s training columns")
    if X_te is not None:
        check_finite(X_te, table.feature_names, f"party {party}'s test columns")
    X_tr, X_te = scale_columns(X_tr, X_te, config.scale)
    X_tr, X_te = clip_columns(X_tr, X_te, config.clip)

    # Labels stay with the active party.
    if fed.rank != fed.active:
        y_tr = y_te = None
    elif y_tr is not None:
        check_labels(y_tr, table.task, "the training labels")
        if y_te is not None:
            check_labels(y_te, table.task, "the test labels")

    _check_rows(fed, X_tr.shape[0], 0 if X_te is None else X_te.shape[0])

    # Tensors live on the party's device (``--device``): methods work where the data already is.
    dtype = getattr(torch, config.dtype)
    to = lambda a: None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=dtype,  # noqa: E731
                                                          device=fed.device)
    data = PartyData(party, q, table.name, table.task, np.asarray(columns), list(table.feature_names),
                     n_total if not config.party_files else X_tr.shape[1], to(X_tr), to(X_te), to(y_tr),
                     to(y_te), table.classes)
    if config.normalize_rows:
        data.X_train = normalize_rows(fed, data.X_train)
        if data.X_test is not None:
            data.X_test = normalize_rows(fed, data.X_test)
    data.check_local_only(fed.active)
    return data


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def _load_whole(config: DataConfig) -> Dataset:
    if config.dataset in REGISTRY:
        ds = load_dataset(config.dataset, config.data_dir)
        if config.test_dataset:
            raise VFLInputError(f"dataset {config.dataset!r} is a registered name; --test-dataset is only "
                                f"for your own files")
        return ds
    if not Path(config.dataset).exists():
        raise VFLInputError(f"unknown dataset {config.dataset!r}: not a registered name "
                            f"({', '.join(sorted(REGISTRY))}) and no such file")
    train = load_file(config.dataset, label_column=config.label_column)
    test = None
    if config.test_dataset:
        test = load_file(config.test_dataset, label_column=config.label_column, n_features=train.X.shape[1])
        if test.X.shape[1] != train.X.shape[1]:
            raise VFLInputError(f"the test file has {test.X.shape[1]} features, the training file "
                                f"{train.X.shape[1]}: they must match")
    return _user_dataset(Path(config.dataset).name, train, test, config)


def _user_dataset(name, train, test, config: DataConfig) -> Dataset:
    task = config.task or ("binary" if train.y is not None and len(np.unique(train.y)) == 2 else
                           "regression" if train.y is not None else "unsupervised")
    y, y_test, classes = train.y, None if test is None else test.y, None
    if task == "binary" and y is not None:
        values = sorted(set(np.unique(y).tolist()) | (set(np.unique(y_test).tolist()) if y_test is not None else set()),
                        key=str)
        if len(values) != 2:
            raise VFLInputError(f"a binary task needs two label values, found {values[:8]}")
        positive = _positive(values, config.positive_label)
        classes = [v for v in values if v != positive] + [positive]
        y = np.where(y == positive, 1.0, -1.0)
        y_test = None if y_test is None else np.where(y_test == positive, 1.0, -1.0)
    elif task == "multiclass" and y is not None:
        classes, y = np.unique(y, return_inverse=True)
        y_test = None if y_test is None else np.searchsorted(classes, y_test)
        classes = classes.tolist()
    elif y is not None:
        y = y.astype(np.float64)
        y_test = None if y_test is None else y_test.astype(np.float64)
    return Dataset(name, task, train.X, y, train.feature_names, X_test=None if test is None else test.X,
                   y_test=y_test, classes=classes, source=str(config.dataset))


def _positive(values, given):
    if given is None:
        # The larger value is positive: +1 of {-1, +1}, 1 of {0, 1}.
        return max(values, key=lambda v: (float(v) if _is_number(v) else float("-inf"), str(v)))
    for v in values:
        if str(v) == str(given) or (_is_number(v) and _is_number(given) and float(v) == float(given)):
            return v
    raise VFLInputError(f"--positive-label {given!r} is not one of the label values {values}")


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _load_own_file(fed: Federation, config: DataConfig) -> Dataset:
    """One file per party, joined on the ID column: rows are put in the order of the common IDs."""
    if len(config.party_files) != fed.num_parties:
        raise VFLInputError(f"--party-files gives {len(config.party_files)} files for {fed.num_parties} parties")
    if not config.id_column:
        raise VFLInputError("--party-files needs --id-column: the rows of the parties' files are matched on it")
    path = config.party_files[fed.parties.index(fed.rank)]
    label = config.label_column if fed.is_active else None
    table = load_file(path, label_column=label, id_column=config.id_column)
    if fed.is_active and table.y is None:
        raise VFLInputError(f"the active party's file {path} has no label column: pass --label-column")
    ids = stable_id_hash(table.ids)
    if len(np.unique(ids)) != len(ids):
        raise VFLInputError(f"{path}: the ID column {config.id_column!r} has duplicate values")
    # The active party intersects the hashed IDs and tells everyone the common order.
    with fed.phase("data/align-ids"):
        all_ids = fed.gather_json(ids.tolist(), fed.active, ranks=fed.parties)
        plan = None
        if fed.is_active:
            common = set(all_ids[0])
            for other in all_ids[1:]:
                common &= set(other)
            task = _user_dataset(path, table, None, config).task
            plan = {"order": sorted(common), "task": task}
        plan = fed.broadcast_json(plan, fed.active, ranks=fed.parties)
    order = plan["order"]
    if not order:
        raise VFLInputError("the parties' files have no ID in common: check --id-column and the files")
    pos = {v: i for i, v in enumerate(ids.tolist())}
    rows = np.array([pos[v] for v in order])
    train = type(table)(table.X[rows], None if table.y is None else table.y[rows], table.feature_names)
    ds = _user_dataset(Path(path).name, train, None, config)
    ds.task = plan["task"]
    return ds


def _split(ds: Dataset, config: DataConfig):
    if ds.X_test is not None:
        return ds.X, ds.X_test, ds.y, ds.y_test
    if config.test_fraction == 0:
        return ds.X, None, ds.y, None
    train, test = split_rows(ds.X.shape[0], config.test_fraction, config.seed)
    pick = lambda a, rows: None if a is None else a[rows]  # noqa: E731
    return ds.X[train], ds.X[test], pick(ds.y, train), pick(ds.y, test)


def _check_rows(fed: Federation, n_train: int, n_test: int) -> None:
    """Every party must hold the same rows: compare counts at the active party and tell everyone."""
    if fed.num_parties == 1:
        return
    with fed.phase("data/check-rows"):
        counts = fed.gather_json([n_train, n_test], fed.active, ranks=fed.parties)
        verdict = None
        if fed.is_active:
            try:
                check_same_rows(dict(zip(fed.parties, (c[0] for c in counts))), "training rows")
                check_same_rows(dict(zip(fed.parties, (c[1] for c in counts))), "test rows")
            except VFLInputError as exc:
                verdict = str(exc)
        verdict = fed.broadcast_json(verdict, fed.active, ranks=fed.parties)
    if verdict:
        raise VFLInputError(verdict)
