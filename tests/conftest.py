"""Shared test helpers."""

import os

import pytest

from vfltorch.data import available, resolve_data_dir

# Multi-process tests spawn real party processes; keep each bounded.
os.environ.setdefault("VFLTORCH_TIMEOUT", "60")


def needs_dataset(name: str):
    """Skip (with the reason) when a shared dataset is not on this machine."""
    return pytest.mark.skipif(not available(name),
                              reason=f"dataset {name!r} not found (data folder: {resolve_data_dir() if _safe() else None}); "
                                     f"set VFLTORCH_DATA to the shared data folder to run this test")


def _safe():
    try:
        resolve_data_dir()
        return True
    except Exception:
        return False
