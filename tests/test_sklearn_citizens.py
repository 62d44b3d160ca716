"""Every centralised estimator is a scikit-learn citizen: ``check_estimator`` passes, except the checks in
``CANNOT_APPLY`` (one table, each with the reason); any two labels; numpy in, numpy out; ``fed`` in the
constructor everywhere; and the same across real party processes (``launch``)."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from vfltorch.comm import Federation, launch
from vfltorch.data import VFLInputError
from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor
from vfltorch.linear import HeteroLogisticRegression
from vfltorch.pca import ExactFederatedKernelPCA, ExactFederatedPCA, VFedAKPCA, VFedPCA
from vfltorch.privacy.dpsgd import DPSGD
from vfltorch.privacy.estimator import DPSCD

UNSCALED = ("the check's features are ~N(100, 1), unscaled: the Taylor-loss SGD/SQN with its default step diverges "
            "and says so (DivergenceError: lower the learning rate); the method needs scaled columns "
            "(`vfl hetero-lr` scales them)")
NO_NEW_ROWS = ("VFedAKPCA embeds the training samples only: a kernel between new and training rows would need "
               "every party's columns (transform(X_new) raises and says so); ExactFederatedKernelPCA does it")

# The one table of checks that cannot apply, with the reason. Small settings (fewer epochs, small batches)
# and a given noise multiplier sigma (no calibration per data set) only make the checks fast; DPSCD/DPSGD run
# with simulation_seed because the checks compare two fits
# (idempotence, y as a column, data not an array), which a DP mechanism drawing from OS entropy never repeats.
CANNOT_APPLY = {
    "FDSKLRegressor": {
        "check_regressors_no_decision_function": (
            "decision_function is FDSKL's f(x), the value the federated predict protocol computes for both tasks "
            "(the CLI and the dealer call it); for the regressor it equals predict"),
    },
    "HeteroLogisticRegression": {
        "check_fit_idempotent": UNSCALED, "check_fit_check_is_fitted": UNSCALED, "check_n_features_in": UNSCALED,
    },
    "VFedAKPCA": {name: NO_NEW_ROWS for name in (
        "check_estimators_dtypes", "check_dtype_object", "check_estimators_pickle", "check_f_contiguous_array_estimator",
        "check_transformer_data_not_an_array", "check_transformer_general", "check_transformer_preserve_dtypes",
        "check_methods_sample_order_invariance", "check_methods_subset_invariance", "check_dict_unchanged",
        "check_fit_idempotent")},
}

ESTIMATORS = [
    FDSKLClassifier(epochs=1, features_per_step=16),
    FDSKLRegressor(epochs=2, features_per_step=16),
    HeteroLogisticRegression(max_epochs=5),
    DPSCD(epochs=2, L=5, normalize_rows=True, accountant="rdp", sigma=1.0, simulation_seed=0),
    DPSGD(epochs=2, batch_size=5, accountant="rdp", sigma=1.0, simulation_seed=0),
    VFedPCA(), VFedAKPCA(), ExactFederatedPCA(), ExactFederatedKernelPCA(),
]


def cannot_apply(estimator):
    return CANNOT_APPLY.get(type(estimator).__name__, {})


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=cannot_apply)
def test_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # simulation-mode and scaling warnings are expected here
        check(estimator)


def blobs(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    w = np.array([1.5, -1.0, 0.5, 1.0, -0.5, 0.8])
    return X, X @ w + 0.3 * rng.normal(size=n) > 0


@pytest.mark.parametrize("make", [lambda: FDSKLClassifier(epochs=3), lambda: HeteroLogisticRegression(),
                                  lambda: DPSCD(variant="nonprivate", normalize_rows=True), lambda: DPSGD(private=False)])
def test_any_two_labels_give_the_same_model_and_come_back(make):
    X, positive = blobs()
    scores, probas = [], []
    for neg, pos in [(-1, 1), (0, 1), ("benign", "malignant"), (False, True)]:
        y = np.where(positive, pos, neg)
        est = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X[:150], y[:150])
        assert list(est.classes_) == sorted([neg, pos]) and est.n_features_in_ == 6
        pred = est.predict(X[150:])
        assert isinstance(pred, np.ndarray) and set(pred.tolist()) <= {neg, pos}
        scores.append(est.score(X[150:], y[150:]))
        proba = est.predict_proba(X[150:])
        assert proba.shape == (50, 2) and np.allclose(proba.sum(1), 1.0)
        assert ((proba[:, 1] > 0.5) == (pred == pos)).mean() > 0.95
        probas.append(proba[:, 1])
    assert scores[0] > 0.8
    if not isinstance(est, (DPSCD, DPSGD)):         # same seeds, same model whatever the label names
        assert max(scores) - min(scores) < 1e-12
        assert np.allclose(probas[0], probas[1]) and np.allclose(probas[0], probas[2])


def test_hetero_lr_score_with_zero_one_labels_is_the_accuracy():
    # The issue: score(X, y in {0, 1}) returned 0.629 instead of 0.951 (predictions were -1 / +1).
    X, positive = blobs(400, seed=1)
    y01 = positive.astype(int)
    lr = HeteroLogisticRegression().fit(X[:300], y01[:300])
    expected = float((lr.predict(X[300:]) == y01[300:]).mean())
    assert lr.score(X[300:], y01[300:]) == expected > 0.85
    lr_pm = HeteroLogisticRegression().fit(torch.tensor(X[:300]), torch.tensor(2.0 * y01[:300] - 1))
    assert lr_pm.score(torch.tensor(X[300:]), torch.tensor(2.0 * y01[300:] - 1)) == expected
    assert isinstance(lr_pm.predict(torch.tensor(X[300:])), torch.Tensor)      # torch in, torch out


def test_predict_proba_only_where_the_loss_is_logistic():
    assert hasattr(FDSKLClassifier(), "predict_proba") and not hasattr(FDSKLClassifier(loss="smooth_hinge"),
                                                                       "predict_proba")
    assert hasattr(DPSCD(), "predict_proba") and not hasattr(DPSCD(task="svm"), "predict_proba")
    assert not hasattr(DPSGD(task="ridge"), "predict_proba") and not hasattr(FDSKLRegressor(), "predict_proba")


def test_unfitted_use_raises_not_fitted_error_still_a_vfl_input_error():
    X, _ = blobs(10)
    for est in (FDSKLClassifier(), FDSKLRegressor(), HeteroLogisticRegression(), DPSCD(), DPSGD(), VFedPCA(),
                ExactFederatedPCA()):
        method = est.transform if hasattr(est, "transform") else est.predict
        with pytest.raises(NotFittedError):
            method(X)
        with pytest.raises(VFLInputError):
            method(X)


def test_three_classes_are_refused_with_what_to_do():
    X, _ = blobs(30)
    for est in (HeteroLogisticRegression(), DPSCD(normalize_rows=True), DPSGD()):
        with pytest.raises(VFLInputError, match="Only binary classification"):
            est.fit(X, np.arange(30) % 3)


def test_pandas_input_and_feature_names():
    pd = pytest.importorskip("pandas")
    X, positive = blobs()
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(6)])
    lr = HeteroLogisticRegression().fit(frame, positive)
    assert list(lr.feature_names_in_) == list(frame.columns)
    assert lr.predict(frame).dtype == bool
    pca = ExactFederatedPCA(2).fit(frame)
    assert isinstance(pca.transform(frame), np.ndarray)


def test_fed_goes_to_the_constructor_and_fit_fed_is_deprecated():
    X = blobs()[0]
    new = ExactFederatedPCA(2, fed=Federation.local()).fit(X).transform()
    with pytest.warns(DeprecationWarning, match=r"pass the federation to the constructor"):
        old = ExactFederatedPCA(2).fit(torch.as_tensor(X), Federation.local())
    np.testing.assert_allclose(np.abs(old.transform().numpy()), np.abs(new), atol=1e-9)
    with pytest.raises(VFLInputError, match="two federations"), pytest.warns(DeprecationWarning):
        ExactFederatedPCA(2, fed=Federation.local()).fit(X, fed=Federation.local())


# ---------------------------------------------------------------------------- real party processes
def citizens_job(fed):
    """Two data parties (columns 0-2, 3-5) and a coordinator; numpy in, string labels at the active party."""
    X, positive = blobs()
    labels = np.where(positive, "yes", "no")
    mine = None if fed.is_coordinator else X[:, :3] if fed.rank == 0 else X[:, 3:]
    y = labels[:150] if fed.is_active else None
    train, test = (None, None) if mine is None else (mine[:150], mine[150:])
    out = {}
    # predict / score / predict_proba are collective: every process calls them (the dealer too, without rows)
    clf = FDSKLClassifier(fed, epochs=3).fit(train, y)
    pred, score, proba = clf.predict(test), clf.score(test, labels[150:]), clf.predict_proba(test)
    out["fdskl"] = None if pred is None else {"classes": list(clf.classes_), "pred": pred.tolist(),
                                              "score": score, "proba": proba.tolist()}
    lr = HeteroLogisticRegression(fed, max_epochs=20).fit(train, y)
    if not fed.is_coordinator:
        pred, score = lr.predict(test), lr.score(test, labels[150:])
        out["lr"] = None if pred is None else {"pred": pred.tolist(), "score": score}
    pca = ExactFederatedPCA(2, fed=fed, protocol="rotated").fit(train)
    if not fed.is_coordinator:
        scores = pca.transform(test)
        out["pca"] = {"numpy": isinstance(scores, np.ndarray), "scores": np.asarray(scores).tolist()}
    return out


def test_parties_take_numpy_and_any_labels_and_answer_with_them():
    res = launch(citizens_job, 2, coordinator=True)
    X, positive = blobs()
    labels = np.where(positive, "yes", "no")
    active, passive = res[0], res[1]
    assert passive["fdskl"] is None and passive["lr"] is None and res[2]["fdskl"] is None
    fd = active["fdskl"]
    assert fd["classes"] == ["no", "yes"] and set(fd["pred"]) <= {"no", "yes"}
    assert fd["score"] == np.mean(np.array(fd["pred"]) == labels[150:]) > 0.8
    proba = np.array(fd["proba"])
    assert ((proba[:, 1] > 0.5) == (np.array(fd["pred"]) == "yes")).all()
    central = HeteroLogisticRegression(max_epochs=20).fit(X[:150], labels[:150])
    assert active["lr"]["score"] > 0.8 and abs(active["lr"]["score"] - central.score(X[150:], labels[150:])) < 0.05
    # every data party gets the summed scores, as numpy for numpy input; they match the pooled PCA
    assert active["pca"]["numpy"] and passive["pca"]["numpy"]
    np.testing.assert_allclose(active["pca"]["scores"], passive["pca"]["scores"], atol=1e-8)
    pooled = ExactFederatedPCA(2).fit(X[:150]).transform(X[150:])
    np.testing.assert_allclose(np.abs(active["pca"]["scores"]), np.abs(pooled), atol=1e-6)
