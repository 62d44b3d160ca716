"""Named datasets: scikit-learn's bundled breast_cancer, and the files of the shared data folder.

The shared folder (see its MANIFEST.md) is found through ``--data-dir``, the
``VFLTORCH_DATA`` environment variable, or ``../shared/data`` next to the
working directory or the source checkout. Files are read where they are,
never copied.

Binary labels are mapped to -1 / +1 on load (the positive class is named
in each entry); regression targets are kept as they are; multi-class labels
become 0 .. K-1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .loaders import load_csv, load_svmlight
from .validation import VFLInputError


@dataclass
class Dataset:
    """A whole dataset as loaded from disk, before it is split between parties."""

    name: str
    task: str                      # 'binary', 'regression', 'multiclass'
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    classes: list | None = None    # original label values (binary: [negative, positive])
    impute: str = "none"           # the imputation this dataset needs by default
    source: str = ""
    label_note: str = ""           # what the labels mean and how that was decided (printed by `vfl`)

    @property
    def n_features(self) -> int:
        return self.X.shape[1]


@dataclass
class DatasetSpec:
    name: str
    task: str
    files: list[str]
    load: Callable[[Path | None], Dataset]
    description: str
    paper_use: str = ""
    impute: str = "none"
    extra: dict = field(default_factory=dict)

    @property
    def bundled(self) -> bool:
        return not self.files


REGISTRY: dict[str, DatasetSpec] = {}

# Rows x columns of each registered dataset's training file, and whether it has its own test file (MANIFEST.md;
# tests/test_startup.py checks them against the loaded data). The launcher checks --parties against the columns
# and batch sizes against the rows without reading a file; None where encoding decides it (adult's one-hot).
SHAPES: dict[str, tuple[int, int | None, bool]] = {
    "breast_cancer": (569, 30, False), "a9a": (32561, 123, True), "phishing": (11055, 68, False),
    "abalone": (4177, 8, False), "credit_default": (30000, 23, False), "give_me_some_credit": (150000, 10, False),
    "adult": (32561, None, True), "cal_housing": (20640, 8, False), "sonar": (208, 60, False),
    "vehicle": (846, 18, False), "pima": (768, 8, False), "glaucoma": (196, 62, False), "college": (777, 17, False),
    "yale": (165, 1024, False),
}


def training_rows(name: str, test_fraction: float) -> int | None:
    """Training rows of a registered dataset after the held-out split (as ``split_rows`` makes it)."""
    if name not in SHAPES:
        return None
    rows, _, has_test_file = SHAPES[name]
    return rows if has_test_file else rows - int(round(rows * test_fraction))


def _register(spec: DatasetSpec) -> DatasetSpec:
    REGISTRY[spec.name] = spec
    return spec


def resolve_data_dir(data_dir=None) -> Path | None:
    """The shared data folder: explicit argument, then VFLTORCH_DATA, then ../shared/data if it exists."""
    if data_dir:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise VFLInputError(f"--data-dir {data_dir} is not a directory")
        return path
    env = os.environ.get("VFLTORCH_DATA")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise VFLInputError(f"VFLTORCH_DATA={env} is not a directory")
        return path
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return None


def _need(data_dir: Path | None, name: str, rel: str) -> Path:
    if data_dir is None:
        raise VFLInputError(
            f"dataset {name!r} needs {rel} from the vfltorch data folder, and no data folder was found. Pass "
            f"--data-dir PATH or set VFLTORCH_DATA, or use --dataset breast_cancer (bundled with scikit-learn).")
    path = data_dir / rel
    if not path.exists():
        raise VFLInputError(f"dataset {name!r} needs {path}, which does not exist. Check --data-dir / "
                            f"VFLTORCH_DATA (it should hold the folders listed in MANIFEST.md).")
    return path


def _binary(y, positive) -> tuple[np.ndarray, list]:
    y = np.asarray(y)
    values = sorted(set(y.tolist()), key=str)
    if positive not in values or len(values) != 2:
        raise VFLInputError(f"expected two classes including {positive!r}, found {values}")
    negative = [v for v in values if v != positive][0]
    return np.where(y == positive, 1.0, -1.0), [negative, positive]


def _multiclass(y) -> tuple[np.ndarray, list]:
    classes, codes = np.unique(np.asarray(y), return_inverse=True)
    return codes.astype(np.int64), classes.tolist()


def available(name: str, data_dir=None) -> bool:
    spec = REGISTRY[name]
    if spec.bundled:
        return True
    try:
        root = resolve_data_dir(data_dir)
    except VFLInputError:
        return False
    return root is not None and all((root / f).exists() for f in spec.files)


def load_dataset(name: str, data_dir=None) -> Dataset:
    """Load a registered dataset by name (see ``vfl datasets``)."""
    if name not in REGISTRY:
        raise VFLInputError(f"unknown dataset {name!r}. Registered datasets: {', '.join(sorted(REGISTRY))}; "
                            f"or pass the path of a LIBSVM or CSV file.")
    spec = REGISTRY[name]
    root = None if spec.bundled else resolve_data_dir(data_dir)
    for rel in spec.files:
        _need(root, name, rel)
    return spec.load(root)


# ---------------------------------------------------------------- the entries
def _breast_cancer(_root) -> Dataset:
    from sklearn.datasets import load_breast_cancer

    bc = load_breast_cancer()
    # scikit-learn codes malignant as 0: make malignant the positive class (+1).
    y = np.where(bc.target == 0, 1.0, -1.0)
    return Dataset("breast_cancer", "binary", bc.data.astype(np.float64), y, list(bc.feature_names),
                   classes=["benign", "malignant"], source="sklearn.datasets.load_breast_cancer")


_register(DatasetSpec("breast_cancer", "binary", [], _breast_cancer,
                      "Wisconsin breast cancer, 569 x 30, bundled with scikit-learn (the zero-setup default)"))


def _libsvm_binary(name, train, test, n_features, positive):
    def load(root):
        tr = load_svmlight(root / train, n_features=n_features)
        y, classes = _binary(tr.y, positive)
        ds = Dataset(name, "binary", tr.X, y, tr.feature_names, classes=classes, source=str(root / train))
        if test:
            te = load_svmlight(root / test, n_features=n_features)
            ds.X_test, ds.y_test = te.X, _binary(te.y, positive)[0]
        return ds
    return load


_register(DatasetSpec("a9a", "binary", ["libsvm/a9a.gz", "libsvm/a9a.t.gz"],
                      _libsvm_binary("a9a", "libsvm/a9a.gz", "libsvm/a9a.t.gz", 123, 1.0),
                      "LIBSVM a9a (UCI Adult, binarised), 32561 x 123 with a 16281-row test file",
                      paper_use="FDSKL"))
_register(DatasetSpec("phishing", "binary", ["libsvm/phishing.gz"],
                      _libsvm_binary("phishing", "libsvm/phishing.gz", None, 68, 1.0),
                      "LIBSVM phishing, 11055 x 68", paper_use="FDSKL, DP-SCD (logistic)"))


def _abalone(root):
    t = load_svmlight(root / "libsvm/abalone_scale.bz2", n_features=8)
    return Dataset("abalone", "regression", t.X, t.y, ["sex", "length", "diameter", "height", "whole_weight",
                                                        "shucked_weight", "viscera_weight", "shell_weight"],
                   source=str(root / "libsvm/abalone_scale.bz2"))


_register(DatasetSpec("abalone", "regression", ["libsvm/abalone_scale.bz2"], _abalone,
                      "LIBSVM abalone_scale, 4177 x 8, target = rings"))


def _credit_default(root):
    path = root / "uci_credit_default/UCI_Credit_Card.csv.gz"
    t = load_csv(path, label_column="default.payment.next.month", id_column="ID")
    y, classes = _binary(t.y, 1)
    return Dataset("credit_default", "binary", t.X, y, t.feature_names, classes=classes, source=str(path))


_register(DatasetSpec("credit_default", "binary", ["uci_credit_default/UCI_Credit_Card.csv.gz"], _credit_default,
                      "UCI default of credit card clients, 30000 x 23", paper_use="FDSKL, Paillier LR (Credit 1)"))


def _give_me_some_credit(root):
    path = root / "give_me_some_credit/cs-training.csv.gz"
    t = load_csv(path, label_column="SeriousDlqin2yrs", id_column=0)
    y, classes = _binary(t.y, 1)
    return Dataset("give_me_some_credit", "binary", t.X, y, t.feature_names, classes=classes,
                   impute="median", source=str(path))


_register(DatasetSpec("give_me_some_credit", "binary", ["give_me_some_credit/cs-training.csv.gz"],
                      _give_me_some_credit,
                      "Kaggle Give Me Some Credit, 150000 x 10 (NaNs in 2 columns: median-imputed by default)",
                      paper_use="FDSKL, Paillier LR (Credit 2)", impute="median"))


def _adult(root):
    import pandas as pd

    tr = pd.read_csv(root / "uci_adult/adult_train.csv.gz")
    te = pd.read_csv(root / "uci_adult/adult_test.csv.gz")
    y_tr = tr.pop("class").str.strip().str.rstrip(".")
    y_te = te.pop("class").str.strip().str.rstrip(".")
    both = pd.concat([tr, te], keys=["train", "test"])
    categorical = [c for c in both.columns if not pd.api.types.is_numeric_dtype(both[c])]
    # One-hot over the union of train and test categories; a missing value ('?') is its own category.
    both = pd.get_dummies(both.fillna({c: "missing" for c in categorical}), columns=categorical, dtype=float)
    X_tr, X_te = both.loc["train"].to_numpy(np.float64), both.loc["test"].to_numpy(np.float64)
    y, classes = _binary(y_tr.to_numpy(), ">50K")
    return Dataset("adult", "binary", X_tr, y, [str(c) for c in both.columns], X_test=X_te,
                   y_test=_binary(y_te.to_numpy(), ">50K")[0], classes=classes,
                   source=str(root / "uci_adult"))


_register(DatasetSpec("adult", "binary", ["uci_adult/adult_train.csv.gz", "uci_adult/adult_test.csv.gz"], _adult,
                      "UCI Adult raw (one-hot encoded on load), 32561 x 14 raw columns, with its test file",
                      paper_use="DP-SCD (SVM)"))


def _cal_housing(root):
    path = root / "regression/cal_housing.data.gz"
    t = load_csv(path, label_column=8, header=False)
    names = ["longitude", "latitude", "housingMedianAge", "totalRooms", "totalBedrooms", "population",
             "households", "medianIncome"]
    return Dataset("cal_housing", "regression", t.X, t.y.astype(np.float64), names, source=str(path))


_register(DatasetSpec("cal_housing", "regression", ["regression/cal_housing.data.gz"], _cal_housing,
                      "California housing (StatLib), 20640 x 8, target = median house value",
                      paper_use="DP-SCD (ridge; stands in for YearPredictionMSD)"))


def _small_csv(name, filename, label, positive=None):
    def load(root):
        path = root / "vfedpca_small" / filename
        t = load_csv(path, label_column=label)
        if positive is None:
            y, classes = _multiclass(t.y)
            task = "multiclass"
        else:
            y, classes = _binary(t.y, positive)
            task = "binary"
        return Dataset(name, task, t.X, y, t.feature_names, classes=classes, source=str(path))
    return load


for _name, _file, _label, _pos, _desc in [
    ("sonar", "Sonar.csv", "Class", "M", "Sonar (mlbench), 208 x 60, mines (+1) vs rocks"),
    ("vehicle", "Vehicle.csv", "Class", None, "Statlog vehicle silhouettes (mlbench), 846 x 18, 4 classes"),
    ("pima", "PimaIndiansDiabetes.csv", "diabetes", "pos", "Pima Indians diabetes (mlbench), 768 x 8"),
    ("glaucoma", "GlaucomaM.csv", "Class", "glaucoma", "GlaucomaM (TH.data), 196 x 62"),
    ("college", "College.csv", "Private", "Yes", "College (ISLR), 777 x 17 numeric, label Private"),
]:
    _register(DatasetSpec(_name, "multiclass" if _pos is None else "binary", [f"vfedpca_small/{_file}"],
                          _small_csv(_name, _file, _label, _pos), _desc, paper_use="VFedPCA"))


def _yale(root):
    from scipy.io import loadmat

    path = root / "yale_faces/Yale_32x32.mat"
    mat = loadmat(str(path))
    X = np.asarray(mat["fea"], dtype=np.float64)
    y, classes = _multiclass(np.asarray(mat["gnd"]).reshape(-1))
    # Pixel (r, c) of the 32x32 image is column c * 32 + r (column-major, as in the MAT file).
    return Dataset("yale", "multiclass", X, y, [f"px{i}" for i in range(X.shape[1])], classes=classes,
                   source=str(path))


_register(DatasetSpec("yale", "multiclass", ["yale_faces/Yale_32x32.mat"], _yale,
                      "Yale faces 32x32, 165 x 1024 pixels, 15 subjects", paper_use="VFedPCA case study"))
