"""`vfl dpscd` and `vfl dpsgd`: JSON record, TensorBoard curves, DP-SGD through opacus, bad input."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import MaxAbsScaler, normalize

from vfltorch.cli import build_parser, main
from vfltorch.data import VFLInputError
from vfltorch.privacy import DPSGD
from vfltorch.privacy.cli import COMMANDS


def scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_dpscd_across_two_parties_writes_the_record_and_the_curves(tmp_path):
    out, tb = tmp_path / "dpscd.json", tmp_path / "tb"
    assert main(["dpscd", "--parties", "2", "--task", "logistic", "--epsilon", "2", "--L", "20", "--C", "0.2",
                 "--lambda", "1e-2", "--epochs", "3", "--accountant", "rdp", "--output-json", str(out),
                 "--logdir", str(tb), "--quiet"]) == 0
    record = json.loads(out.read_text())
    for key in ("sigma", "sample_rate", "steps", "epsilon", "delta"):
        assert isinstance(record[key], (int, float)), key
    assert 0 < record["epsilon"] <= 2.0 and record["delta"] == 1e-3 and record["accountant"] == "rdp"
    assert record["sample_rate"] == pytest.approx(20 / 427) and record["steps"] == round(3 * 427 / 20)
    assert record["noise_std"] == pytest.approx(record["sigma"] * np.sqrt(2) * 0.2)
    assert record["config"]["scale"] == "standard" and record["config"]["normalize_rows"] is True
    assert set(record["metrics"]) >= {"test_accuracy", "test_auc"}
    assert not any("objective" in k for k in record["metrics"])          # not private: only when asked for
    assert record["comm"]["1"]["phases"]["dpscd/margins"]["bytes_sent"] > 0
    # The default vertical protocol: a dealer (rank 2, started by the CLI) instead of Paillier.
    assert record["comm"]["1"]["phases"]["dpscd/shared-updates"]["bytes_sent"] > 0
    assert record["comm"]["2"]["phases"]["dpscd/shared-updates"]["bytes_sent"] > 0
    # Secret randomness: no seed is the schedule's source; epsilon per observer; the guarantee stands.
    assert record["vertical_protocol"] == "shared" and record["randomness"].startswith("os entropy")
    assert record["dp_guarantee"].startswith("holds")
    observers = record["epsilon_by_observer"]
    assert observers["outsider"]["epsilon"] == record["epsilon"]
    assert record["epsilon"] < observers["passive_party"]["epsilon"] < float("inf")
    curves = scalars(tb)
    assert not any("objective" in tag for tag in curves)
    eps = [v for _, v in curves["privacy/epsilon_spent"]]
    assert [s for s, _ in curves["privacy/epsilon_spent"]] == [1, 2, 3]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(record["epsilon"], rel=1e-6)


def test_default_runs_differ_and_a_simulation_says_its_guarantee_is_void(tmp_path, capsys):
    common = ["dpscd", "--parties", "1", "--task", "svm", "--epsilon", "1", "--L", "20", "--C", "0.05",
              "--epochs", "2", "--accountant", "rdp", "--quiet"]
    runs = []
    for k in range(2):
        out = tmp_path / f"run{k}.json"
        assert main([*common, "--output-json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0]["metrics"]["test_loss"] != runs[1]["metrics"]["test_loss"]
    assert runs[0]["config"]["simulate_seed"] is None and "seed" not in runs[0]["randomness"]
    out, tb = tmp_path / "sim.json", tmp_path / "tb"
    with pytest.warns(UserWarning, match="VOID"):
        assert main([*common, "--simulate-seed", "4", "--output-json", str(out), "--logdir", str(tb)]) == 0
    record = json.loads(out.read_text())
    assert record["dp_guarantee"].startswith("VOID") and record["randomness"].startswith("simulation seed")
    assert "guarantee is VOID" in capsys.readouterr().err
    curves = scalars(tb)
    ours = [tag for tag in curves if not tag.startswith("comm/")]      # comm/ is the CLI's byte count
    assert "SIMULATION-DP-VOID/guarantee_void" in ours and "SIMULATION-DP-VOID/privacy/epsilon_spent" in ours
    assert all(tag.startswith("SIMULATION-DP-VOID/") for tag in ours)


def test_dpsgd_baseline_runs_opacus_and_meets_the_budget(tmp_path):
    out = tmp_path / "dpsgd.json"
    assert main(["dpsgd", "--task", "svm", "--epsilon", "1", "--batch-size", "50", "--C", "1", "--lr", "0.5",
                 "--epochs", "2", "--output-json", str(out), "--quiet"]) == 0     # one party by default
    record = json.loads(out.read_text())
    assert record["parties"] == 1 and record["variant"] == "dpsgd"
    assert 0.9 < record["epsilon"] <= 1.0 and record["sigma"] > 0 and record["dp_guarantee"].startswith("holds")
    assert record["steps"] == 2 * int(np.ceil(427 / 50)) and record["sample_rate"] == pytest.approx(1 / 9)


def test_dpsgd_estimator_matches_sgd_without_noise_and_reports_epsilon():
    bc = load_breast_cancer()
    X, y = normalize(MaxAbsScaler().fit_transform(bc.data)), np.where(bc.target == 0, 1, -1)
    private = DPSGD(task="logistic", epsilon=0.5, batch_size=40, C=1.0, lr=1.0, lam=1e-3, epochs=3).fit(X, y)
    assert private.epsilon_ <= 0.5 and [h["epoch"] for h in private.history_] == [1, 2, 3]
    assert all("objective" not in h for h in private.history_)
    # Secret noise and batches: two runs differ; a simulation replays, and says its guarantee is void.
    again = DPSGD(task="logistic", epsilon=0.5, batch_size=40, C=1.0, lr=1.0, lam=1e-3, epochs=3).fit(X, y)
    assert (again.coef_ != private.coef_).all() and not private.guarantee_void_
    with pytest.warns(UserWarning, match="VOID"):
        sims = [DPSGD(task="logistic", epsilon=0.5, batch_size=40, C=1.0, lr=1.0, lam=1e-3, epochs=3,
                      simulation_seed=9).fit(X, y) for _ in range(2)]
    np.testing.assert_array_equal(sims[0].coef_, sims[1].coef_)
    assert sims[0].guarantee_void_
    # (seeded batches: from OS entropy the fit scored 0.880-0.931 in 80 fits here and 0.828 once in CI; the bound is
    # the test's, the seed takes the chance out of it; no privacy is claimed without noise, so nothing is voided)
    plain = DPSGD(task="logistic", private=False, batch_size=40, lr=5.0, lam=1e-3, epochs=10,
                  simulation_seed=0).fit(X, y)
    assert plain.epsilon_ is None and plain.score(X, y) > 0.85


def test_dpsgd_calibrates_for_the_sampling_rate_opacus_records():
    # 468 rows in 117 plain batches of 4: opacus' Poisson loader takes int(1 / (1 / 117)) = 116 steps per epoch
    # and its accountant records q = 1/116. Calibrating for 1/117 and 117 steps would overspend the budget.
    bc = load_breast_cancer()
    X, y = normalize(MaxAbsScaler().fit_transform(bc.data))[:468], np.where(bc.target == 0, 1, -1)[:468]
    model = DPSGD(task="svm", epsilon=0.1, batch_size=4, C=1.0, lr=0.1, lam=1e-3, epochs=1, monitor_every=0).fit(X, y)
    assert model.sample_rate_ == 1 / 116 and model.steps_ == 116
    assert 0.099 < model.epsilon_ <= 0.1          # empty batches take their noisy step too
    assert np.isfinite(model.coef_).all()


def test_help_names_the_models_and_the_paper_options():
    parser = build_parser({c.name: c for c in COMMANDS})
    sub = parser._subparsers._group_actions[0].choices["dpscd"]
    text = sub.format_help()
    for option in ("--task", "ridge", "logistic", "svm", "--variant", "--epsilon", "--delta", "--L", "--C",
                   "--lambda", "--epochs", "--accountant", "--normalize-rows", "--simulate-seed", "--secure-sum",
                   "--vertical-protocol", "--monitor-objective"):
        assert option in text, option
    args = parser.parse_args(["dpscd", "--task", "svm"])
    assert args.glm == "svm" and args.task is None and args.scale == "standard" and args.normalize_rows
    # Privacy defaults: PRV, OS entropy (no simulation seed), the shared protocol (a dealer), no objective.
    assert args.accountant == "prv" and args.simulate_seed is None and args.vertical_protocol == "shared"
    assert not args.monitor_objective


@pytest.mark.parametrize("argv,message", [
    (["--epsilon", "0"], "epsilon must be a positive number"),
    (["--delta", "1"], "delta must lie strictly between 0 and 1"),
    (["--L", "100000"], "exceeds the 427 training rows"),
    (["--C", "0"], "clipping bound C must be a positive number"),
    (["--no-normalize-rows", "--scale", "none"], "norm at most 1.*--normalize-rows"),
    (["--epsilon", "1e-7", "--delta", "1e-12", "--L", "427", "--epochs", "50000"], "cannot be reached"),
    (["--task", "ridge", "--dataset", "no_such_data"], "unknown dataset"),
])
def test_bad_input_exits_with_a_message(capsys, argv, message):
    assert main(["dpscd", "--parties", "1", "--quiet", *argv]) == 2
    import re

    assert re.search(message, capsys.readouterr().err), message


def test_dpsgd_refuses_several_parties():
    from vfltorch.privacy.cli import _dpsgd

    fed = SimpleNamespace(num_parties=3)
    with pytest.raises(VFLInputError, match="--parties 1"):
        _dpsgd(fed, None, SimpleNamespace(), None)


def test_logistic_needs_binary_labels():
    from vfltorch.privacy.cli import resolve_task

    assert resolve_task(None, "regression") == "ridge" and resolve_task(None, "binary") == "logistic"
    with pytest.raises(VFLInputError, match="--task svm needs binary labels"):
        resolve_task("svm", "regression")
