"""``vfl hetero-lr`` end to end: JSON record, TensorBoard curves, the insecure-plaintext label, bad options."""

import json

import pytest

from vfltorch.cli import build_parser, main

BASE = ["hetero-lr", "--dataset", "breast_cancer", "--parties", "2", "--batch-size", "64", "--max-epochs", "2",
        "--quiet", "--seed", "3"]


def test_encrypted_run_writes_metrics_and_curves(tmp_path):
    out, logdir = tmp_path / "run.json", tmp_path / "tb"
    rc = main(BASE + ["--protocol", "paper", "--monitor", "--optimizer", "sqn", "--L", "2", "--key-bits", "512",
                      "--insecure-key", "--crypto-processes", "2", "--output-json", str(out), "--logdir", str(logdir)])
    assert rc == 0
    record = json.loads(out.read_text())
    m = record["metrics"]
    assert m["epochs"] == 2 and m["iterations"] == 2 * 8 and m["rounds"] > m["iterations"]    # + curvature rounds
    assert 0.9 < m["test_auc"] <= 1.0 and 0 < m["train_loss"] < 0.6931
    assert m["bytes_per_epoch"] == pytest.approx(sum(m[f"bytes_per_epoch_rank{r}"] for r in range(3)))
    assert m["bytes_per_epoch_rank0"] > 10 * m["bytes_per_epoch_rank2"]    # ciphertexts vs the coordinator's replies
    assert m["seconds_per_epoch"] > 0
    assert record["encryption"] == "paillier (512-bit keys, djn obfuscators, 2 crypto processes)"
    assert record["privacy"].startswith("paper protocol")
    assert m["wall_seconds_per_epoch"] >= m["seconds_per_epoch"]
    assert record["config"]["coordinator"] == 2 and record["config"]["world_size"] == 3
    lr = record["hetero_lr"]
    assert lr["roles"] == {"0": "guest", "1": "host", "2": "coordinator"}
    assert len(lr["history"]) == 2 and lr["history"][-1]["test_auc"] is not None
    assert lr["curvature_pairs"] >= 1
    assert {t["role"] for t in lr["timings"]} == {"guest", "host", "coordinator"}
    assert any(p.name.startswith("events.out.tfevents") for p in logdir.iterdir())


def test_plaintext_mode_is_labelled_insecure(tmp_path, capfd):
    out = tmp_path / "plain.json"
    rc = main(BASE + ["--protocol", "paper", "--optimizer", "sgd", "--insecure-plaintext", "--max-epochs", "1",
                      "--crypto-processes", "1",
                      "--mask-seed", "4", "--output-json", str(out)])
    assert rc == 0
    record = json.loads(out.read_text())
    assert record["encryption"] == "none (INSECURE plaintext mode)"
    assert record["privacy"].startswith("void: SIMULATION")
    err = capfd.readouterr().err
    assert "INSECURE plaintext mode" in err
    assert "reveals the labels" in err and "SIMULATION mode" in err         # the paper protocol and seeded masks


def test_defaults_run_the_shared_protocol_on_two_parties(tmp_path, capfd):
    # No options but the dataset: 2 data parties, batch min(1000, 455 rows), no monitoring, shared model.
    out = tmp_path / "default.json"
    rc = main(["hetero-lr", "--dataset", "breast_cancer", "--max-epochs", "2", "--quiet", "--output-json", str(out)])
    assert rc == 0
    record = json.loads(out.read_text())
    assert record["config"]["world_size"] == 3
    assert record["encryption"].startswith("additive secret sharing")
    lr = record["hetero_lr"]
    assert lr["protocol"] == "shared" and all(h["test_auc"] is None for h in lr["history"])
    m = record["metrics"]
    assert m["iterations"] == 2 and 0.9 < m["test_auc"] <= 1.0       # one batch of all 455 rows per epoch
    err = capfd.readouterr().err
    assert "PAPER protocol" not in err and "SIMULATION" not in err


@pytest.mark.parametrize("argv,message", [
    (["--parties", "3"], "--protocol shared runs between one guest and one host"),
    (["--monitor"], "the shared protocol refuses it"),
    (["--insecure-plaintext"], "add --protocol paper"),
])
def test_shared_protocol_refuses_what_it_cannot_do(argv, message, capfd):
    assert main(["hetero-lr", "--dataset", "breast_cancer", "--quiet"] + argv) == 2
    assert message in capfd.readouterr().err


@pytest.mark.parametrize("option,value,message", [
    ("--lr", "0", "--lr must be > 0, got 0"), ("--L", "0", "--L must be > 0"), ("--M", "-1", "--M must be > 0"),
    ("--batch-size", "0", "--batch-size must be > 0"), ("--l2", "-1", "--l2 must be >= 0, got -1"),
])
def test_bad_options_are_refused_before_anything_starts(option, value, message, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["hetero-lr", option, value])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
