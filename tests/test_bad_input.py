"""Every bad input gets an exact message, and mistakes the launcher can see are answered before any party starts.

Each row of the table is a `vfl` command line (run in this process, with the party launcher replaced by a
trap) and a fragment of the one-line message it must print. Nothing here spawns a party: the preflight
(`vfltorch.data.preflight`) answers every case in the launching process.
"""

import gzip
import json
import os
import sys

import pytest

import vfltorch.comm
from vfltorch.cli import main

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def no_parties(monkeypatch):
    """Fail the test if a party process would be started."""
    def never(*args, **kwargs):
        raise AssertionError("a party was started although the input is bad")
    monkeypatch.setattr(vfltorch.comm, "launch", never)
    monkeypatch.setattr(vfltorch.comm.launcher, "launch", never)


def _files(d):
    """The defective files of the table, by name."""
    def w(name, text):
        (d / name).write_text(text)
        return str(d / name)
    f = {
        "empty": w("empty.csv", ""),
        "header": w("header.csv", "a,b,y\n"),
        "one_row": w("one.csv", "a,b,y\n1,2,0\n"),
        "text": w("text.csv", "a,b,y\n1,2,0\n3,x,1\n5,6,0\n"),
        "nan": w("nan.csv", "a,b,y\n1,2,0\n3,,1\n5,6,0\n7,8,1\n"),
        "inf": w("inf.csv", "a,b,y\ninf,2,0\n3,4,1\n5,6,0\n7,8,1\n"),
        "huge": w("huge.csv", "a,b,y\n1,2,0\n3,1e308,1\n5,6,0\n7,8,1\n"),
        "ragged": w("ragged.csv", "a,b,y\n1,2,0\n3,4,1,9,9\n5,6,0\n"),
        "one_class": w("oneclass.csv", "a,b,y\n1,2,1\n3,4,1\n5,6,1\n7,8,1\n9,1,1\n2,2,1\n"),
        "three": w("three.csv", "a,b,y\n1,2,0\n3,4,1\n5,6,2\n7,8,1\n9,1,0\n2,2,2\n"),
        "text_labels": w("textlab.csv", "a,b,y\n1,2,cat\n3,4,dog\n5,6,cow\n7,8,dog\n"),
        "real_labels": w("real.csv", "a,b,y\n1,2,0.5\n3,4,1.25\n5,6,2.75\n7,8,3.5\n9,1,0.1\n"),
        "no_label": w("nolabel.csv", "a,b,y\n1,2,0\n3,4,\n5,6,1\n7,8,0\n"),
        "two_cols": w("two.csv", "a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n"),
        "bad_svm": w("bad.svm", "1 1:0.5 2:x\n-1 1:0.2\n"),
        "ids_a": w("ida.csv", "id,a,y\n1,1,0\n2,3,1\n3,5,0\n"),
        "ids_b": w("idb.csv", "id,b\n1,2\n2,4\n3,6\n"),
        "dir": str(d),
        "missing": str(d / "missing.csv"),
        "a_file": w("plain.txt", "x"),
    }
    good = gzip.compress(b"a,b,y\n" + b"1,2,0\n3,4,1\n" * 500)
    (d / "cut.csv.gz").write_bytes(good[:len(good) // 2])                        # truncated download
    f["cut_gz"] = str(d / "cut.csv.gz")
    (d / "broken.csv.gz").write_bytes(good[:20] + bytes(64) + good[84:])          # damaged in the middle
    f["corrupt_gz"] = str(d / "broken.csv.gz")
    (d / "locked.csv").write_text("a,b,y\n1,2,0\n3,4,1\n")
    os.chmod(d / "locked.csv", 0)
    f["locked"] = str(d / "locked.csv")
    return f


# (command line with {file} placeholders, message fragment)
CASES = [
    # ---- option values
    ("inspect --parties 0", "--parties must be at least 1, got 0"),
    ("inspect --parties -3", "--parties must be at least 1, got -3"),
    ("inspect --parties x", "argument --parties: invalid int value: 'x'"),
    ("inspect --timeout 0", "--timeout must be a positive number of seconds, got 0"),
    ("inspect --timeout -5", "--timeout must be a positive number of seconds, got -5"),
    ("inspect --timeout nan", "--timeout must be a positive number of seconds, got nan"),
    ("inspect --test-fraction 1", "--test-fraction must be in [0, 1), got 1"),
    ("inspect --test-fraction -0.1", "--test-fraction must be in [0, 1), got -0.1"),
    ("inspect --clip-values 0", "--clip-values must be a positive number, got 0"),
    ("inspect --seed -1", "--seed must be a non-negative integer below 2**63, got -1"),
    ("inspect --scale loud", "argument --scale: invalid choice: 'loud'"),
    ("inspect --device tpu", "--device must be cpu or cuda[:N], got 'tpu'"),
    ("fdskl --epochs x", "argument --epochs: invalid float value: 'x'"),
    ("hetero-lr --batch-size 0", "--batch-size must be > 0, got 0"),
    ("hetero-lr --key-bits 512", "a 512-bit Paillier key is too small"),
    ("hetero-lr --key-bits 1025", "--key-bits 1025: the key size must be even"),
    ("dpsgd --parties 3", "vfl dpsgd is the centralised DP-SGD baseline"),
    # ---- each method's own options (Command.check: the estimator / configuration the run would build)
    ("fdskl --gamma -1", "gamma (the step size) must be > 0, got -1.0"),
    ("fdskl --epochs 0", "epochs must be > 0, got 0.0"),
    ("fdskl --batch-size 0", "batch_size must be a positive integer, got 0"),
    ("fdskl --parties 40", "40 parties but only 30 features in breast_cancer"),
    ("dpscd --epochs -1", "epochs must be positive, got -1.0"),
    ("dpscd --epsilon 0", "epsilon must be a positive number, got 0.0"),
    ("dpscd --delta 1", "delta must lie strictly between 0 and 1, got 1.0"),
    ("dpscd --C 0", "the clipping bound C must be a positive number, got 0.0"),
    ("dpscd --lambda 0", "the regularisation lambda must be positive, got 0.0"),
    ("dpscd --variant seq --sampling poisson", "seqDP-SCD needs fixed-size lots (--sampling shuffle)"),
    ("dpscd --L 1000", "the mini-batch size L=1000 exceeds the 427 training rows: pass --L 427 or less"),
    ("dpscd --variant primal --parties 2", "primal DP-SCD cannot run across parties"),
    ("dpscd --vertical-protocol encrypted --key-bits 512 --parties 2",
     "--key-bits 512: a 512-bit Paillier key is too small"),
    ("dpscd --vertical-protocol encrypted --key-bits 1025", "--key-bits 1025: the key size must be even"),
    ("dpscd --variant seq --parties 2", "only DP-SCD (--variant dual) has the label-safe protocols"),
    ("hetero-lr --batch-size 5000", "batch_size=5000 is larger than the training set (455 rows): use at most 455"),
    ("dpscd --label-scale 0", "--label-scale must be a positive number, got 0"),
    ("dpscd --monitor-every -1", "--monitor-every must be >= 0 (0: only at the end), got -1"),
    ("dpscd --dataset {real_labels} --label-column y --task logistic --parties 2",
     "--task logistic needs binary labels, but the dataset is a regression task"),
    ("dpsgd --batch-size 1000", "the batch size must be an integer in 1..427 (the training rows), got 1000"),
    ("dpsgd --lr 0", "the learning rate and lambda must be positive, got lr=0.0"),
    ("dpsgd --epochs 0", "epochs must be a positive integer for DP-SGD, got 0"),
    ("dpsgd --epsilon -1", "epsilon must be a positive number, got -1.0"),
    ("pca --components 0", "--components must be a positive integer, got 0"),
    ("pca --components 31 --method exact", "--components 31 but breast_cancer has 30 columns"),
    ("pca --method vfedpca --kernel rbf", "--kernel rbf is for --method akpca or exact; vfedpca is linear"),
    ("pca --periods 0", "--periods must be a positive integer, got 0"),
    ("pca --method exact --tol 0", "--tol must be a positive number"),
    ("pca --parties 40", "40 parties but only 30 features in breast_cancer"),
    ("hetero-lr --parties 3", "--protocol shared runs between one guest and one host: use --parties 2"),
    ("hetero-lr --insecure-plaintext", "--insecure-plaintext runs the paper protocol without encryption"),
    ("hetero-lr --lr 0", "argument --lr: --lr must be > 0, got 0"),
    # ---- issue 36: values that failed after the start or ran without bound
    ("fdskl --epochs inf", "epochs must be a finite number, got inf"),
    ("fdskl --time-budget inf", "max_time (the time budget in seconds) must be a finite number, got inf"),
    ("fdskl --compress-epochs inf", "compress_epochs must be a number >= 0; got inf"),
    ("fdskl --n-components 1000000000", "n_components 1000000000 is beyond the 1048576 random features"),
    ("dpscd --epochs inf", "epochs must be positive, got inf"),
    # ---- party layout
    ("inspect --parties 40", "40 parties but only 30 features in breast_cancer"),
    ("inspect --dataset {two_cols} --label-column y --parties 3", "3 parties but only 2 features"),
    ("inspect --partition explicit --parties 2", "--partition explicit needs --feature-groups"),
    ("inspect --feature-groups 0-9;x --parties 2", "cannot read feature group item 'x'"),
    ("inspect --feature-groups 0-9;10-29 --parties 3", "--feature-groups gives 2 groups for 3 parties"),
    ("inspect --feature-groups 0-9;10-40 --parties 2", "party 1 has column indices outside 0..29"),
    ("inspect --feature-groups 0-9;12-29 --parties 2", "columns [10, 11] belong to no party"),
    ("inspect --feature-groups 0-15;10-29 --parties 2", "are assigned to more than one party"),
    ("inspect --aligned-rows rows.csv", "--aligned-rows reuses the alignment of --party-files"),
    ("inspect --party-files {ids_a} {ids_b} --parties 2", "--party-files needs --id-column"),
    ("inspect --party-files {ids_a} --id-column id --parties 2", "--party-files gives 1 files for --parties 2"),
    ("inspect --party-files {ids_a} {ids_b} --id-column id --parties 2 --feature-groups 0;1",
     "with --party-files each party's file is its columns"),
    ("inspect --party-files {ids_b} {ids_a} --id-column id --label-column y --parties 2",
     "idb.csv: no label column 'y'"),
    # ---- dataset names and options for own files
    ("inspect --dataset nope", "unknown dataset 'nope': not a registered name"),
    ("inspect --dataset {missing}", "missing.csv': not a registered name"),
    ("inspect --dataset a9a --data-dir /nonexistent", "--data-dir /nonexistent is not a directory"),
    ("inspect --positive-label 1", "--positive-label is for your own files; the registered dataset"),
    ("inspect --task regression", "--task is for your own files"),
    ("inspect --test-dataset {two_cols}", "--test-dataset is for your own files"),
    # ---- output paths, checked before training
    ("inspect --output-json {dir}", "is a directory: give a file path"),
    ("inspect --output-json {a_file}/out.json", "plain.txt is a file, so no folder can be made under it"),
    ("inspect --logdir {a_file}", "plain.txt is a file, not a directory"),
    # ---- file defects
    ("inspect --dataset {empty}", "empty.csv is empty (0 bytes)"),
    ("inspect --dataset {header} --label-column y", "header.csv has a header (a, b, y) but no data rows"),
    ("inspect --dataset {one_row} --label-column y --parties 2", "one.csv has only 1 data row"),
    ("inspect --dataset {text} --label-column y --parties 2", "text.csv: column 'b' is not numeric: line 3 holds 'x'"),
    ("inspect --dataset {nan} --label-column y --parties 2",
     "nan.csv: column 'b' holds a missing value (NaN) (nan) at line 3: pass --impute median"),
    ("inspect --dataset {inf} --label-column y --parties 2", "inf.csv: column 'a' holds an infinite value (inf) at line 2"),
    ("inspect --dataset {huge} --label-column y --parties 2", "huge.csv: column 'b' holds a value beyond +-1e+100"),
    ("inspect --dataset {ragged} --label-column y", "ragged.csv is not a well-formed CSV file"),
    ("inspect --dataset {corrupt_gz} --label-column y", "broken.csv.gz cannot be read as gzip-compressed data"),
    ("inspect --dataset {cut_gz} --label-column y", "cut.csv.gz cannot be read as gzip-compressed data"),
    ("inspect --dataset {bad_svm}", "bad.svm is not a valid LIBSVM/svmlight file"),
    ("inspect --dataset {dir}", "is a directory: give the path of a LIBSVM or CSV file"),
    ("inspect --dataset {two_cols} --label-column z", "two.csv: no label column 'z'; the columns are ['a', 'b', 'y']"),
    # ---- label defects
    ("inspect --dataset {one_class} --label-column y --parties 2",
     "column 'y' of {one_class} holds a single value (1) in all 6 rows: there is nothing to learn"),
    ("hetero-lr --dataset {real_labels} --label-column y --parties 2",
     "hetero-lr does binary classification; {real_labels} is a regression task"),
    ("dpscd --dataset {text_labels} --label-column y --parties 2", "dpscd does binary classification and regression"),
    ("inspect --dataset {three} --label-column y --positive-label 7 --parties 2",
     "--positive-label '7' is not one of the label values in column 'y' of {three}: 0, 1, 2"),
    ("inspect --dataset {three} --label-column y --task binary --parties 2",
     "--task binary needs two label values, but column 'y' of {three} has 3 (0, 1, 2): pass --positive-label"),
    ("inspect --dataset {text_labels} --label-column y --task regression --parties 2",
     "--task regression needs numeric labels"),
    ("inspect --dataset {three} --label-column y --task regression --positive-label 1 --parties 2",
     "--positive-label makes a binary task, but --task regression was given"),
    ("inspect --dataset {no_label} --label-column y --parties 2",
     "1 missing or infinite label(s), the first at line 3"),
    ("inspect --dataset {two_cols} --positive-label 1 --parties 2", "--positive-label needs labels"),
]
if not ROOT:   # root reads and writes anything: permission cases cannot fail there
    CASES += [("inspect --dataset {locked}", "locked.csv cannot be read (permission denied)")]


@pytest.mark.parametrize("line,message", CASES, ids=[c[0][:60] for c in CASES])
def test_bad_input_is_answered_before_any_party_starts(line, message, tmp_path, no_parties, capsys):
    files = _files(tmp_path)
    argv = [a.format(**files) for a in line.split()]
    parsed = True
    try:
        code = main(argv)
    except SystemExit as exc:           # argparse's own option errors: usage, then the error line
        code, parsed = exc.code, False
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert message.format(**files) in lines[-1], err
    assert "Traceback" not in err
    assert len(lines) == 1 or not parsed, err           # one line says what is wrong and what to do


def test_task_is_decided_once_and_said(tmp_path):
    """--positive-label binarises one-vs-rest, explicit --task wins, inference never turns labels into a regressor."""
    from vfltorch.comm import Federation
    from vfltorch.data import DataConfig, load_party_data

    f = _files(tmp_path)
    load = lambda **kw: load_party_data(Federation.local(), DataConfig(label_column="y", test_fraction=0.0, **kw))  # noqa: E731
    d = load(dataset=f["three"], positive_label="1")
    assert d.task == "binary" and sorted(set(d.y_train.tolist())) == [-1.0, 1.0]
    assert (d.y_train > 0).sum() == 2 and "1 positive (+1) vs 0, 2 (-1)" in d.label_note and "2 other values" in d.label_note
    assert load(dataset=f["three"]).task == "multiclass"
    assert load(dataset=f["three"], task="regression").task == "regression"
    assert load(dataset=f["real_labels"]).task == "regression"
    t = load(dataset=f["text_labels"], positive_label="dog")
    assert t.task == "binary" and t.y_train.tolist() == [-1.0, 1.0, -1.0, 1.0]


def test_a_training_split_with_one_class_is_refused(tmp_path):
    from vfltorch.comm import Federation
    from vfltorch.data import DataConfig, VFLInputError, load_party_data, split_rows

    (tmp_path / "rare.csv").write_text("a,y\n" + "".join(f"{i},{int(i == 3)}\n" for i in range(8)))
    seed = next(s for s in range(100) if 3 in split_rows(8, 0.25, s)[1])      # the only positive row is held out
    with pytest.raises(VFLInputError, match="all 6 training rows of rare.csv are negative after the split"):
        load_party_data(Federation.local(), DataConfig(dataset=str(tmp_path / "rare.csv"), label_column="y",
                                                       seed=seed))


def test_json_is_written_atomically_and_never_lost(tmp_path, monkeypatch, capsys):
    from vfltorch import runlog

    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')
    real_replace = os.replace

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.setattr(runlog, "fallback_paths", lambda record: [tmp_path / "fallback.json"])
    with pytest.raises(OSError):
        runlog.write_atomic(out, "{}")
    assert json.loads(out.read_text()) == {"old": True}           # the earlier file is intact
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.setattr(os, "replace", real_replace)
    # The final write fails (the folder is a file): the record goes elsewhere and the message says where.
    (tmp_path / "blocker").write_text("")
    where = runlog.write_json(str(tmp_path / "blocker" / "r.json"), {"method": "m", "metrics": {"a": 1.0}})
    assert where == str(tmp_path / "fallback.json")
    assert json.loads((tmp_path / "fallback.json").read_text())["metrics"] == {"a": 1.0}
    err = capsys.readouterr().err
    assert "could not write --output-json" in err and str(tmp_path / "fallback.json") in err


def test_help_and_option_errors_import_no_method(tmp_path):
    """`vfl --help` and an option error import neither torch nor opacus, pandas or tensorboard."""
    import subprocess

    code = ("import sys\nfrom vfltorch.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'opacus', 'pandas', 'tensorboard', 'sklearn') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr
    code = ("import sys\nfrom vfltorch.cli import main\nassert main(['inspect', '--timeout', '0']) == 2\n"
            "print(sorted(m for m in ('opacus', 'pandas', 'tensorboard') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


# ------------------------------------------------------------------ issue 36: settings, outputs, permissions

@pytest.mark.parametrize("name,value", [("VFLTORCH_TIMEOUT", "nan"), ("VFLTORCH_TIMEOUT", "0"),
                                        ("VFLTORCH_TIMEOUT", "soon"), ("VFLTORCH_WORK_RATE", "0"),
                                        ("VFLTORCH_WORK_RATE", "-1e7"), ("VFLTORCH_WORK_RATE", "inf")])
def test_an_unusable_setting_is_one_line_before_start(name, value, monkeypatch, no_parties, capsys):
    monkeypatch.setenv(name, value)
    code = main(["fdskl", "--parties", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"vfl: error: {name} must be a positive number, got {value!r}: unset it " \
        f"(default {3e7 if 'RATE' in name else 60:g}) or give one", err


def test_many_noisy_steps_are_announced_before_start(monkeypatch, capsys):
    """DP methods with --epochs 100000: minutes of noise calibration before the first step are said first."""
    started = []
    monkeypatch.setattr(vfltorch.comm.launcher, "launch", lambda *a, **k: started.append(1) or [None])
    for method in ("dpscd", "dpsgd"):
        main([method, "--epochs", "100000", "--parties", "1" if method == "dpsgd" else "2"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines and lines[0].startswith("vfl: note: about 427,000 noisy steps: calibrating their noise"), lines
        main([method, "--epochs", "10", "--parties", "1" if method == "dpsgd" else "2"])
        assert "noisy steps" not in capsys.readouterr().err
    assert len(started) == 4


def test_a_port_in_use_is_one_line(tmp_path):
    """Two runs on one rendezvous port (torchrun --master-port, MASTER_PORT): one line, not torch's traceback."""
    import socket
    import subprocess

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        r = subprocess.run([sys.executable, "-m", "vfltorch", "inspect", "--timeout", "10"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"vfl: error: the rendezvous port {port} on 127.0.0.1 is already in use (another run, "
                                f"or another program): give this run its own port (torchrun --master-port PORT, or "
                                f"MASTER_PORT)"), r.stderr


def test_tensorboard_on_a_full_disk_is_one_line_naming_the_folder(tmp_path, monkeypatch, capsys):
    """--logdir whose writes fail mid-run (a full disk, simulated: every write of the event file raises ENOSPC;
    no tmpfs is mounted): one line naming the folder, no thread traceback, and the run goes on."""
    import time

    from tensorboard.compat.tensorflow_stub.io import gfile

    from vfltorch.runlog import RunLog

    log = RunLog(str(tmp_path / "tb"))

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(gfile.GFile, "write", full)
    monkeypatch.setattr(gfile.GFile, "flush", full)
    for step in range(4):
        log.scalar("loss", 1.0, step)
        time.sleep(0.2)
    log.close()
    log.scalar("loss", 1.0, 9)                      # after the failure: nothing, silently
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.strip() == (f"vfl: could not write TensorBoard scalars to --logdir {tmp_path / 'tb'} (OSError: No space "
                           f"left on device); the run goes on without them"), err


def test_what_a_run_writes_is_private(tmp_path, monkeypatch):
    """0600 files and 0700 folders: the JSON record (in folders it makes), the TensorBoard folders and event
    file (the model folder and its shards: tests/test_model_store.py)."""
    import stat

    from vfltorch import runlog

    old = os.umask(0o022)                                     # the usual umask: it would make 0755 and 0644
    try:
        runlog.write_json(str(tmp_path / "out" / "deep" / "r.json"), {"method": "m"})
        log = runlog.RunLog(str(tmp_path / "runs" / "a"))
        log.scalar("x", 1.0, 0)
        log.close()
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)        # noqa: E731
    assert mode(tmp_path / "out") == mode(tmp_path / "out" / "deep") == 0o700
    assert mode(tmp_path / "out" / "deep" / "r.json") == 0o600
    assert mode(tmp_path / "runs") == mode(tmp_path / "runs" / "a") == 0o700
    events = list((tmp_path / "runs" / "a").iterdir())
    assert events and all(mode(e) == 0o600 for e in events), [(e.name, oct(mode(e))) for e in events]


def _save_with_one_failing(fed, root):
    from vfltorch.model_store import save_collective

    if fed.rank == 1:                                          # this party's write fails (its folder is a file)
        import pathlib

        pathlib.Path(root, "party-1").write_text("in the way")
    fed.barrier()
    try:
        save_collective(fed, root, {"method": "test", "parties": fed.num_parties}, {"w": __import__("numpy").ones(3)})
    except Exception as exc:                                   # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "saved"


def test_a_failed_save_leaves_no_shard_behind(tmp_path):
    """One party cannot write its shard: the save fails at every party, and the shards the others did write are
    removed, so no party-* folder of this run blocks the rerun (the preflight refuses a folder holding one)."""
    from vfltorch.comm import launch

    root = tmp_path / "model"
    root.mkdir()
    out = launch(_save_with_one_failing, 2, args=(str(root),))
    assert all(o.startswith("ModelStoreError: ") and "could not write its shard" in o for o in out), out
    assert sorted(p.name for p in root.iterdir()) == ["party-1"]       # only the file that was in the way
    assert (root / "party-1").is_file()
