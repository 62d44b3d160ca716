"""``HeteroLogisticRegression(standardize=True)``: each party standardises its own columns, the model is mapped back.

* one party: on unscaled columns (means up to 1000, scales from 0.001 to 100) the default fit is the fit on
  scikit-learn's ``StandardScaler`` columns, with coef_ = w / std and the intercept moved accordingly, so raw rows
  score as the trained model; without an intercept the columns are only divided;
* real processes (guest, host, coordinator): the federated fit on unscaled columns is the federated fit on
  standardised ones mapped back, each party's block and the intercept summed over both parties (paper protocol
  in the clear: to 1e-9), it is close to the centralised fit (paper and the default shared protocol, to their
  fixed point), and the intercept's sum sends nothing but ring-masked words between the data parties.
"""

import numpy as np
import pytest
import torch
from sklearn.preprocessing import StandardScaler

from vfltorch.comm import launch
from vfltorch.linear import HeteroLogisticRegression

MEANS = np.array([100.0, -50.0, 1000.0, 5.0, 100.0, 0.01])
SCALES = np.array([1.0, 5.0, 100.0, 0.1, 1.0, 0.001])
D_GUEST = 3
COMMON = dict(batch_size=50, max_epochs=6, tol=0.0, random_state=3)


def data(n=240):
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(n, 6))
    y = np.where(Z @ np.array([1.0, -1.0, 0.5, 0.8, -0.6, 0.3]) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return Z * SCALES + MEANS, y


def test_default_fit_is_the_fit_on_standardised_columns_mapped_back():
    X, y = data()
    scaler = StandardScaler().fit(X)
    raw = HeteroLogisticRegression(**COMMON).fit(X, y)
    scaled = HeteroLogisticRegression(standardize=False, **COMMON).fit(scaler.transform(X), y)
    assert isinstance(raw.coef_, np.ndarray)                # scikit-learn's type
    np.testing.assert_allclose(raw.coef_, scaled.coef_ / scaler.scale_, rtol=1e-9, atol=0)
    assert raw.intercept_ == pytest.approx(scaled.intercept_ - float(raw.coef_ @ scaler.mean_),
                                           abs=1e-9)
    np.testing.assert_allclose(raw.decision_function(X), scaled.decision_function(scaler.transform(X)), atol=1e-9)
    assert raw.score(X, y) > 0.9
    # the columns as given diverge at the default step (what check_estimator hit before)
    with pytest.raises(Exception, match="diverged|range of the fixed-point"):
        HeteroLogisticRegression(standardize=False, **COMMON).fit(X, y)


def test_without_an_intercept_the_columns_are_only_divided():
    X, y = data()
    X = X - MEANS                                        # (a model without intercept needs centred rows)
    sd = X.std(axis=0)
    raw = HeteroLogisticRegression(fit_intercept=False, **COMMON).fit(X, y)
    scaled = HeteroLogisticRegression(fit_intercept=False, standardize=False, **COMMON).fit(X / sd, y)
    assert raw.intercept_ is None
    np.testing.assert_allclose(raw.coef_, scaled.coef_ / np.asarray(sd), rtol=1e-9, atol=0)


# ------------------------------------------------------------------------------ real party processes
def party_job(fed):
    X, y = data()
    mine = None if fed.is_coordinator else X[:, :D_GUEST] if fed.is_active else X[:, D_GUEST:]
    labels = y if fed.is_active else None
    scaled = None if mine is None else StandardScaler().fit(X).transform(X)[:, :D_GUEST] if fed.is_active else \
        StandardScaler().fit(X).transform(X)[:, D_GUEST:]
    paper = dict(protocol="paper", encryption=False, mask_seed=9)
    out = {}
    for name, kw, columns in [("paper", paper, mine), ("shared", {}, mine),
                              ("paper-scaled", dict(paper, standardize=False), scaled)]:
        start = len(fed.transcript)
        est = HeteroLogisticRegression(fed, **COMMON, **kw).fit(columns, labels)
        sent = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript.messages[start:]]
        out[name] = {"coef": None if est.coef_ is None else torch.as_tensor(est.coef_), "intercept": est.intercept_,
                     "scores": None if fed.is_coordinator else est.decision_function(columns),
                     "scale_sent": [(src, dst, t) for ph, src, dst, t in sent if ph == "hetero-lr/scale"]}
    return out


@pytest.fixture(scope="module")
def results():
    return launch(party_job, 2, coordinator=True, record_transcript=True, timeout=180)


def test_each_party_maps_its_block_back_and_the_intercept_sums_both(results):
    X, _ = data()
    scaler = StandardScaler().fit(X)
    mean, scale = torch.as_tensor(scaler.mean_), torch.as_tensor(scaler.scale_)
    blocks = [slice(0, D_GUEST), slice(D_GUEST, None)]
    for rank in (0, 1):
        raw, scaled = results[rank]["paper"], results[rank]["paper-scaled"]
        torch.testing.assert_close(raw["coef"], scaled["coef"] / scale[blocks[rank]], rtol=1e-9, atol=0)
    coef = torch.cat([results[0]["paper"]["coef"], results[1]["paper"]["coef"]])
    # the guest's intercept moved by sum over BOTH parties of coef_q . mean_q: the host's part came by the sum
    assert results[0]["paper"]["intercept"] == pytest.approx(
        results[0]["paper-scaled"]["intercept"] - float(coef @ mean), abs=1e-8)
    assert results[1]["paper"]["intercept"] is None and results[2]["paper"]["coef"] is None
    np.testing.assert_allclose(results[0]["paper"]["scores"], results[0]["paper-scaled"]["scores"], atol=1e-9)
    assert results[1]["paper"]["scores"] is None


@pytest.mark.parametrize("name", ["paper", "shared"])
def test_federated_standardisation_is_close_to_the_centralised_one(results, name):
    # (the federated protocols round margins and shares in fixed point: the centralised twin is matched to that)
    X, y = data()
    central = HeteroLogisticRegression(**COMMON).fit(X, y)
    guest, host = results[0][name], results[1][name]
    coef = torch.cat([torch.as_tensor(guest["coef"]), torch.as_tensor(host["coef"])])
    torch.testing.assert_close(coef, torch.as_tensor(central.coef_), rtol=1e-2 if name == "shared" else 1e-3, atol=0)
    scores = central.decision_function(X)
    assert np.abs(guest["scores"] - scores).max() < (0.05 if name == "shared" else 5e-3) * np.abs(scores).max()


@pytest.mark.parametrize("name", ["paper", "shared"])
def test_the_intercept_sum_sends_only_masked_words(results, name):
    sent = [m for res in results for m in res[name]["scale_sent"]]
    assert sent
    for src, dst, t in sent:
        assert dst != 2 and src != 2                              # the coordinator takes no part
        assert not t.is_floating_point() and t.numel() <= 10     # ring words and framing: no column, no row
