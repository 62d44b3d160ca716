"""Every script in examples/ runs and prints what it promises (issue 37: the examples cannot drift)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXPECT = {"python_api.py": "FDSKLClassifier: test accuracy", "dpscd_budget.py": "epsilon spent",
          "pca.py": "federated == pooled: True", "two_parties.py": "federated test accuracy: 0.9"}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH")] if p)}
    r = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, env=env,
                       cwd=EXAMPLES.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert EXPECT[name] in r.stdout, r.stdout
