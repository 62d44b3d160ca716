"""A host that disconnects mid-epoch stops every process with a clear error naming it; bad input, locally."""

import os

import pytest
import torch

from vfltorch.comm import FederationError, launch
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.linear import HeteroLogisticRegression

SMALL = dict(protocol="paper", crypto_processes=1, batch_size=64, max_epochs=2, key_bits=512, insecure_key=True,
             optimizer="sgd")


def crash_job(fed):
    data = load_party_data(fed, DataConfig(dataset="breast_cancer", scale="standard", seed=0)) \
        if fed.is_data_party else None
    if fed.rank == 1:                      # the host process dies in the middle of the first epoch
        from vfltorch.linear import host

        original = host.Host.iteration

        def dying(self, rows, k, eta, quasi_newton):
            if k == 3:
                os._exit(17)
            return original(self, rows, k, eta, quasi_newton)

        host.Host.iteration = dying
    HeteroLogisticRegression(fed, **SMALL).fit(None if data is None else data.X_train,
                                                None if data is None else data.y_train)


def test_host_disconnect_mid_epoch_stops_every_party():
    with pytest.raises(FederationError) as info:
        launch(crash_job, 2, coordinator=True, timeout=30)
    err = info.value
    assert err.root == 1
    assert "the cause is party 1 (passive)" in str(err)
    assert set(err.errors) == {0, 1, 2}                     # the guest and the coordinator stopped too
    assert "exited with code 17" in err.errors[1]
    for rank in (0, 2):
        assert "party 1 (passive) is gone" in err.errors[rank]


def _data(n=80, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.where(X[:, 0] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64) > 0, 1.0, -1.0)
    return X, y.to(torch.float64)


@pytest.mark.parametrize("kwargs,labels,message", [
    ({}, "one-class", "needs two classes in y, got only one class [1.0]"),      # any two labels are fine
    ({"batch_size": 81}, None, "batch_size=81 is larger than the training set (80 rows)"),
    ({"lr": 0.0}, None, "learning rate must be a positive number"),
    ({"lr": -0.1}, None, "learning rate must be a positive number"),
    ({"L": 0}, None, "L must be an integer >= 1"),
    ({"M": 0}, None, "M must be an integer >= 1"),
    ({"key_bits": 512}, None, "a 512-bit Paillier key is too small"),
    ({"optimizer": "adam"}, None, "optimizer must be one of"),
])
def test_bad_input_is_refused_with_a_message_that_says_what_to_fix(kwargs, labels, message):
    X, y = _data()
    if labels == "one-class":
        y = torch.ones_like(y)
    with pytest.raises(VFLInputError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)").replace("+", r"\+")):
        HeteroLogisticRegression(**{"batch_size": 16, **kwargs}).fit(X, y)


def test_features_beyond_the_encoding_range_are_refused():
    X, y = _data()
    X[3, 1] = 5e6
    with pytest.raises(VFLInputError, match="Scale the columns"):
        HeteroLogisticRegression(batch_size=16, standardize=False).fit(X, y)
    # standardize=True (the default) trains on the party's standardised columns, inside the range
    assert HeteroLogisticRegression(batch_size=16, max_epochs=2).fit(X, y).coef_.shape == (X.shape[1],)


def test_centralised_twin_learns():
    X, y = _data(n=400, d=5, seed=1)
    est = HeteroLogisticRegression(batch_size=50, max_epochs=30, optimizer="sqn", L=2).fit(X, y)
    assert est.score(X, y) > 0.85
    assert est.history_[-1]["loss"] < est.history_[0]["loss"]
    assert est.encryption_ == "none (centralised: one party)"
