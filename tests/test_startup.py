"""Fast and early: help and option errors import no method; launch() from python -c; the parser's choices
and the registry's shapes agree with the library and the data.

Speed itself is measured by benchmarks/startup.py, not here.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import needs_dataset

HEAVY = ("torch", "opacus", "pandas", "tensorboard", "sklearn", "scipy")


def test_method_help_imports_no_heavy_module():
    """`vfl --help` and `vfl METHOD --help` for every method import none of torch, opacus, pandas, ..."""
    code = textwrap.dedent(f"""
        import json, sys
        from vfltorch.cli import COMMAND_INDEX, main
        seen = {{}}
        for argv in [["--help"]] + [[name, "--help"] for name in COMMAND_INDEX]:
            try:
                main(argv)
            except SystemExit:
                pass
            seen[" ".join(argv)] = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print(json.dumps(seen))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in seen.items() if v} == {}, seen
    assert len(seen) >= 9


def test_help_prints_each_default_once():
    """No '(default: ...)' twice, none for flags, none that says None."""
    from vfltorch.cli import COMMAND_INDEX, HelpFormatter, build_parser, discover_commands

    checked = 0
    for name in COMMAND_INDEX:
        commands = discover_commands(name)
        sub = build_parser(commands)._subparsers._group_actions[0].choices[name]
        fmt = HelpFormatter("vfl")
        for action in sub._actions:
            if not action.help:
                continue
            text = fmt._expand_help(action)
            assert text.count("(default:") <= 1, (name, action.option_strings, text)
            assert "(default: None)" not in text and "(default: True)" not in text, (name, text)
            assert "(default: False)" not in text, (name, text)
            checked += 1
    assert checked > 150


def test_parser_choices_equal_the_library():
    """The cli modules declare their choices (no torch import for --help); they must match the library's."""
    from vfltorch.kernels import cli as kcli, losses, random_features
    from vfltorch.linear import cli as lcli, estimator as lest
    from vfltorch.pca import cli as pcli, exact, exchange, kernels as pkernels, merge
    from vfltorch.privacy import accountant, cli as dcli, glm, solver, vertical

    assert kcli.KERNELS == random_features.KERNELS and sorted(kcli.LOSSES) == sorted(losses.LOSSES)
    from vfltorch.kernels import compress as kcompress, shared as kshared
    assert (kcli.SUPPORTS, kcli.PREDICT_RINGS) == (kcompress.SUPPORTS, kshared.PREDICT_RINGS)
    import inspect
    from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor
    for cls in (FDSKLClassifier, FDSKLRegressor):     # the checked compression is the default of both
        assert inspect.signature(cls).parameters["compress_to"].default == kcli.IF_FAITHFUL == kcompress.IF_FAITHFUL
        assert inspect.signature(cls).parameters["sigma_grid"].default == kcli.SIGMA_GRID
    assert (lcli.PROTOCOLS, lcli.OPTIMIZERS, lcli.PRECOMPUTE) == (lest.PROTOCOLS, lest.OPTIMIZERS, lest.PRECOMPUTE)
    assert (lcli.DEFAULT_LR, lcli.DEFAULT_DECAY) == (lest.DEFAULT_LR, lest.DEFAULT_DECAY)
    assert (pcli.TOPOLOGIES, pcli.MERGES, pcli.KERNELS) == (exchange.TOPOLOGIES, sys.modules[
        "vfltorch.pca.merge"].MERGES, pkernels.KERNELS)
    assert (pcli.PROTOCOLS, pcli.SUM_TOPOLOGIES) == (exact.PROTOCOLS, exact.SUM_TOPOLOGIES)
    assert sorted(dcli.TASKS) == sorted(glm.TASKS) and dcli.VARIANTS == solver.VARIANTS
    assert (dcli.MECHANISMS, dcli.DEFAULT_MECHANISM) == (accountant.MECHANISMS, accountant.DEFAULT_MECHANISM)
    assert dcli.PROTOCOLS == vertical.PROTOCOLS
    from vfltorch import cli as vcli
    from vfltorch.data import psi
    assert vcli.PSI_ENGINES == psi.ENGINES
    assert callable(merge)          # the package still exports the function, not the submodule of that name


@pytest.mark.parametrize("name", ["breast_cancer",
                                  pytest.param("sonar", marks=needs_dataset("sonar")),
                                  pytest.param("vehicle", marks=needs_dataset("vehicle")),
                                  pytest.param("yale", marks=needs_dataset("yale"))])
def test_registry_shapes_match_the_data(name):
    from vfltorch.data.registry import SHAPES, load_dataset

    ds = load_dataset(name)
    rows, features, has_test = SHAPES[name]
    assert ds.X.shape == (rows, features) and (ds.X_test is not None) == has_test


def test_launch_from_python_c_runs_a_function_defined_there(tmp_path):
    """A function defined in `python -c` (as in a notebook) runs in real spawned parties (sent by value)."""
    code = textwrap.dedent("""
        from vfltorch.comm import allreduce, launch
        import torch
        def total(fed, scale):
            return float(allreduce(fed, torch.tensor([float(fed.rank + 1)]), "tree")[0]) * scale
        print("RESULT", launch(total, 2, args=(10,)), launch(lambda fed: fed.rank, 2))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "RESULT [30.0, 30.0] [0, 1]" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_launch_from_a_script_without_main_guard_says_what_to_change(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from vfltorch.comm import launch\n\ndef f(fed):\n    return fed.rank\n\n"
                      "print(launch(f, 2, timeout=60))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert f"f is defined in the script {script}" in last and 'if __name__ == "__main__":' in last, r.stderr


def test_datasets_into_a_closed_pipe_prints_no_traceback():
    """`vfl datasets | head -1`: the reader is gone before vfl writes; vfl exits quietly."""
    p = subprocess.Popen([sys.executable, "-m", "vfltorch", "datasets"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                     # no reader left: every write raises EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.slow          # (11 s: a whole run; the help and import tests above keep the start-up guard)
def test_a_run_imports_no_torch_in_the_launching_process(tmp_path):
    """`vfl fdskl` (the demo, 2 parties and the dealer): the launching process imports neither torch nor
    scikit-learn (the fork server does, once; the store and FDSKL's check run in processes forked from it), and
    an option an estimator check rejects (FDSKL's, PCA's) still answers with exit code 2 before any party
    starts."""
    code = textwrap.dedent("""
        import json, sys
        from vfltorch.cli import main
        rc = main(sys.argv[1:])
        print("RESULT", json.dumps([rc, sorted(m for m in %r if m in sys.modules)]))
    """ % (HEAVY,))
    run = ["fdskl", "--parties", "2", "--epochs", "0.2", "--n-components", "64", "--quiet",
           "--output-json", str(tmp_path / "r.json")]
    r = subprocess.run([sys.executable, "-c", code, *run], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert "RESULT [0, []]" in r.stdout, r.stdout + r.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["parties"] == 2 and record["metrics"]["test_accuracy"] > 0.8, record["metrics"]
    r = subprocess.run([sys.executable, "-c", code, "fdskl", "--gamma", "-1"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert "RESULT [2, []]" in r.stdout, r.stdout + r.stderr
    assert r.stderr.strip() == "vfl: error: gamma (the step size) must be > 0, got -1.0", r.stderr
    r = subprocess.run([sys.executable, "-c", code, "pca", "--method", "vfedpca", "--kernel", "rbf"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)     # PCA's Command.server_check
    assert "RESULT [2, []]" in r.stdout, r.stdout + r.stderr
    assert "--kernel rbf is for --method akpca or exact; vfedpca is linear" in r.stderr, r.stderr


def test_spawned_parties_use_a_store_in_the_launching_process(tmp_path):
    """VFLTORCH_START_METHOD=spawn: no fork server to host the store; the launcher hosts it (loopback only) and
    the parties still rendezvous and reduce."""
    code = textwrap.dedent("""
        import os
        from vfltorch.comm import allreduce, launch
        import torch
        def total(fed):
            return float(allreduce(fed, torch.tensor([float(fed.rank + 1)]), "tree")[0])
        print("RESULT", launch(total, 2))
    """)
    env = {**os.environ, "VFLTORCH_START_METHOD": "spawn"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=env)
    assert "RESULT [3.0, 3.0]" in r.stdout, r.stdout + r.stderr


def test_a_party_hung_in_its_start_up_is_named_not_waited_for(tmp_path):
    """A party process that never connects (here: its interpreter sleeps before running anything of ours, as a
    fork server that never ran its children did once) makes launch() stop every party and say which one, after
    the join timeout and START_GRACE, instead of waiting for results forever."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys, time
        if "--multiprocessing-fork" in sys.argv:        # a spawned party process, not the launcher
            time.sleep(600)
    """))
    code = textwrap.dedent("""
        import time
        from vfltorch.comm import launch, launcher
        from vfltorch.comm.errors import FederationError
        def rank(fed):
            return fed.rank
        if __name__ == "__main__":
            launcher.START_GRACE = 3.0
            started = time.monotonic()
            try:
                launch(rank, 2, join_timeout=2.0)
            except FederationError as exc:
                print("ERROR", exc)
            print("SECONDS", round(time.monotonic() - started))
    """)
    (tmp_path / "hang.py").write_text(code)
    env = {**os.environ, "VFLTORCH_START_METHOD": "spawn",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "hang.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=env)
    out = r.stdout + r.stderr
    assert "did not join the federation within 5 s" in r.stdout, out
    assert "VFLTORCH_START_METHOD=spawn" in r.stdout, out
    assert int(r.stdout.split("SECONDS")[1]) < 30, out


def test_the_public_api_imports_from_the_package_and_import_vfltorch_needs_no_torch():
    code = textwrap.dedent("""
        import sys, vfltorch
        before = "torch" in sys.modules
        from vfltorch import (FDSKLClassifier, FDSKLRegressor, HeteroLogisticRegression, DPSCD, DPSGD, VFedPCA,
                              VFedAKPCA, ExactFederatedPCA, ExactFederatedKernelPCA, RandomFeatureKernelPCA,
                              launch, init_from_env, connect_federation, Federation, DataConfig, load_party_data,
                              load_dataset)
        assert set(vfltorch.__all__) >= {"FDSKLClassifier", "launch", "load_dataset", "__version__"}
        print(before, FDSKLClassifier.__module__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "vfltorch.kernels.estimator"]
