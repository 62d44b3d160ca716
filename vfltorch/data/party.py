"""A party's share of the data: its own columns, and the labels only at the active party.

``load_party_data(fed, config)`` runs inside each party process. With a named
dataset or a single file, every process reads the file (the simulation of Q
organisations on one machine), keeps its own columns and drops the rest at
once. With ``party_files`` each party reads only its own file and the rows are
aligned on an ID column by private set intersection (``psi.py``; see
docs/alignment.md): no party sends its IDs or unkeyed hashes of them.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from ..comm import Federation
from .loaders import load_file
from .psi import PSIError, align_rows, canonical_id
from .partition import partition_columns, split_rows
from .preprocess import ColumnPreprocessing, normalize_rows
from .registry import REGISTRY, Dataset, load_dataset
from .labels import decide_task
from .validation import VFLInputError, check_file_values, check_finite, check_labels, check_same_rows


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
    aligned_rows: str | None = None          # `vfl align --rows-out` pattern: reuse that alignment, no PSI
    psi: str | None = None                   # PSI engine (psi.ENGINES); None: rr22 if spu is installed, else ecdh
    partition: str = "contiguous"
    feature_groups: str | None = None
    test_fraction: float = 0.25
    seed: int = 0
    impute: str | None = None               # None: the dataset's default
    scale: str = "none"
    clip: float | None = None               # winsorise scaled values to [-clip, clip]
    normalize_rows: bool = False
    dtype: str = "float64"
    # A saved model's fitted column steps (``ColumnPreprocessing``): applied instead of fitting new ones
    # (``vfl predict``); impute / scale / clip are then ignored.
    preprocessing: ColumnPreprocessing | None = None
    # Rows to score with a saved model (``vfl predict``): labels are optional, and one class is enough.
    scoring: bool = False

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("preprocessing", None)
        return out


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
    label_note: str = ""
    alignment: dict | None = None          # with --party-files: rows per party, aligned, dropped
    aligned_rows: np.ndarray | None = None  # with --party-files: this file's data rows in the aligned order
    aligned_ids: list | None = None         # ... and their IDs (local: never sent)
    preprocessing: ColumnPreprocessing | None = None   # the column steps fitted on (or given for) these rows

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
        # The party's file is its columns, numbered after the previous parties' (global indices: FDSKL
        # draws each column's random features from a public seed by its global index).
        with fed.phase("data/columns"):
            widths = fed.broadcast_json(fed.gather_json(n_total, fed.active, ranks=fed.parties), fed.active,
                                        ranks=fed.parties)
        offset = sum(widths[:party])
        columns = offset + np.arange(n_total)
        n_total = sum(widths)
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
    pre = config.preprocessing
    if pre is None:
        how = config.impute if config.impute is not None else table.impute
        pre = ColumnPreprocessing.fit(X_tr, how, config.scale, config.clip)
    else:
        pre.check_columns(X_tr.shape[1])
    X_tr, X_te = pre.impute_rows(X_tr), pre.impute_rows(X_te)
    check_finite(X_tr, table.feature_names, f"party {party}'s training columns")
    if X_te is not None:
        check_finite(X_te, table.feature_names, f"party {party}'s test columns")
    X_tr, X_te = pre.scale_rows(X_tr), pre.scale_rows(X_te)

    # Labels stay with the active party.
    if fed.rank != fed.active:
        y_tr = y_te = None
    elif y_tr is not None:
        check_labels(y_tr, table.task, "the training labels")
        if y_te is not None:
            check_labels(y_te, table.task, "the test labels")
        if not config.scoring:
            _check_both_classes(y_tr, table, config)

    _check_rows(fed, X_tr.shape[0], 0 if X_te is None else X_te.shape[0])

    # Tensors live on the party's device (``--device``): methods work where the data already is.
    dtype = getattr(torch, config.dtype)
    to = lambda a: None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=dtype,  # noqa: E731
                                                          device=fed.device)
    data = PartyData(party, q, table.name, table.task, np.asarray(columns), list(table.feature_names),
                     n_total, to(X_tr), to(X_te), to(y_tr),
                     to(y_te), table.classes, label_note=_note(table),
                     alignment=getattr(table, "alignment", None), aligned_rows=getattr(table, "aligned_rows", None),
                     aligned_ids=getattr(table, "aligned_ids", None), preprocessing=pre)
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
        if config.test_dataset:
            raise VFLInputError(f"dataset {config.dataset!r} is a registered name; --test-dataset is only "
                                f"for your own files")
        return load_dataset(config.dataset, config.data_dir)
    if not Path(config.dataset).exists():
        raise VFLInputError(f"unknown dataset {config.dataset!r}: not a registered name "
                            f"({', '.join(sorted(REGISTRY))}) and no such file")
    train = load_file(config.dataset, label_column=config.label_column)
    test = None
    if config.test_dataset:
        test = load_file(config.test_dataset, label_column=config.label_column, n_features=train.X.shape[1])
        if test.X.shape[1] != train.X.shape[1]:
            raise VFLInputError(f"the test file {config.test_dataset} has {test.X.shape[1]} features, the "
                                f"training file {config.dataset} has {train.X.shape[1]}: they must match")
    return _user_dataset(Path(config.dataset).name, train, test, config)


MIN_ROWS = 2


def check_user_table(table, config: DataConfig, what: str = "") -> None:
    """A user's file as read: enough rows, and values every method can use (named by file, column and line)."""
    source = table.source or what or "the file"
    if config.scoring and table.X.shape[0] >= 1:
        pass                                  # scoring a saved model: one row is a request like any other
    elif table.X.shape[0] < MIN_ROWS:
        raise VFLInputError(f"{source} has only {table.X.shape[0]} data row: training needs at least {MIN_ROWS} "
                            f"rows (and more for a held-out split)")
    check_file_values(table.X, table.feature_names, source, table.first_line,
                      impute=config.impute if config.impute is not None else "none")


def _user_dataset(name, train, test, config: DataConfig) -> Dataset:
    check_user_table(train, config)
    if test is not None:
        check_user_table(test, config)
    where = f"{train.source or name}'s label column"
    if train.y is not None and train.label_name not in ("label", "None"):
        where = f"column {train.label_name!r} of {train.source or name}"
    labels = decide_task(train.y, None if test is None else test.y, task=config.task,
                         positive_label=config.positive_label, where=where, first_line=train.first_line)
    if labels.y_test is not None and labels.task == "multiclass" and (labels.y_test < 0).any():
        raise VFLInputError(f"the test file {config.test_dataset} has label values that the training file "
                            f"{config.dataset} never uses: the classes must be the same")
    return Dataset(name, labels.task, train.X, labels.y, train.feature_names,
                   X_test=None if test is None else test.X, y_test=labels.y_test, classes=labels.classes,
                   source=str(config.dataset), label_note=labels.note)


def _note(ds: Dataset) -> str:
    if ds.label_note:
        return ds.label_note
    if ds.task == "binary" and ds.classes:
        return f"binary: {ds.classes[-1]!r} positive (+1) vs {ds.classes[0]!r} (-1) (fixed for {ds.name})"
    return f"{ds.task} (fixed for {ds.name})"


def _check_both_classes(y_train, ds: Dataset, config: DataConfig) -> None:
    if ds.task != "binary":
        return
    y = np.asarray(y_train)
    if (y > 0).all() or (y < 0).all():
        which = "positive" if (y > 0).all() else "negative"
        raise VFLInputError(f"all {len(y)} training rows of {ds.name} are {which} after the split (seed "
                            f"{config.seed}, --test-fraction {config.test_fraction}): a binary task needs both "
                            f"classes in training; add rows of the other class or lower --test-fraction")


def own_party_file(files, index: int, parties: int) -> str:
    """This party's file among ``--party-files``: the only one given (each organisation on its own machine names
    just its own file), or the ``index``-th of one file per party (the simulation of Q organisations on one
    machine, where the first is the active party's)."""
    files = list(files)
    if len(files) == 1:
        return files[0]
    if len(files) != parties:
        raise VFLInputError(f"--party-files gives {len(files)} files for {parties} parties: give this party's own "
                            f"file only (across organisations), or one file per party (on one machine)")
    return files[index]


def file_digest(path) -> str:
    """SHA-256 of a file's bytes, for the run record (which file a party trained on, without naming its rows)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_own_file(fed: Federation, config: DataConfig) -> Dataset:
    """One file per party, aligned by private set intersection on the ID column (``psi.align_rows``).

    Every party first reports whether its file could be read (ID column present, no duplicate
    IDs, labels at the active party): any problem stops every party before the PSI, naming the file.
    """
    if not config.id_column:
        raise VFLInputError("--party-files needs --id-column: the rows of the parties' files are matched on it")
    path = own_party_file(config.party_files, fed.parties.index(fed.rank), fed.num_parties)
    table, problem, decided = None, None, None
    try:
        label = config.label_column if fed.is_active else None
        table = load_file(path, label_column=label, id_column=config.id_column)
        if table.ids is None:
            raise VFLInputError(f"{path}: no ID column {config.id_column!r}")
        check_user_table(table, config)
        if fed.is_active and table.y is None and not config.scoring:
            raise VFLInputError(f"the active party's file {path} has no label column: pass --label-column")
        _check_unique_ids(table.ids, path, config.id_column, table.first_line)
        if fed.is_active:
            decided = _user_dataset(path, table, None, config)
    except VFLInputError as exc:
        problem = str(exc)
    mine = {"problem": problem, "file": Path(path).name, "sha256": None if problem else file_digest(path)}
    with fed.phase("data/align-check"):
        views = fed.gather_json(mine, fed.active, ranks=fed.parties)
        verdict = None
        if fed.is_active:
            found = [v["problem"] for v in views if v["problem"]]
            verdict = {"error": "; ".join(found)} if found else {"task": decided.task, "note": decided.label_note}
        verdict = fed.broadcast_json(verdict, fed.active, ranks=fed.parties)
    if "error" in verdict:
        raise VFLInputError(verdict["error"])
    if config.aligned_rows:
        rows, counts = _saved_alignment(fed, config, table.ids, path)
    else:
        try:
            rows, counts = align_rows(fed, list(table.ids), engine=config.psi)
        except PSIError as exc:
            raise VFLInputError(str(exc)) from exc
    counts["dropped"] = {r: n - counts["aligned"] for r, n in counts["rows"].items()}
    # Each party's file name and content hash (the record says which files were trained on, not a default name).
    counts["files"] = ({str(r): {"name": v["file"], "sha256": v["sha256"]} for r, v in zip(fed.parties, views)}
                       if fed.is_active else {})
    train = type(table)(table.X[rows], None if table.y is None else table.y[rows], table.feature_names,
                        source=table.source, first_line=table.first_line, label_name=table.label_name)
    if fed.is_active:
        ds = _user_dataset(Path(path).name, train, None, config)
    else:
        ds = Dataset(Path(path).name, verdict["task"], train.X, None, train.feature_names, source=path)
    ds.task, ds.label_note = verdict["task"], verdict["note"]
    ds.alignment = counts
    ds.aligned_rows, ds.aligned_ids = rows, [table.ids[r] for r in rows]
    return ds


def read_aligned_rows(rows_file: str, ids, data_file: str) -> np.ndarray:
    """The row order ``vfl align`` wrote for this party (``row,ID`` lines), checked against its data file:
    every listed row must exist and still carry the listed ID, so an edited file is refused, not misaligned."""
    try:
        lines = Path(rows_file).read_text().splitlines()
    except OSError as exc:
        raise VFLInputError(f"--aligned-rows: cannot read {rows_file} ({exc.strerror or exc}): write it with "
                            f"`vfl align --rows-out PATTERN` on the same --party-files") from None
    body = [ln for ln in lines if ln and not ln.startswith("#")][1:]      # after the header row,ID
    rows = np.empty(len(body), dtype=np.int64)
    for k, line in enumerate(body):
        r, _, listed = line.partition(",")
        if not r.strip().isdigit() or int(r) >= len(ids):
            raise VFLInputError(f"--aligned-rows: {rows_file} line {k + 3}: {r!r} is not a row of {data_file} "
                                f"({len(ids)} rows): the file changed since `vfl align`; align again")
        rows[k] = int(r)
        if canonical_id(ids[rows[k]]) != listed:
            raise VFLInputError(f"--aligned-rows: {rows_file} line {k + 3}: row {rows[k]} of {data_file} has ID "
                                f"{canonical_id(ids[rows[k]])!r}, not {listed!r}: the file changed since "
                                f"`vfl align`; align again")
    if len(np.unique(rows)) != len(rows):
        raise VFLInputError(f"--aligned-rows: {rows_file} lists a row twice; write it again with `vfl align`")
    return rows


def _saved_alignment(fed: Federation, config: DataConfig, ids, path: str) -> tuple[np.ndarray, dict]:
    """Reuse the alignment of an earlier ``vfl align`` (align once, train many times) instead of a new PSI.

    The parties compare the number of aligned rows and a digest of the aligned IDs in order: every party
    already knows those IDs (the intersection is the PSI's output), so the digest tells nothing new, and a
    party whose rows file belongs to another alignment is caught before training."""
    own = config.aligned_rows.replace("{party}", str(fed.parties.index(fed.rank)))
    problem, rows, digest = None, None, None
    try:
        rows = read_aligned_rows(own, ids, path)
        digest = hashlib.blake2b("\n".join(canonical_id(ids[r]) for r in rows).encode(), digest_size=16).hexdigest()
    except VFLInputError as exc:
        problem = str(exc)
    with fed.phase("data/align-saved"):
        views = fed.gather_json({"problem": problem, "n": len(ids), "aligned": None if rows is None else len(rows),
                                 "digest": digest}, fed.active, ranks=fed.parties)
        verdict = None
        if fed.is_active:
            found = [v["problem"] for v in views if v["problem"]]
            if not found and len({(v["aligned"], v["digest"]) for v in views}) != 1:
                found = ["--aligned-rows: the parties' rows files come from different alignments (aligned counts "
                         + ", ".join(f"party {q}: {v['aligned']}" for q, v in enumerate(views))
                         + "); run `vfl align` again on the same --party-files"]
            verdict = {"error": "; ".join(found)} if found else {
                "rows": {str(r): v["n"] for r, v in zip(fed.parties, views)}, "aligned": views[0]["aligned"]}
        verdict = fed.broadcast_json(verdict, fed.active, ranks=fed.parties)
    if "error" in verdict:
        raise VFLInputError(verdict["error"])
    if not fed.is_active:     # as after a PSI, a passive party knows its own row count only
        verdict["rows"] = {str(fed.rank): len(ids)}
    if verdict["aligned"] == 0:
        raise VFLInputError(f"--aligned-rows: {own} lists no rows")
    return rows, {"rows": verdict["rows"], "aligned": verdict["aligned"],
                  "method": f"saved alignment ({config.aligned_rows})"}


def _check_unique_ids(ids, path, column, first_line: int = 2) -> None:
    """Every ID usable (text or an integer, not blank) and unique, or an error naming the file and the lines."""
    keys = []
    for i, v in enumerate(ids):
        try:
            keys.append(canonical_id(v))
        except PSIError as exc:
            raise VFLInputError(f"{path}: line {i + first_line}, ID column {column!r}: {exc}") from None
    first: dict[str, int] = {}
    dup: list[tuple[str, int, int]] = []
    for i, k in enumerate(keys):
        if k in first:
            dup.append((k, first[k] + first_line, i + first_line))
        else:
            first[k] = i
    if dup:
        shown = ", ".join(f"{k!r} on lines {a} and {b}" for k, a, b in dup[:5]) + (", ..." if len(dup) > 5 else "")
        raise VFLInputError(f"{path}: the ID column {column!r} has {len(dup)} duplicate value(s) ({shown}): "
                            f"each row needs its own ID to be aligned")


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
