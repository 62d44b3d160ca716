"""Every centralised estimator is a scikit-learn citizen at its default constructor: ``check_estimator`` passes,
except the checks each estimator declares (``_expected_failed_checks``, each with the reason); any two labels; numpy in, numpy out; ``fed`` in the
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
from vfltorch.pca import ExactFederatedKernelPCA, ExactFederatedPCA, RandomFeatureKernelPCA, VFedAKPCA, VFedPCA
from vfltorch.privacy.dpsgd import DPSGD
from vfltorch.privacy.estimator import DPSCD

# Every public estimator at its DEFAULT constructor: what a user gets from `Estimator()`. The checks that cannot
# apply are declared by the estimator itself, each with its reason (``_expected_failed_checks``: scikit-learn >= 1.6
# takes expected failures as an argument of its checks, not as a tag); a DP fit drawing from OS entropy sets the
# scikit-learn tag ``non_deterministic``.
ESTIMATORS = [FDSKLClassifier(), FDSKLRegressor(), HeteroLogisticRegression(), DPSCD(), DPSGD(), VFedPCA(),
              VFedAKPCA(), ExactFederatedPCA(), ExactFederatedKernelPCA(), RandomFeatureKernelPCA()]


def cannot_apply(estimator):
    declared = getattr(estimator, "_expected_failed_checks", None)
    return declared() if declared is not None else {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=cannot_apply)
def test_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # DP and scaling warnings are expected here
        check(estimator)


def test_every_declared_exception_says_why_and_dp_noise_is_tagged():
    for est in ESTIMATORS:
        for name, reason in cannot_apply(est).items():
            assert name.startswith("check_") and len(reason) > 40, (type(est).__name__, name)
    assert DPSCD().__sklearn_tags__().non_deterministic and DPSGD().__sklearn_tags__().non_deterministic
    # a simulation seed makes fits repeat (and voids the guarantee): then no exception is declared
    assert not DPSCD(simulation_seed=0).__sklearn_tags__().non_deterministic and not cannot_apply(
        DPSCD(simulation_seed=0))
    assert not DPSGD(private=False).__sklearn_tags__().non_deterministic


def test_dp_estimators_at_their_defaults_work_on_raw_and_scaled_rows():
    from sklearn.datasets import load_breast_cancer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    for make in (DPSCD, DPSGD):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = make_pipeline(StandardScaler(), make()).fit(X[:400], y[:400])     # raised before (row norms)
        assert pipe.score(X[400:], y[400:]) > 0.8
    with pytest.warns(UserWarning, match="batch_size=100 exceeds the 30 training rows; it is clipped to 30"):
        assert DPSGD(epochs=1).fit(X[:30], y[:30]).batch_size_ == 30


@pytest.mark.parametrize("make", [VFedPCA, VFedAKPCA, ExactFederatedPCA, ExactFederatedKernelPCA,
                                  RandomFeatureKernelPCA])
def test_pca_fitted_arrays_are_numpy_at_their_defaults(make):
    """Issue 37: every public fitted array is a numpy ndarray (float64, as scikit-learn's PCA.components_), none a
    torch.Tensor; ``history_`` is a list of them. The estimator still computes with tensors (transform of torch rows
    gives torch)."""
    from sklearn.datasets import load_breast_cancer

    X = load_breast_cancer(return_X_y=True)[0][:200]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make().fit(X)
    fitted = {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}
    arrays = {k: v for k, v in fitted.items() if isinstance(v, (np.ndarray, torch.Tensor))}
    listed = {f"{k}[{i}]": a for k, v in fitted.items() if isinstance(v, list)
              for i, a in enumerate(v) if isinstance(a, (np.ndarray, torch.Tensor))}
    assert "sample_components_" in arrays, sorted(fitted)
    assert listed, "history_ holds the fitted blocks"
    for name, value in {**arrays, **listed}.items():
        assert isinstance(value, np.ndarray) and not isinstance(value, torch.Tensor), (name, type(value))
        assert value.dtype == np.float64, (name, value.dtype)
    assert isinstance(est.transform(), np.ndarray)                           # numpy in, numpy out
    assert isinstance(est.transform(torch.as_tensor(X[:5])), torch.Tensor)   # torch in, torch out


def blobs(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    w = np.array([1.5, -1.0, 0.5, 1.0, -0.5, 0.8])
    return X, X @ w + 0.3 * rng.normal(size=n) > 0


@pytest.mark.parametrize("make", [lambda: FDSKLClassifier(epochs=3, calibration=0.2), lambda: HeteroLogisticRegression(),
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
        # (FDSKL's Platt scaling, fitted on 30 held-out rows, moves the 0.5 threshold off f = 0: 46 of 50 agree)
        assert ((proba[:, 1] > 0.5) == (pred == pos)).mean() > 0.85
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


def test_predict_proba_only_where_the_loss_is_logistic_and_fdskl_is_calibrated():
    # FDSKL's uncalibrated sigmoid(f) is 0 or 1 on nearly every row: no predict_proba without calibration (as SVC)
    assert hasattr(FDSKLClassifier(calibration=0.1), "predict_proba")
    assert not hasattr(FDSKLClassifier(calibration=0.1, loss="smooth_hinge"), "predict_proba")
    with pytest.raises(AttributeError) as info:          # (scikit-learn's message; ours is its cause, as for SVC)
        FDSKLClassifier().predict_proba
    assert "predict_proba needs calibration" in str(info.value.__cause__)
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
    # predict / score / predict_proba are collective: every process calls them (the dealer too, without rows);
    # calibration (Platt scaling, 30 of the 150 rows held out) makes predict_proba exist
    clf = FDSKLClassifier(fed, epochs=3, calibration=0.2, n_components=128).fit(train, y)
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
    assert ((proba[:, 1] > 0.5) == (np.array(fd["pred"]) == "yes")).mean() > 0.85    # (Platt's threshold)
    central = HeteroLogisticRegression(max_epochs=20).fit(X[:150], labels[:150])
    assert active["lr"]["score"] > 0.8 and abs(active["lr"]["score"] - central.score(X[150:], labels[150:])) < 0.05
    # every data party gets the summed scores, as numpy for numpy input; they match the pooled PCA
    assert active["pca"]["numpy"] and passive["pca"]["numpy"]
    np.testing.assert_allclose(active["pca"]["scores"], passive["pca"]["scores"], atol=1e-8)
    pooled = ExactFederatedPCA(2).fit(X[:150]).transform(X[150:])
    np.testing.assert_allclose(np.abs(active["pca"]["scores"]), np.abs(pooled), atol=1e-6)
