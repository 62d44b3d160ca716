"""`vfl pca`: the JSON record, TensorBoard curves, the server rank, option errors; shared datasets (slow)."""

import json

import pytest

from conftest import needs_dataset
from vfltorch.cli import build_parser, main
from vfltorch.data import VFLInputError
from vfltorch.pca.cli import build_estimator


def test_exact_method_record_has_distance_rounds_and_bytes(tmp_path):
    path, tb = tmp_path / "exact.json", tmp_path / "tb"
    assert main(["pca", "--method", "exact", "--components", "2", "--parties", "2", "--scale", "standard",
                 "--output-json", str(path), "--logdir", str(tb), "--quiet"]) == 0
    record = json.loads(path.read_text())
    m = record["metrics"]
    assert m["distance"] < 1e-6 and m["principal_angle_deg"] < 1e-4
    assert m["rounds"] == 1 and record["converged"] is True and m["bytes"] > 0 and m["fit_seconds"] > 0
    assert abs(m["explained_variance_ratio"] - m["pooled_explained_variance_ratio"]) < 1e-9
    # protocol 'auto' (default: covariance here) runs with a coordinator rank, which receives the masked sum
    assert len(record["history"]) == m["rounds"] and record["config"]["coordinator"] == 2
    assert record["comm"]["2"]["phases"]["pca/exact"]["bytes_sent"] > 0
    assert record["history"][-1]["distance"] == m["distance"]
    assert any(tb.iterdir())


def _args(*argv):
    return build_parser().parse_args(["pca", *argv])


def test_options_build_the_right_estimator():
    from vfltorch.pca import ExactFederatedKernelPCA, ExactFederatedPCA, VFedAKPCA, VFedPCA

    assert isinstance(build_estimator(_args()), VFedPCA)
    est = build_estimator(_args("--method", "akpca", "--topology", "ring", "--kernel", "poly"))
    assert isinstance(est, VFedAKPCA) and est.kernel == "poly" and est.topology == "ring" and est.local_iters is None
    assert isinstance(build_estimator(_args("--method", "exact")), ExactFederatedPCA)
    assert build_estimator(_args("--method", "exact")).protocol == "auto"
    assert build_estimator(_args("--method", "exact", "--protocol", "covariance")).protocol == "covariance"
    assert build_estimator(_args("--method", "exact", "--protocol", "krylov")).protocol == "krylov"
    assert build_estimator(_args("--merge", "paper")).merge == "paper"
    assert build_estimator(_args("--method", "akpca")).merge == "subspace"
    assert isinstance(build_estimator(_args("--method", "exact", "--kernel", "rbf")), ExactFederatedKernelPCA)
    assert build_estimator(_args("--periods", "4", "--local-iters", "3", "--warm-start")).local_iters == 3
    with pytest.raises(VFLInputError, match="--kernel rbf is for --method akpca or exact"):
        build_estimator(_args("--kernel", "rbf"))
    assert _args().test_fraction == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dataset", [pytest.param(d, marks=needs_dataset(d))
                                     for d in ("sonar", "vehicle", "pima", "glaucoma", "college")])
def test_exact_method_on_the_papers_structured_datasets(dataset, tmp_path):
    path = tmp_path / f"{dataset}.json"
    assert main(["pca", "--dataset", dataset, "--method", "exact", "--parties", "3", "--components", "3",
                 "--output-json", str(path), "--quiet"]) == 0
    m = json.loads(path.read_text())["metrics"]
    assert m["distance"] < 1e-6 and m["rounds"] > 0 and m["bytes"] > 0


@pytest.mark.slow
@needs_dataset("a9a")
@pytest.mark.parametrize("parties", [2, 3, 4])
def test_exact_covariance_protocol_on_a9a_sends_at_most_three_times_the_data(tmp_path, parties):
    # 32561 x 123: too many rows for the n x n rotation; 'auto' picks the covariance protocol. Each party's
    # columns are opened once (to the first holder), the holders' masked shares once each way: about
    # (1 + (Q - 2) / Q) times the data, plus O(d^2 + Q n k).
    path = tmp_path / "a9a.json"
    assert main(["pca", "--dataset", "a9a", "--method", "exact", "--parties", str(parties), "--components", "5",
                 "--output-json", str(path), "--quiet"]) == 0
    record = json.loads(path.read_text())
    m = record["metrics"]
    assert record["protocol"] == "covariance"
    assert m["distance"] < 1e-6
    data_bytes = 32561 * 123 * 8
    assert data_bytes < m["bytes"] <= 3 * data_bytes, m["bytes"] / data_bytes


def test_rffkpca_options():
    from vfltorch.pca import RandomFeatureKernelPCA
    from vfltorch.pca.cli import _wants_server

    est = build_estimator(_args("--method", "rffkpca", "--random-features", "32", "--components", "2"))
    assert isinstance(est, RandomFeatureKernelPCA) and est.n_random_features == 32 and est.gamma == "scale"
    assert _wants_server(_args("--method", "rffkpca"))
    with pytest.raises(VFLInputError, match="RBF kernel only"):
        build_estimator(_args("--method", "rffkpca", "--kernel", "poly"))
