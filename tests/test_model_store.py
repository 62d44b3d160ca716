"""Saved models, one shard per party: `--save-model`, `vfl predict`, estimator save/load, pickling.

The default suite trains FDSKL once through the real multi-process CLI (3 parties and the dealer),
scores the held-out rows again in fresh processes with `vfl predict`, and checks the refusals in
the launching process; every other method's CLI round trip is marked slow. The rest runs in-process.
"""

import hashlib
import io
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
from conftest import needs_dataset
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import minmax_scale

from vfltorch.cli import main
from vfltorch.data import VFLInputError
from vfltorch.model_store import ModelStoreError, read_shard


def run_vfl(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH")] if p)}
    return subprocess.run([sys.executable, "-m", "vfltorch", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _metrics(path):
    return json.loads(path.read_text())["metrics"]


def _round_trip(tmp, name, train_args, compare, predict_args=()):
    """Train with --save-model, then `vfl predict --rows test` in fresh processes; the scores agree."""
    model, trained, scored, csv = tmp / name, tmp / f"{name}.json", tmp / f"{name}-predict.json", tmp / f"{name}.csv"
    r = run_vfl(*train_args, "--save-model", str(model), "--output-json", str(trained), "--quiet")
    assert r.returncode == 0, r.stderr
    r = run_vfl("predict", "--model", str(model), "--rows", "test", "--output-json", str(scored),
                "--output-csv", str(csv), "--quiet", *predict_args)
    assert r.returncode == 0, r.stderr
    a, b = _metrics(trained), _metrics(scored)
    for key in compare:
        assert b[key] == a[key], (key, a, b)        # identical, not close: the same scores on the same rows
    record = json.loads(scored.read_text())
    assert record["predict"]["model_id"] == json.loads(trained.read_text())["model"]["model_id"]
    lines = csv.read_text().splitlines()
    assert len(lines) == record["predict"]["scored_rows"] + 1
    return model, lines


# ------------------------------------------------------------------------ FDSKL through the CLI
@pytest.fixture(scope="module")
def fdskl_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fdskl")
    # --predict-bits 32: the same scores to the metric's last digit. With the default Z_2^24 prediction ring two
    # scorings with fresh masks differ by about 1e-3 of max |f|, which swapped one pair of the AUC in 3 of 24 runs
    # (tests/test_fdskl_compress.py runs the default ring through `vfl predict`).
    model, lines = _round_trip(tmp, "fd", ["fdskl", "--parties", "2", "--epochs", "1", "--predict-bits", "32"],
                               ["test_accuracy", "test_auc", "test_error"])
    return tmp, model, lines


def test_fdskl_predict_in_fresh_processes_reproduces_training(fdskl_model):
    tmp, model, lines = fdskl_model
    assert lines[0] == "decision,prediction,label"
    assert {row.split(",")[1] for row in lines[1:]} <= {"malignant", "benign"}
    # One shard per rank (2 data parties + the dealer), private files.
    assert sorted(p.name for p in model.iterdir()) == ["party-0", "party-1", "party-2"]
    for shard in model.iterdir():
        assert stat.S_IMODE(shard.stat().st_mode) == 0o700
        for f in shard.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600


def test_each_party_writes_only_what_it_holds(fdskl_model):
    _, model, _ = fdskl_model
    shards = {r: read_shard(model, r) for r in range(3)}
    ids = {m["model_id"] for m, _ in shards.values()}
    assert len(ids) == 1 and len(ids.pop()) == 32
    columns = [list(a["columns"]) for m, a in (shards[r] for r in range(2))]
    assert sorted(sum(columns, [])) == list(range(30))                   # disjoint column slices
    for r in range(2):
        m, a = shards[r]
        assert m["columns"] == columns[r] and len(m["feature_names"]) == len(columns[r])
        assert a["preprocess_shift"].shape == (len(columns[r]),)          # its own scaler only
        assert ("alpha" in a) == (r == 0) and ("labels" in m) == (r == 0)
    dealer, arrays = shards[2]
    assert dealer["role"] == "coordinator" and "alpha" not in arrays and "data" not in dealer


def _remac(folder, manifest):
    """Write ``manifest`` as a genuine shard would carry it (authenticated under this machine's model key)."""
    from vfltorch.model_store import local_model_key, shard_mac

    manifest["mac"] = shard_mac(local_model_key(create=False), manifest, (folder / "arrays.npz").read_bytes())
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _copy(model, tmp, name):
    dst = tmp / name
    shutil.copytree(model, dst)
    return dst


def test_predict_refuses_missing_tampered_and_mismatched_shards(fdskl_model, capsys):
    """Answered in the launching process, before any party starts."""
    tmp, model, _ = fdskl_model
    missing = _copy(model, tmp, "missing")
    shutil.rmtree(missing / "party-1")
    assert main(["predict", "--model", str(missing)]) == 2
    assert "no shard for party 1" in capsys.readouterr().err

    tampered = _copy(model, tmp, "tampered")
    f = tampered / "party-1" / "arrays.npz"
    data = bytearray(f.read_bytes())
    data[-40] ^= 1
    f.write_bytes(bytes(data))
    assert main(["predict", "--model", str(tampered)]) == 2
    assert "modified or damaged" in capsys.readouterr().err

    other = _copy(model, tmp, "other-run")
    m = json.loads((other / "party-1" / "manifest.json").read_text())
    m["model_id"] = "0" * 32                                # party 1's shard from another training run:
    _remac(other / "party-1", m)                            # genuine (saved under this machine's key)
    assert main(["predict", "--model", str(other)]) == 2
    assert "different training runs" in capsys.readouterr().err

    assert main(["predict", "--model", str(tmp / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["predict", "--model", str(model), "--parties", "3"]) == 2
    assert "trained by 2 parties" in capsys.readouterr().err
    # Training never writes into a folder that holds a model already.
    assert main(["fdskl", "--save-model", str(model)]) == 2
    assert "already holds a saved model" in capsys.readouterr().err


# --------------------------------------------------------------------------- in-process, centralised
@pytest.fixture(scope="module")
def bc():
    X, y = load_breast_cancer(return_X_y=True)
    return minmax_scale(X), np.where(y > 0, 1.0, -1.0)


def _estimators():
    from vfltorch.kernels.estimator import FDSKLClassifier, FDSKLRegressor
    from vfltorch.linear.estimator import HeteroLogisticRegression
    from vfltorch.pca.exact import ExactFederatedPCA
    from vfltorch.pca.vfedpca import VFedPCA
    from vfltorch.privacy.dpsgd import DPSGD
    from vfltorch.privacy.estimator import DPSCD

    return [
        (FDSKLClassifier(epochs=1, features_per_step=8), "decision_function", "y"),
        (FDSKLRegressor(epochs=1, features_per_step=8), "predict", "y3"),
        (HeteroLogisticRegression(max_epochs=2), "decision_function", "ty"),
        # non-private: the same state to save, without the accountant's calibration time
        (DPSCD(variant="nonprivate", epochs=2, normalize_rows=True), "decision_function", "y"),
        (DPSGD(private=False, epochs=2, normalize_rows=True), "decision_function", "y"),
        (VFedPCA(2), "transform", None),
        (ExactFederatedPCA(2), "transform", None),
    ]


@pytest.mark.parametrize("case", range(7))
def test_save_load_pickle_and_joblib_round_trip(case, bc, tmp_path):
    est, method, target = _estimators()[case]
    X, y = bc
    tX = torch.as_tensor(X)
    args = {"y": (X, y), "y3": (X, 3 * y + 1), "ty": (tX, torch.as_tensor(y)), None: (tX,)}[target]
    est.fit(*args)
    Xs = args[0]
    expected = getattr(est, method)(Xs)
    est.save(tmp_path / "m")
    loaded = type(est).load(tmp_path / "m")
    assert loaded.model_id_ == est.model_id_
    for other in (loaded, pickle.loads(pickle.dumps(est))):
        got = getattr(other, method)(Xs)
        assert np.array_equal(np.asarray(got), np.asarray(expected))
        if method == "transform":                       # PCA: the fitted arrays come back numpy (issue 37)
            for name in ("mean_", "components_", "loadings_", "singular_values_", "explained_variance_"):
                assert isinstance(getattr(other, name), np.ndarray), name
                np.testing.assert_array_equal(getattr(other, name), getattr(est, name))
    joblib.dump(est, tmp_path / "e.joblib")
    assert np.array_equal(np.asarray(getattr(joblib.load(tmp_path / "e.joblib"), method)(Xs)), np.asarray(expected))


def test_pickles_carry_no_mask_stream_state(bc):
    from vfltorch.kernels.estimator import FDSKLClassifier
    from vfltorch.linear.estimator import HeteroLogisticRegression

    X, y = bc
    fd = FDSKLClassifier(epochs=1, features_per_step=8).fit(X, y)
    lr = HeteroLogisticRegression(max_epochs=1).fit(torch.as_tensor(X), torch.as_tensor(y))
    fd2, lr2 = pickle.loads(pickle.dumps(fd)), pickle.loads(pickle.dumps(lr))
    for before, after in ((fd.feature_map_.masks, fd2.feature_map_.masks), (lr._mask_stream, lr2._mask_stream)):
        # a fresh stream from the OS, not a copy of the pickled party's
        assert after is not None
        assert not np.array_equal(after.words(4), before.words(4))


def test_loaded_model_refuses_wrong_columns_and_wrong_class(bc, tmp_path):
    from vfltorch.kernels.estimator import FDSKLClassifier, FDSKLRegressor
    from vfltorch.privacy.estimator import DPSCD

    X, y = bc
    FDSKLClassifier(epochs=1).fit(X, y).save(tmp_path / "m")
    loaded = FDSKLClassifier.load(tmp_path / "m")
    with pytest.raises(ValueError, match="X has 29 features, but FDSKLClassifier is expecting 30 features"):
        loaded.decision_function(X[:, :29])
    with pytest.raises(ModelStoreError, match="not a FDSKLRegressor"):
        FDSKLRegressor.load(tmp_path / "m")
    with pytest.raises(ModelStoreError, match="holds a fdskl model, not dpscd"):
        DPSCD.load(tmp_path / "m")


def test_saved_preprocessing_is_applied_not_refitted(tmp_path):
    from vfltorch.data.preprocess import ColumnPreprocessing, scale_columns

    rng = np.random.default_rng(0)
    train, new = rng.normal(size=(50, 4)) * 5 + 2, rng.normal(size=(7, 4))
    train[3, 1] = np.nan
    pre = ColumnPreprocessing.fit(train, "median", "standard", 3.0)
    meta, arrays = pre.state()
    back = ColumnPreprocessing.from_state(meta, arrays)
    filled = pre.impute_rows(train)
    ref_train, ref_new = scale_columns(filled, new, "standard")
    assert np.array_equal(back.scale_rows(back.impute_rows(new)), np.clip(ref_new, -3, 3))
    assert np.array_equal(back.scale_rows(filled), np.clip(ref_train, -3, 3))
    with pytest.raises(VFLInputError, match="saved preprocessing has 4 columns, the data 3"):
        back.check_columns(3)


def test_unpickling_is_refused_in_shards(tmp_path):
    """A shard's arrays are read with allow_pickle=False: an object array is refused, never unpickled."""
    from vfltorch.model_store import write_shard

    with pytest.raises(TypeError, match="numeric arrays only"):
        write_shard(tmp_path, 0, {"method": "x"}, {"bad": np.array([{"a": 1}], dtype=object)})


# ----------------------------------------------------------------- the other methods' CLI round trips
# DP-SCD's default (a dealer, whose shard holds no model) in the default run: its prediction once failed at the
# dealer (KeyError 'theta') while only slow tests saved a two-party DP-SCD model.
@pytest.mark.parametrize("name,train_args,compare", [pytest.param(*p, marks=pytest.mark.slow) if p[0] != "dpscd" else p
                                                     for p in [
    ("lr", ["hetero-lr", "--max-epochs", "2"], ["test_accuracy", "test_auc"]),
    ("dpscd", ["dpscd", "--parties", "2", "--epochs", "2"], ["test_loss", "test_accuracy", "test_auc"]),
    ("dpsgd", ["dpsgd", "--epochs", "2"], ["test_loss", "test_accuracy", "test_auc"]),
    ("pca", ["pca", "--parties", "3", "--components", "2", "--test-fraction", "0.25"],
     ["test_explained_variance_ratio"]),
    ("fdskl-3", ["fdskl", "--parties", "3", "--epochs", "1", "--predict-bits", "32"], ["test_accuracy", "test_auc"]),
    ("fdskl-paper", ["fdskl", "--parties", "3", "--protocol", "paper", "--epochs", "1"], ["test_accuracy", "test_auc"]),
]])
def test_cli_round_trip(tmp_path, name, train_args, compare):
    _round_trip(tmp_path, name, train_args, compare)


def _load_each_own(fed, dirs):
    from vfltorch.model_store import load_collective

    try:
        load_collective(fed, dirs[fed.rank])
    except ModelStoreError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_parties_refuse_shards_of_different_runs(tmp_path):
    """Across organisations each machine holds only its own shard: the parties compare model ids."""
    from vfltorch.comm import launch
    from vfltorch.model_store import write_shard

    dirs = []
    for r, model_id in enumerate(["a" * 32, "b" * 32]):
        d = tmp_path / f"org{r}"
        write_shard(d, r, {"method": "dpscd", "model_id": model_id, "parties": 2}, {})
        dirs.append(str(d))
    errors = launch(_load_each_own, 2, args=(dirs,))
    assert errors[0] == errors[1] and "different training runs" in errors[0]


@pytest.mark.slow
def test_predict_unlabelled_party_files_in_their_own_row_order(tmp_path):
    """New rows without labels, each party's file in its own order: aligned by PSI, scored, IDs in the CSV."""
    import pandas as pd

    data = load_breast_cancer(as_frame=True)
    X, y = data.data, np.where(data.target > 0, "pos", "neg")
    train, new = [], []
    for r, cols in enumerate(np.array_split(np.arange(30), 2)):
        f = X.iloc[:, cols].copy()
        f.insert(0, "id", np.arange(len(X)))
        if r == 0:
            f["y"] = y
        train.append(tmp_path / f"train{r}.csv")
        f.iloc[:450].to_csv(train[-1], index=False)
        g = f.iloc[450:].drop(columns=["y"], errors="ignore").sample(frac=1, random_state=r)
        new.append(tmp_path / f"new{r}.csv")
        g.to_csv(new[-1], index=False)
    model, csv = tmp_path / "m", tmp_path / "scores.csv"
    r = run_vfl("fdskl", "--parties", "2", "--party-files", *map(str, train), "--id-column", "id", "--label-column",
                "y", "--epochs", "1", "--save-model", str(model), "--quiet")
    assert r.returncode == 0, r.stderr
    r = run_vfl("predict", "--model", str(model), "--party-files", *map(str, new), "--id-column", "id",
                "--output-csv", str(csv), "--quiet")
    assert r.returncode == 0, r.stderr
    scores = pd.read_csv(csv)
    assert list(scores.columns) == ["id", "decision", "prediction"] and len(scores) == len(X) - 450
    assert sorted(scores["id"]) == list(range(450, len(X)))
    assert (scores["prediction"].to_numpy() == y[scores["id"].to_numpy()]).mean() > 0.9


# ----------------------------------------------------------------- labels and one-vs-rest survive a save
def test_loaded_classifier_predicts_the_labels_of_fit(tmp_path):
    """classes_ (the label encoding) is in the active party's shard: a loaded model predicts the labels it was
    trained on, binary and one-vs-rest, and the one-vs-rest shard reproduces every class's decision values."""
    from sklearn.datasets import load_wine

    from vfltorch.kernels.estimator import FDSKLClassifier

    Xb, yb = load_breast_cancer(return_X_y=True)
    Xb, yb = minmax_scale(Xb), np.where(yb == 1, "benign", "malignant")
    from vfltorch.linear.estimator import HeteroLogisticRegression
    from vfltorch.privacy.estimator import DPSCD

    for name, est in (("fdskl", FDSKLClassifier(epochs=1)), ("lr", HeteroLogisticRegression(max_epochs=2)),
                      ("dpscd", DPSCD(epochs=2, normalize_rows=True))):
        m = est.fit(Xb, yb).save(tmp_path / name)
        loaded = type(est).load(tmp_path / name)
        assert list(loaded.classes_) == ["benign", "malignant"], name
        assert (loaded.predict(Xb) == m.predict(Xb)).all(), name

    Xw, yw = load_wine(return_X_y=True)
    Xw, yw = minmax_scale(Xw), np.array(["a", "b", "c"])[yw]
    m = FDSKLClassifier(epochs=2).fit(Xw, yw).save(tmp_path / "ovr")
    loaded = FDSKLClassifier.load(tmp_path / "ovr")
    assert len(loaded.estimators_) == 3
    np.testing.assert_array_equal(np.asarray(loaded.decision_function(Xw)), np.asarray(m.decision_function(Xw)))
    assert (loaded.predict(Xw) == m.predict(Xw)).all() and loaded.score(Xw, yw) > 0.9


@pytest.mark.slow          # (9 s; multiclass save / load in process stays in the default run)
@needs_dataset("vehicle")
def test_multiclass_fdskl_round_trip_through_the_cli(tmp_path):
    """Four classes, two parties and the dealer: `vfl predict` in fresh processes gives training's accuracy,
    and the CSV holds the data's own class names."""
    model, lines = _round_trip(tmp_path, "vehicle", ["fdskl", "--dataset", "vehicle", "--parties", "2", "--epochs", "1",
                                                     "--predict-bits", "32"],
                               ["test_accuracy", "test_error"], predict_args=["--dataset", "vehicle"])
    assert lines[0] == "prediction,label"
    assert len({row.split(",")[0] for row in lines[1:]}) > 1


def test_exact_kernel_pca_saves_and_scores_new_rows(tmp_path):
    """Exact kernel PCA scores new rows (masked cross-Gram sum), so it is saved: each party its own training
    columns, the holder the training kernel's means. A loaded model transforms new rows exactly as the fitted
    one, and `vfl predict` scores training's held-out rows in fresh processes."""
    from sklearn.preprocessing import StandardScaler

    from vfltorch.pca.exact_kernel import ExactFederatedKernelPCA

    X, _ = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    m = ExactFederatedKernelPCA(3, kernel="rbf").fit(X[:400])
    m.save(tmp_path / "k")
    loaded = ExactFederatedKernelPCA.load(tmp_path / "k")
    np.testing.assert_array_equal(loaded.transform(X[400:]), m.transform(X[400:]))
    for name in ("X_fit_", "sample_components_", "eigenvalues_"):           # numpy, as fitted (issue 37)
        assert isinstance(getattr(loaded, name), np.ndarray), name
        np.testing.assert_array_equal(getattr(loaded, name), getattr(m, name))
    model, lines = _round_trip(tmp_path, "kpca", ["pca", "--parties", "2", "--method", "exact", "--kernel", "rbf",
                                                  "--components", "2", "--scale", "standard", "--test-fraction",
                                                  "0.25"], [])
    assert lines[0] == "pc1,pc2" and len({row.split(",")[0] for row in lines[1:]}) > 10


@pytest.mark.slow          # (17 s of CLI runs; the default run keeps the round trips above)
def test_predict_without_dataset_takes_only_a_registered_name_from_the_model(tmp_path):
    """`vfl predict --model DIR` with no --dataset scores the registered dataset the model was trained on; a model
    trained on a file asks for --dataset FILE (a model folder never names a file a command reads, issue 36) and
    fills in that file's label column; a model trained from --party-files asks for the files."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = (X[:, 0] + X[:, 3] > 0).astype(int)
    path = tmp_path / "rows.csv"
    path.write_text("a,b,c,d,e,y\n" + "\n".join(",".join(f"{v:.6f}" for v in row) + f",{t}"
                                                 for row, t in zip(X, y)) + "\n")
    _round_trip(tmp_path, "csv", ["pca", "--dataset", str(path), "--label-column", "y", "--parties", "2",
                                  "--components", "2", "--test-fraction", "0.25"],
                ["test_explained_variance_ratio"], predict_args=("--dataset", str(path), "--label-column", "y"))
    from vfltorch.predict import _resolve

    args = type("Args", (), {"dataset": None, "model": tmp_path / "csv", "label_column": None,
                             "positive_label": None, "task": None})()
    _resolve(args)
    assert args.dataset is None and args.label_column is None
    r = run_vfl("predict", "--model", str(tmp_path / "csv"), "--quiet")
    assert r.returncode == 2 and "--dataset FILE" in r.stderr, r.stderr
    r = run_vfl("predict", "--model", str(tmp_path / "csv"), "--dataset", str(path), "--label-column", "y",
                "--rows", "test", "--max-scores-per-row", "0", "--quiet")      # the round trip scored them once
    assert r.returncode == 0, r.stderr
    manifest = tmp_path / "csv" / "party-0" / "manifest.json"
    saved = json.loads(manifest.read_text())
    saved["data"]["party_files"] = True
    _remac(manifest.parent, saved)
    r = run_vfl("predict", "--model", str(tmp_path / "csv"), "--quiet")
    assert r.returncode != 0 and "--party-files" in r.stderr, r.stderr


def test_random_feature_kernel_pca_saves_and_scores_new_rows(tmp_path):
    """rffkpca transforms new rows (in shares; centrally its twin), so it is saved: the loaded model transforms
    new rows exactly as the fitted one (Q = 1 here; the federated save/load is a slow test of
    tests/test_pca_rffkpca.py, `vfl predict` the slow test below)."""
    from sklearn.preprocessing import StandardScaler

    from vfltorch.pca.rff_kpca import RandomFeatureKernelPCA

    X, _ = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    m = RandomFeatureKernelPCA(3, n_random_features=64, gamma="scale").fit(X[:400])
    m.save(tmp_path / "r")
    loaded = RandomFeatureKernelPCA.load(tmp_path / "r")
    np.testing.assert_array_equal(loaded.transform(X[400:]), m.transform(X[400:]))
    for name in ("eigenvalues_", "feature_components_"):                    # numpy, as fitted (issue 37)
        assert isinstance(getattr(loaded, name), np.ndarray), name
        np.testing.assert_array_equal(getattr(loaded, name), getattr(m, name))
    assert np.abs(m.transform(X[400:])).max() > 0.1


@pytest.mark.slow
def test_random_feature_kernel_pca_predict_in_fresh_processes(tmp_path):
    model, lines = _round_trip(tmp_path, "rff", ["pca", "--parties", "3", "--method", "rffkpca", "--components",
                                                 "2", "--random-features", "64", "--no-evaluate", "--scale",
                                                 "standard", "--test-fraction", "0.25"], [])
    assert lines[0] == "pc1,pc2" and len({row.split(",")[0] for row in lines[1:]}) > 10


# --------------------------------------------------------------------------- tampering (issue 36)
def _edit(model, tmp, name, rank, change):
    dst = _copy(model, tmp, name)
    m = json.loads((dst / f"party-{rank}" / "manifest.json").read_text())
    change(m)
    (dst / f"party-{rank}" / "manifest.json").write_text(json.dumps(m))   # the attacker has no model key
    return dst


@pytest.mark.parametrize("rank, change", [
    # paths and options: a model folder must never choose what the command writes or reads
    (0, lambda m: m["data"]["file_options"].update(output_csv="/tmp/vfl-owned.csv")),
    (0, lambda m: m["data"].update(dataset="/etc/passwd")),
    # labels: swapped classes would invert every prediction with the metrics unchanged
    (0, lambda m: m["labels"].update(classes=m["labels"]["classes"][::-1])),
    # hyperparameters and sizes
    (0, lambda m: m["state"].update(sigma=(m["state"]["sigma"] or 1.0) * 3)),
    (1, lambda m: m["state"].update(n_blocks=10 ** 9)),
    # names looked up in registries
    (0, lambda m: m.update(method="os.system")),
    (0, lambda m: m.update(estimator="os.system")),
], ids=["output-path", "dataset-path", "labels", "sigma", "n-blocks", "method", "estimator"])
def test_a_changed_manifest_is_refused_whatever_field_changed(fdskl_model, capsys, rank, change):
    tmp, model, _ = fdskl_model
    bad = _edit(model, tmp, f"tamper-{rank}-{id(change)}", rank, change)
    assert main(["predict", "--model", str(bad), "--rows", "test", "--quiet"]) == 2
    err = capsys.readouterr().err
    # (a dataset path is not even read from the manifest: the pre-run check asks for --dataset first)
    assert "fails its authentication" in err or "pass --dataset NAME" in err, err
    assert "root:" not in err and not Path("/tmp/vfl-owned.csv").exists()


def test_a_model_folder_supplies_no_path_even_when_authentic(fdskl_model, capsys):
    """Even a genuine shard (re-authenticated: the key holder's own mistake, or an old model) gives `vfl predict`
    no output path and no dataset path: only a registered name and the file's text options."""
    tmp, model, _ = fdskl_model
    dst = _copy(model, tmp, "paths")
    for rank in (0, 1, 2):
        folder = dst / f"party-{rank}"
        m = json.loads((folder / "manifest.json").read_text())
        if "data" in m:
            m["data"]["file_options"] = {"output_csv": str(tmp / "owned.csv"), "logdir": str(tmp / "owned")}
            m["data"]["dataset"] = "/etc/passwd"
        _remac(folder, m)
    code = main(["predict", "--model", str(dst), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--dataset FILE" in err, err
    assert not (tmp / "owned.csv").exists() and not (tmp / "owned").exists()
    assert "root:" not in err


def test_an_array_file_that_would_inflate_is_refused_unread(fdskl_model, capsys):
    import zipfile

    tmp, model, _ = fdskl_model
    dst = _copy(model, tmp, "bomb")
    folder = dst / "party-1"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:     # 64 MiB of zeros in a few kB
        z.writestr("columns.npy", b"\0" * (64 << 20))
    (folder / "arrays.npz").write_bytes(buf.getvalue())
    m = json.loads((folder / "manifest.json").read_text())
    m["arrays_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    _remac(folder, m)                                              # even under the right key
    assert main(["predict", "--model", str(dst), "--rows", "test", "--quiet"]) == 2
    assert "would inflate" in capsys.readouterr().err


def test_shards_and_the_model_folder_are_private(fdskl_model):
    tmp, model, _ = fdskl_model
    assert model.stat().st_mode & 0o777 == 0o700
    for shard in model.iterdir():
        assert shard.stat().st_mode & 0o777 == 0o700
        for f in shard.iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f
