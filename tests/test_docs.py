"""The user guide and API reference build with warnings as errors (issue 37): a broken link or anchor, a page
missing from the navigation, or an API entry that no longer resolves fails here, so the docs cannot drift from
the code. The examples the guide points to run in tests/test_examples.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="mkdocs / mkdocstrings-python not installed (`make install` installs the docs extra)")
def test_the_docs_build_with_warnings_as_errors(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                          str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("FDSKLClassifier", "HeteroLogisticRegression", "DPSCD", "ExactFederatedPCA", "connect_federation"):
        assert name in api, name
