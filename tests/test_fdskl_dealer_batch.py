"""The dealer's batched rounds (``kernels.shared.deal_rounds``) are the rounds it makes one at a time.

Over real processes (Q = 2 and 3, plus the dealer), training with the epoch-end monitor (a synchronisation the
batches must stop at) runs twice: the dealer one round at a time (``DEALER_BATCH = 1``), then in batches. Every
secret draw of both runs comes from the same seeded generator per rank (this test's simulation only: such a run
carries no privacy guarantee), so the batch must reproduce every message: the model is equal bit for bit, and
every rank sends and receives the same bytes in the same number of messages.
"""

import hashlib
import warnings

import numpy as np
import pytest

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data

SETTINGS = dict(protocol="shared", batch_size=32, epochs=2, n_components=128, random_state=3, compress_to=None,
                sigma=1.0)


def job(fed, batch):
    import secrets

    from vfltorch.kernels import FDSKLClassifier, budget

    rng = np.random.default_rng(1000 + fed.rank)
    secrets.token_bytes = lambda n=32: rng.bytes(n)
    secrets.randbits = lambda k: int.from_bytes(rng.bytes((k + 7) // 8), "little") >> ((8 - k % 8) % 8)
    budget.DEALER_BATCH = batch
    calls = []
    deal_rounds = budget.deal_rounds

    def counted(io, table, rounds, *args, **kwargs):
        calls.append(len(rounds))
        return deal_rounds(io, table, rounds, *args, **kwargs)
    budget.deal_rounds = counted
    warnings.simplefilter("ignore")
    est = FDSKLClassifier(fed, **SETTINGS)
    if not fed.is_data_party:
        est.fit(None)
    else:
        data = load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0))
        est.fit(data.X_train, data.y_train, columns=data.columns, monitor=(data.X_test, data.y_test))
    meter = {phase: v for phase, v in fed.meter.as_dict().items() if phase.startswith("fdskl/train")}
    alpha = None
    if fed.is_active:
        alpha = hashlib.sha256(np.ascontiguousarray(est.alpha_, dtype=np.float64).tobytes()).hexdigest()
    return alpha, meter, calls


@pytest.mark.parametrize("parties", [2, 3])
def test_batched_dealer_sends_what_one_round_at_a_time_sends(parties):
    one = launch(job, parties, (1,), coordinator=True)
    batched = launch(job, parties, (8,), coordinator=True)
    dealer = parties
    assert one[dealer][2] == [] and len(batched[dealer][2]) > 0 and max(batched[dealer][2]) > 1
    assert one[0][0] == batched[0][0] is not None
    for rank in range(parties + 1):
        assert one[rank][1] == batched[rank][1], f"rank {rank}'s training messages differ"
