"""Many threads per party, as on a many-core server (issue 34).

On a 2-core machine each party gets one torch thread, and a thread pool broken by the fork server is never
used; on a 16-core box each party got 4-5 and hung in its first parallel op. VFLTORCH_THREADS forces several
threads per party here, through the default launcher (the fork server), for every method.
"""

import os
import subprocess
import sys

import pytest

from vfltorch.comm import launch

THREADS = "3"


def _parallel_work(fed):
    import torch

    # Above ATen's grain size (32,768 elements), so the op runs in the intra-op pool.
    x = torch.arange(2_000_000, dtype=torch.float64)
    return torch.get_num_threads(), float(torch.cos(x).sum())


@pytest.mark.timeout(120)        # a party hung in its pool is silent: no federation timeout ends it
def test_parties_with_several_threads_run_parallel_ops_after_a_preload_that_ran_one(monkeypatch):
    """vfltorch.kernels.shared builds a 65,536-entry table at import: a parallel op inside the fork server."""
    monkeypatch.setenv("VFLTORCH_THREADS", THREADS)
    out = launch(_parallel_work, parties=2, timeout=60, preload=("vfltorch.kernels.shared",))
    assert [t for t, _ in out] == [int(THREADS)] * 2
    # The same op at each party, to the rounding of a 2M-term sum: the pool's chunks may add in another order
    # (exact equality failed once in a clean-clone run: -0.47764305023 against -0.47764305380).
    assert abs(out[0][1] - out[1][1]) < 1e-6, out


def test_threads_variable_is_checked():
    from vfltorch.comm.start import party_threads

    assert party_threads(4, 2) == 2
    os.environ["VFLTORCH_THREADS"] = "many"
    try:
        with pytest.raises(ValueError, match="VFLTORCH_THREADS must be a whole number"):
            party_threads(2)
    finally:
        del os.environ["VFLTORCH_THREADS"]
    with pytest.raises(ValueError, match="between 1 and 1024"):
        party_threads(2, 0)


# One small run per method through `vfl` and the default launcher; each ends well inside the timeout when the
# parties' pools work (a hang is what this catches).
RUNS = {
    "fdskl": ["fdskl", "--parties", "2", "--epochs", "1"],
    "fdskl-paper": ["fdskl", "--parties", "2", "--epochs", "1", "--protocol", "paper"],
    "fdskl-sealed": ["fdskl", "--parties", "2", "--epochs", "1", "--protocol", "sealed"],
    "pca-exact": ["pca", "--method", "exact", "--parties", "3"],
    "pca-vfedpca": ["pca", "--method", "vfedpca", "--parties", "2"],
    "dpscd": ["dpscd", "--parties", "2", "--vertical-protocol", "paper", "--epochs", "2"],
    "dpsgd": ["dpsgd", "--epochs", "1"],
    "hetero-lr": ["hetero-lr", "--parties", "2", "--max-epochs", "3"],
    "hetero-lr-paper": ["hetero-lr", "--parties", "2", "--protocol", "paper", "--key-bits", "1024", "--max-epochs", "2"],
}


# Three in the default run (the flagship's two protocols' launcher path, a coordinator method with Paillier);
# the others are `slow` (about 10 s each on 2 cores).
DEFAULT_RUNS = {"fdskl", "pca-exact", "hetero-lr-paper"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n if n in DEFAULT_RUNS else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(RUNS)])
def test_every_method_runs_with_several_threads_per_party(name, tmp_path):
    env = dict(os.environ, VFLTORCH_THREADS=THREADS)
    env.pop("VFLTORCH_START_METHOD", None)                     # the default launcher
    cmd = [sys.executable, "-m", "vfltorch", *RUNS[name], "--dataset", "breast_cancer", "--quiet",
           "--timeout", "60", "--output-json", str(tmp_path / "run.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "run.json").exists()
