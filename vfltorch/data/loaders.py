"""File loaders: LIBSVM/svmlight (sparse allowed) and CSV, for named datasets and the user's own files.

Every loader returns a ``Table``: features, optional labels, column names. What
the labels mean (binary +-1, a regression target, classes) is decided by the
caller (``registry.py`` for named datasets, ``--task`` for user files).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .validation import VFLInputError


@dataclass
class Table:
    X: np.ndarray                     # or a scipy.sparse CSR matrix (load_svmlight(dense=False))
    y: np.ndarray | None
    feature_names: list[str]
    ids: np.ndarray | None = None
    source: str = ""                  # the file, for messages
    first_line: int = 1               # file line of row 0 (2 below a CSV header), for messages
    label_name: str = "label"

    @property
    def shape(self):
        return self.X.shape


def _exists(path) -> Path:
    """The path of a readable, non-empty file, or a message that says what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise VFLInputError(f"file not found: {path}")
    if path.is_dir():
        raise VFLInputError(f"{path} is a directory: give the path of a LIBSVM or CSV file")
    if not os.access(path, os.R_OK):
        raise VFLInputError(f"{path} cannot be read (permission denied): check the file's permissions")
    if path.stat().st_size == 0:
        raise VFLInputError(f"{path} is empty (0 bytes): give a file with a header and data rows")
    return path


_COMPRESSED = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zip": "zip"}


def _unreadable(path: Path, exc: BaseException) -> VFLInputError:
    """A decompression or decoding failure, with the file's name and what to do."""
    kind = _COMPRESSED.get(path.suffix.lower())
    if kind:
        return VFLInputError(f"{path} cannot be read as {kind}-compressed data ({type(exc).__name__}: {exc}): the "
                             f"file is damaged or not really {kind}; download or copy it again, or decompress "
                             f"it yourself to check")
    return VFLInputError(f"{path} cannot be read as text ({type(exc).__name__}: {exc}): give a LIBSVM or CSV "
                         f"text file (optionally .gz/.bz2/.xz compressed)")


def _read_errors():
    import zlib
    import lzma
    import gzip
    import zipfile

    return (EOFError, OSError, zlib.error, lzma.LZMAError, gzip.BadGzipFile, zipfile.BadZipFile,
            UnicodeDecodeError)


def load_svmlight(path, n_features: int | None = None, dense: bool = True) -> Table:
    """A LIBSVM/svmlight file (.gz/.bz2 read directly). Indices are 1-based, as LIBSVM writes them.

    Pass ``n_features`` so that a train and a test file get the same width
    (a9a's test file never uses feature 123).
    """
    from sklearn.datasets import load_svmlight_file

    path = _exists(path)
    try:
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=np.float64)
    except ValueError as exc:
        raise VFLInputError(f"{path} is not a valid LIBSVM/svmlight file ({exc}). Each line must read "
                            f"'label index:value index:value ...' with 1-based indices.") from exc
    except _read_errors() as exc:
        raise _unreadable(path, exc) from exc
    if X.shape[0] == 0:
        raise VFLInputError(f"{path} holds no data rows: each line must read 'label index:value ...'")
    X = X.toarray() if dense else X.tocsr()
    return Table(X, np.asarray(y, dtype=np.float64), [f"f{i + 1}" for i in range(X.shape[1])], source=str(path))


def load_csv(path, label_column=None, id_column=None, drop_columns=(), header: bool = True) -> Table:
    """A CSV file: numeric feature columns, an optional label column and an optional ID column.

    Columns may be given by name, or by integer position when the file has no header.
    Non-numeric feature columns are refused with their names (encode them first).
    """
    import pandas as pd

    path = _exists(path)
    try:
        # The ID column is read as text, never as a number: 123.0 is not 123, 0001000 is not 1000, and an ID
        # above 2**53 read as a float would be rounded onto another customer's (issue 33). A blank ID cell
        # stays missing (NaN) so that it is refused with its line, not matched as "nan".
        text_ids = None
        if id_column is not None:
            names = list(pd.read_csv(path, header=0 if header else None, nrows=0).columns)
            if not header:
                names = list(range(len(names)))
            resolved = _resolve_column(pd.DataFrame(columns=names), id_column, path, "ID")
            text_ids = {resolved: str}
        frame = pd.read_csv(path, header=0 if header else None, dtype=text_ids)
    except pd.errors.EmptyDataError as exc:
        raise VFLInputError(f"{path} holds no columns (only blank lines?): give a CSV file with a header "
                            f"line and data rows") from exc
    except pd.errors.ParserError as exc:
        raise VFLInputError(f"{path} is not a well-formed CSV file ({str(exc).strip()}): every line needs the "
                            f"same number of comma-separated fields as the header") from exc
    except _read_errors() as exc:
        raise _unreadable(path, exc) from exc
    first_line = 2 if header else 1
    if not header:
        frame.columns = [str(c) for c in frame.columns]
    if len(frame) == 0:
        raise VFLInputError(f"{path} has a header ({', '.join(map(str, list(frame.columns)[:8]))}"
                            f"{', ...' if frame.shape[1] > 8 else ''}) but no data rows")
    label_column = _resolve_column(frame, label_column, path, "label")
    id_column = _resolve_column(frame, id_column, path, "ID")
    y = frame.pop(label_column).to_numpy() if label_column is not None else None
    ids = _text_ids(frame.pop(id_column), path, id_column, first_line) if id_column is not None else None
    for c in drop_columns:
        frame.pop(c)
    if frame.shape[1] == 0:
        raise VFLInputError(f"{path} has no feature columns besides the label/ID column(s)")
    for c in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[c]):
            continue
        as_number = pd.to_numeric(frame[c], errors="coerce")
        bad = np.flatnonzero(as_number.isna().to_numpy() & frame[c].notna().to_numpy())
        row = int(bad[0]) if len(bad) else 0
        raise VFLInputError(
            f"{path}: column {c!r} is not numeric: line {row + first_line} holds {frame[c].iloc[row]!r}"
            f"{f' ({len(bad)} such values)' if len(bad) > 1 else ''}. Encode categories as numbers (for "
            f"example one-hot), fix the value, or name the label column with --label-column.")
    return Table(frame.to_numpy(dtype=np.float64), y, [str(c) for c in frame.columns], ids, source=str(path),
                 first_line=first_line, label_name=str(label_column))


def _text_ids(column, path, name, first_line) -> np.ndarray:
    """The ID column as text, each value stripped of surrounding whitespace (docs/alignment.md, "IDs"); a blank
    ID is an error that names the file and the line."""
    values = column.to_numpy(dtype=object)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        text = "" if v is None or (isinstance(v, float) and v != v) else str(v).strip()
        if not text:
            raise VFLInputError(f"{path}: line {i + first_line} has a blank ID in column {name!r}: every row needs "
                                f"an ID to be aligned; fill it in or drop the row")
        out[i] = text
    return out


def _resolve_column(frame, column, path, what):
    if column is None:
        return None
    if column in frame.columns:
        return column
    if isinstance(column, str) and column.lstrip("-").isdigit():
        column = int(column)
    if isinstance(column, int) and -len(frame.columns) <= column < len(frame.columns):
        return frame.columns[column]
    raise VFLInputError(f"{path}: no {what} column {column!r}; the columns are {list(frame.columns)[:12]}"
                        f"{'...' if len(frame.columns) > 12 else ''}")


def load_file(path, *, label_column=None, id_column=None, n_features=None) -> Table:
    """A user's file by its extension: LIBSVM (.svm, .libsvm, .txt, .t, or compressed) or CSV (.csv, .csv.gz).

    LIBSVM files stay sparse here; each party densifies only its own columns.
    """
    path = _exists(path)
    name = path.name.lower()
    if ".csv" in name:
        return load_csv(path, label_column=label_column, id_column=id_column)
    return load_svmlight(path, n_features=n_features, dense=False)


def stable_id_hash(ids) -> np.ndarray:
    """IDs as int64 through an unkeyed stable hash. Not for alignment (a dictionary attack inverts it:
    tests/test_psi.py); rows of --party-files are aligned by private set intersection (psi.py)."""
    out = np.empty(len(ids), dtype=np.int64)
    for i, v in enumerate(ids):
        digest = hashlib.blake2b(str(v).encode(), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little", signed=True)
    return out
