"""Vertical data: registry, loaders, partitioning, preprocessing, validation messages."""

import numpy as np
import pytest
import torch

from conftest import needs_dataset
from vfltorch.comm import launch
from vfltorch.data import (DataConfig, VFLInputError, check_finite, check_labels, check_same_rows,
                           load_dataset, load_party_data, partition_columns, resolve_data_dir, split_rows)


def test_partition_schemes():
    c = partition_columns(10, 3)
    assert [g.tolist() for g in c] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    r = partition_columns(10, 3, "random", seed=1)
    assert sorted(np.concatenate(r).tolist()) == list(range(10))
    assert [g.tolist() for g in r] != [g.tolist() for g in c]
    assert [g.tolist() for g in partition_columns(10, 3, "random", seed=1)] == [g.tolist() for g in r]
    e = partition_columns(5, 2, "explicit", groups="0,2-3;1,4")
    assert [g.tolist() for g in e] == [[0, 2, 3], [1, 4]]


@pytest.mark.parametrize("kwargs,message", [
    (dict(n_features=3, parties=4), "4 parties but only 3 features"),
    (dict(n_features=4, parties=2, scheme="explicit", groups="0-3;"), "party 1 has no columns"),
    (dict(n_features=4, parties=2, scheme="explicit", groups="0-2;2-3"), "more than one party"),
    (dict(n_features=4, parties=2, scheme="explicit", groups="0;1-2"), "belong to no party"),
    (dict(n_features=4, parties=2, scheme="explicit", groups="0-1;x"), "cannot read feature group"),
    (dict(n_features=4, parties=3, scheme="explicit", groups="0-1;2-3"), "one group per party"),
    (dict(n_features=4, parties=2, scheme="diagonal"), "unknown partition scheme"),
])
def test_partition_errors_say_what_to_fix(kwargs, message):
    with pytest.raises(VFLInputError, match=message):
        partition_columns(**kwargs)


def test_validation_messages():
    with pytest.raises(VFLInputError, match=r"2 NaN or infinite values in column\(s\) a, b.*--impute"):
        check_finite(np.array([[1.0, np.nan], [np.inf, 2.0]]).T, ["a", "b"])
    with pytest.raises(VFLInputError, match=r"must be -1 and \+1, got \[0.0, 1.0\]"):
        check_labels(np.array([0.0, 1.0, 1.0]), "binary")
    with pytest.raises(VFLInputError, match="party 0: 5, party 1: 4"):
        check_same_rows({0: 5, 1: 4})
    with pytest.raises(VFLInputError, match="unknown dataset 'nope'.*breast_cancer"):
        load_dataset("nope")
    with pytest.raises(VFLInputError, match="test-fraction"):
        split_rows(10, 1.5, 0)


def test_missing_data_dir_is_explained(tmp_path, monkeypatch):
    with pytest.raises(VFLInputError, match="is not a directory"):
        resolve_data_dir(tmp_path / "absent")
    with pytest.raises(VFLInputError, match="does not exist.*MANIFEST"):
        load_dataset("a9a", data_dir=tmp_path)


def test_breast_cancer_is_bundled():
    ds = load_dataset("breast_cancer")
    assert ds.X.shape == (569, 30) and set(np.unique(ds.y)) == {-1.0, 1.0}


@needs_dataset("a9a")
def test_a9a_has_its_test_file_with_the_same_width():
    ds = load_dataset("a9a")
    assert ds.X.shape == (32561, 123) and ds.X_test.shape == (16281, 123)


def party_job(fed, config):
    data = load_party_data(fed, config)
    return data


def test_each_party_holds_only_its_columns_and_labels_stay_active():
    config = DataConfig(dataset="breast_cancer", partition="random", seed=3, test_fraction=0.25)
    parts = launch(party_job, 3, args=(config,))
    ds = load_dataset("breast_cancer")
    train, test = split_rows(569, 0.25, 3)
    groups = partition_columns(30, 3, "random", seed=3)
    for r, d in enumerate(parts):
        assert d.columns.tolist() == groups[r].tolist()
        assert torch.equal(d.X_train, torch.as_tensor(ds.X[train][:, groups[r]]))
        assert torch.equal(d.X_test, torch.as_tensor(ds.X[test][:, groups[r]]))
        if r == 0:
            assert torch.equal(d.y_train, torch.as_tensor(ds.y[train]))
        else:
            assert d.y_train is None and d.y_test is None
        d.check_local_only(active=0)


def test_federated_row_normalisation_matches_pooled_norms():
    config = DataConfig(dataset="breast_cancer", scale="standard", normalize_rows=True)
    parts = launch(party_job, 3, args=(config,))
    X = torch.cat([d.X_train for d in parts], dim=1)
    torch.testing.assert_close(X.norm(dim=1), torch.ones(X.shape[0], dtype=X.dtype))
    # ... and the scaling before it was fitted per party on the training rows only
    one = launch(party_job, 1, args=(DataConfig(dataset="breast_cancer", scale="standard"),))[0]
    Xn = one.X_train / one.X_train.norm(dim=1, keepdim=True)
    torch.testing.assert_close(X, Xn)


@pytest.mark.slow          # (11 s; own files joined by PSI stay in the default run: test_party_files, test_organisations)
def test_own_files_joined_on_an_id_column(tmp_path):
    rng = np.random.default_rng(0)
    ids = np.arange(40)
    a = np.c_[ids, rng.normal(size=(40, 2)), (rng.random(40) > 0.5).astype(int)]
    b = np.c_[ids, rng.normal(size=(40, 3))]
    # party 1's file is shuffled and misses two IDs: rows are matched on the ID, not the order
    keep = rng.permutation(40)[:38]
    np.savetxt(tmp_path / "a.csv", a, delimiter=",", header="id,a1,a2,y", comments="")
    np.savetxt(tmp_path / "b.csv", b[keep], delimiter=",", header="id,b1,b2,b3", comments="")
    config = DataConfig(party_files=[str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], id_column="id",
                        label_column="y", test_fraction=0.0)
    pa, pb = launch(party_job, 2, args=(config,))
    assert pa.X_train.shape == (38, 2) and pb.X_train.shape == (38, 3)
    # the same row at both parties: compare with the original rows by looking them up
    # aligned by PSI, in the active party's row order (a.csv lists the IDs in ascending order)
    rows = np.array(sorted(keep.tolist()))
    np.testing.assert_allclose(pa.X_train.numpy(), a[rows, 1:3])
    np.testing.assert_allclose(pb.X_train.numpy(), b[rows, 1:4])
    assert set(pa.y_train.tolist()) <= {-1.0, 1.0} and pb.y_train is None


def _rows_job(fed):
    from vfltorch.data.party import _check_rows
    _check_rows(fed, 5 if fed.rank == 0 else 4, 0)   # party 1's copy lost a row


def test_rows_that_disagree_are_refused_at_every_party():
    with pytest.raises(Exception) as info:
        launch(_rows_job, 2)
    for rank in (0, 1):
        assert "disagree on the number of training rows (party 0: 5, party 1: 4)" in info.value.errors[rank]


def test_user_csv_with_text_column_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("a,b,y\n1,x,0\n2,y,1\n")
    config = DataConfig(dataset=str(tmp_path / "t.csv"), label_column="y")
    with pytest.raises(Exception, match=r"column 'b' is not numeric: line 2 holds 'x'"):
        launch(party_job, 1, args=(config,))


def test_nan_without_imputation_is_refused_and_imputation_fixes_it(tmp_path):
    (tmp_path / "n.csv").write_text("a,b,y\n1,,0\n2,3,1\n4,5,0\n6,7,1\n")
    with pytest.raises(VFLInputError, match="NaN"):
        launch(party_job, 1, args=(DataConfig(dataset=str(tmp_path / "n.csv"), label_column="y",
                                              test_fraction=0.0),))
    d = launch(party_job, 1, args=(DataConfig(dataset=str(tmp_path / "n.csv"), label_column="y",
                                              test_fraction=0.0, impute="median"),))[0]
    assert d.X_train[0, 1] == 5.0  # the median of 3, 5, 7


def test_sparse_libsvm_file_with_a_separate_test_file(tmp_path):
    from sklearn.datasets import dump_svmlight_file
    import scipy.sparse as sp

    rng = np.random.default_rng(1)
    X = sp.random(30, 6, density=0.3, random_state=1, format="csr")
    y = np.where(rng.random(30) > 0.5, 1, 0)
    dump_svmlight_file(X[:20], y[:20], str(tmp_path / "tr.svm"))
    dump_svmlight_file(X[20:, :5], y[20:], str(tmp_path / "te.svm"))    # the test file never uses column 6
    config = DataConfig(dataset=str(tmp_path / "tr.svm"), test_dataset=str(tmp_path / "te.svm"))
    a, b = launch(party_job, 2, args=(config,))
    dense = X.toarray()
    np.testing.assert_allclose(torch.cat([a.X_train, b.X_train], 1).numpy(), dense[:20])
    np.testing.assert_allclose(torch.cat([a.X_test, b.X_test], 1).numpy(), np.c_[dense[20:, :5], np.zeros(10)])
    assert torch.equal(a.y_test, torch.as_tensor(np.where(y[20:] == 1, 1.0, -1.0)))


def test_clip_winsorises_each_party_after_scaling():
    from vfltorch.comm import Federation
    from vfltorch.data import load_party_data

    plain = load_party_data(Federation.local(), DataConfig(scale="standard"))
    clipped = load_party_data(Federation.local(), DataConfig(scale="standard", clip=2.0))
    assert plain.X_train.abs().max() > 2.0                      # breast_cancer has values beyond 2 sd
    assert torch.equal(clipped.X_train, plain.X_train.clamp(-2.0, 2.0))
    assert torch.equal(clipped.X_test, plain.X_test.clamp(-2.0, 2.0))
    with pytest.raises(VFLInputError, match="--clip-values must be a positive number"):
        load_party_data(Federation.local(), DataConfig(scale="standard", clip=0.0))
