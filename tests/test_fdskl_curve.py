"""FDSKL's learning curve: a curve point sends no message (issue 11: time at Q = 2).

Every rank records its own training bytes at each point; one reduce at the end of training gives the active
party the points' totals (``trainer.TrainingLoop``). So a run with a point at every iteration sends exactly
what a run with points at the epoch ends only sends, phase by phase and rank by rank (the shared protocol
opens held-out values at epoch ends only, under both), and the points' bytes add up to the meters' totals.
Real processes: Q = 2 and the dealer.
"""

import warnings

import pytest

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import FDSKLClassifier
from vfltorch.kernels.trainer import CURVE_PHASE, MONITOR_PHASE, TRAIN_PHASE, phase_totals

CURVE = dict(protocol="shared", batch_size=32, epochs=2, random_state=3, n_components=128, features_per_step=16, sigma=1.0)
EVERY, EPOCH_ENDS = 1, 10 ** 6            # log_every: a point at every iteration; only at epoch ends and the end
RUNS = {
    "shared": {},                          # bounded model, f_delay 0 (the dealer's windows: budget.py ``sync``)
    "shared_delay1": dict(f_delay=1),      # the pipelined iteration
    "paper": dict(protocol="paper", mask_seed="seed"),
    "shared_growing": dict(n_components=None, epochs=1),    # shared.train_shared
    "paper_growing": dict(n_components=None, epochs=1, protocol="paper", mask_seed="seed"),   # trainer.train_dsg
}


def _phases(fed):
    """This rank's meter over the training and monitor phases (every sub-phase)."""
    return {k: v for k, v in fed.meter.as_dict().items()
            if k.split("/")[:2] in (TRAIN_PHASE.split("/"), MONITOR_PHASE.split("/"))}


def _delta(after, before):
    return {k: {f: v[f] - before.get(k, {}).get(f, 0) for f in v} for k, v in after.items()
            if any(v[f] - before.get(k, {}).get(f, 0) for f in v)}


def curve_job(fed):
    warnings.simplefilter("ignore")
    data = load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0)) \
        if fed.is_data_party else None
    out = {}
    for name, kw in RUNS.items():
        if fed.is_coordinator and kw.get("protocol") == "paper":
            continue                       # the dealer sits the paper's protocol out
        # The growing model under the paper's protocol fetches the monitor rows' new features at every point
        # (they are its curve's values, not its bytes): run without a monitor there.
        monitor = name != "paper_growing"
        for log_every in (EVERY, EPOCH_ENDS):
            est = FDSKLClassifier(fed, log_every=log_every, **dict(CURVE, **kw))
            before, train_before = _phases(fed), phase_totals(fed, TRAIN_PHASE)["bytes_sent"]
            if data is None:
                est.fit(None)
            else:
                est.fit(data.X_train, data.y_train, columns=data.columns,
                        monitor=(data.X_test, data.y_test) if monitor else None)
            out[name, log_every] = {"phases": _delta(_phases(fed), before), "history": est.history_,
                                    "train_bytes": phase_totals(fed, TRAIN_PHASE)["bytes_sent"] - train_before,
                                    "n_iter": est.n_iter_}
    return out


@pytest.fixture(scope="module")
def curve_runs():
    return launch(curve_job, 2, coordinator=True)


@pytest.mark.parametrize("name", list(RUNS))
def test_a_curve_point_sends_nothing_and_its_bytes_are_the_meters(curve_runs, name):
    ranks = [r for r in curve_runs if (name, EVERY) in r]
    assert len(ranks) == (2 if "paper" in name else 3)
    dense, sparse = ranks[0][name, EVERY], ranks[0][name, EPOCH_ENDS]
    T = dense["n_iter"]
    assert T == sparse["n_iter"] and T > 10
    epochs = RUNS[name].get("epochs", CURVE["epochs"])
    # A point at every iteration against one per epoch: the same messages and bytes, phase by phase, every rank.
    assert [p["iteration"] for p in dense["history"]] == list(range(1, T + 1))
    assert len(sparse["history"]) == epochs
    # (The end's one reduce, CURVE_PHASE, carries 8 bytes per point: [points, sum of their iterations, bytes at
    # each point]; one message from each rank but the active party.)
    for r in ranks:
        a, b = r[name, EVERY]["phases"], r[name, EPOCH_ENDS]["phases"]
        assert set(a) == set(b)
        for phase in a:
            assert {f: v for f, v in a[phase].items() if f.startswith("messages")} == \
                {f: v for f, v in b[phase].items() if f.startswith("messages")}, phase
            extra = 8 * (T - epochs) if phase == CURVE_PHASE else 0
            for way in ("sent", "received"):
                assert a[phase][f"bytes_{way}"] - b[phase][f"bytes_{way}"] == extra * a[phase][f"messages_{way}"]
        assert a[CURVE_PHASE]["messages_sent"] == (0 if r is ranks[0] else 1)
    # The points' bytes: every rank's training bytes by the point's iteration, the last one the meters' total.
    for run in (dense, sparse):
        total = sum(r[name, run is sparse and EPOCH_ENDS or EVERY]["train_bytes"] for r in ranks)
        assert run["history"][-1]["bytes"] == total > 0
    bytes_at = {p["iteration"]: p["bytes"] for p in dense["history"]}
    assert all(bytes_at[p["iteration"]] == p["bytes"] for p in sparse["history"])
    assert all(a < b for a, b in zip(list(bytes_at.values()), list(bytes_at.values())[1:]))
    # The other fields are kept; under shared the held-out values are opened at epoch ends (and the end) only.
    for p in dense["history"]:
        assert {"iteration", "features", "train_seconds", "bytes", "batch_loss"} <= set(p)
    if name != "paper_growing":
        opened = [p["iteration"] for p in dense["history"] if "test_accuracy" in p]
        if name.startswith("shared"):
            assert opened == [p["iteration"] for p in sparse["history"]]
        else:
            assert opened == list(range(1, T + 1))


def test_the_curve_in_the_record_and_tensorboard_under_a_time_budget(tmp_path):
    """`vfl fdskl --time-budget` (a stop flag every iteration, the dealer in step at each): the JSON history's
    bytes end at the meters' total, and the TensorBoard curves against kilobytes, written at the end, carry the
    points' bytes; the curves against iterations carry their iterations."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vfltorch.cli import main

    out, tb = tmp_path / "fdskl.json", tmp_path / "tb"
    assert main(["fdskl", "--protocol", "shared", "--parties", "2", "--dataset", "breast_cancer",
                 "--n-components", "128", "--features-per-step", "16", "--batch-size", "32", "--epochs", "2",
                 "--sigma", "1", "--time-budget", "1000", "--log-every", "4", "--monitor-rows", "40", "--seed", "3",
                 "--output-json", str(out), "--logdir", str(tb), "--quiet"]) == 0
    rec = json.loads(out.read_text())["fdskl"]
    hist, comm = rec["history"], rec["train_comm"]
    T = rec["iterations"]
    assert T == 27 and len(comm["train_bytes_sent_per_party"]) == 3      # A, the passive party, the dealer
    assert [p["iteration"] for p in hist] == [4, 8, 12, 14, 16, 20, 24, 27]
    assert hist[-1]["bytes"] == comm["train_bytes_sent_total"]
    assert all(a["bytes"] < b["bytes"] for a, b in zip(hist, hist[1:]))
    acc = EventAccumulator(str(tb))
    acc.Reload()

    def curve(tag):
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    loss = [p["batch_loss"] for p in hist]
    assert [s for s, _ in curve("fdskl/batch_loss")] == [p["iteration"] for p in hist]
    assert [s for s, _ in curve("fdskl_vs_kbytes/batch_loss")] == [p["bytes"] // 1024 for p in hist]
    assert [v for _, v in curve("fdskl_vs_kbytes/batch_loss")] == pytest.approx(loss, rel=1e-6)
    # Held-out values (opened at the epoch end and the end only, under shared) against their points' bytes.
    opened = [p for p in hist if "test_error" in p]
    assert [p["iteration"] for p in opened] == [14, 27]
    assert curve("fdskl_vs_kbytes/test_error") == [(p["bytes"] // 1024, pytest.approx(p["test_error"])) for p in opened]
