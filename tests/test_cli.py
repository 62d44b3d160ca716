"""The `vfl` command: help, JSON record, torchrun equivalence, bad input."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vfltorch.cli import main

VENV_BIN = Path(sys.executable).parent


def run_vfl(*args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "vfltorch", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def test_help_lists_the_common_options():
    out = run_vfl("inspect", "--help").stdout
    for option in ("--dataset", "--test-dataset", "--parties", "--seed", "--device", "--backend", "--data-dir",
                   "--logdir", "--output-json", "--timeout", "--partition"):
        assert option in out, option
    top = run_vfl("--help").stdout
    assert "inspect" in top and "datasets" in top


def test_inspect_writes_the_json_record(tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["inspect", "--parties", "2", "--output-json", str(path), "--quiet",
                 "--logdir", str(tmp_path / "tb")]) == 0
    record = json.loads(path.read_text())
    for key in ("method", "dataset", "parties", "metrics", "train_seconds", "comm", "config"):
        assert key in record
    assert record["parties"] == 2 and set(record["comm"]) == {"0", "1"}
    assert record["comm"]["1"]["bytes_sent"] > 0
    assert all(isinstance(v, float) for v in record["metrics"].values())
    assert any((tmp_path / "tb").iterdir())


@pytest.mark.skipif(shutil.which("torchrun", path=str(VENV_BIN)) is None and shutil.which("torchrun") is None,
                    reason="torchrun not installed")
def test_torchrun_and_spawned_parties_agree(tmp_path):
    torchrun = shutil.which("torchrun", path=str(VENV_BIN)) or shutil.which("torchrun")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["inspect", "--partition", "random", "--normalize-rows", "--quiet"]
    r1 = run_vfl(*args, "--parties", "4", "--output-json", str(a))
    assert r1.returncode == 0, r1.stderr
    r2 = subprocess.run([torchrun, "--nproc_per_node", "4", "-m", "vfltorch", *args, "--output-json", str(b)],
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ja["metrics"] == jb["metrics"]
    assert {k: v["bytes_sent"] for k, v in ja["comm"].items()} == {k: v["bytes_sent"] for k, v in jb["comm"].items()}


@pytest.mark.parametrize("args,message", [
    (["--dataset", "nope"], "unknown dataset 'nope'"),
    (["--parties", "0"], "--parties must be at least 1"),
    (["--backend", "mpi"], "no MPI support"),
    (["--device", "cuda"], "no CUDA device"),
    (["--dataset", "a9a", "--data-dir", "/nonexistent"], "is not a directory"),
])
def test_bad_input_gets_a_clear_message(args, message):
    import torch.distributed as dist
    import torch

    if "mpi" in args and dist.is_mpi_available():
        pytest.skip("this torch has MPI")
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run_vfl("inspect", *args, "--parties" if "--parties" not in args else "--quiet",
                *(["2"] if "--parties" not in args else []))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_more_parties_than_features(tmp_path):
    (tmp_path / "two.csv").write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    r = run_vfl("inspect", "--dataset", str(tmp_path / "two.csv"), "--label-column", "y", "--parties", "3")
    assert r.returncode == 2 and "3 parties but only 2 features" in r.stderr, r.stderr


def test_command_check_runs_before_any_party_starts(monkeypatch, capsys):
    """A Command's check() rejects a bad option combination in the launcher, before spawning."""
    import vfltorch.cli as cli
    from vfltorch.comm import launcher
    from vfltorch.data import VFLInputError

    def check(args):
        if args.parties == 5:
            raise VFLInputError("five parties are not allowed here: use --parties 2")

    def never(*a, **k):
        raise AssertionError("a party was started although check() rejected the options")

    fake = cli.Command("fake", "test command", run=lambda fed, data, args, log: {}, check=check)
    monkeypatch.setattr(cli, "discover_commands", lambda name=None: {"fake": fake})
    monkeypatch.setattr(launcher, "launch", never)
    monkeypatch.setattr("vfltorch.comm.launch", never)
    assert main(["fake", "--parties", "5"]) == 2
    assert "use --parties 2" in capsys.readouterr().err
