"""Shared test helpers."""

import os

import pytest
import torch

from vfltorch.data import available, resolve_data_dir

# Multi-process tests spawn real party processes; keep each bounded.
os.environ.setdefault("VFLTORCH_TIMEOUT", "60")
# Saved models are authenticated under a model key kept outside the model folder (vfltorch.model_store): the
# tests use one of their own (inherited by every party process), not the user's ~/.config/vfltorch/model.key.
if "VFLTORCH_MODEL_KEY" not in os.environ:
    import tempfile

    os.environ["VFLTORCH_MODEL_KEY"] = os.path.join(tempfile.mkdtemp(prefix="vfltorch-test-key-"), "model.key")


def needs_dataset(name: str):
    """Skip (with the reason) when a shared dataset is not on this machine."""
    return pytest.mark.skipif(not available(name),
                              reason=f"dataset {name!r} not found (data folder: {resolve_data_dir() if _safe() else None}); "
                                     f"set VFLTORCH_DATA to the shared data folder to run this test")


def as_torch(value):
    """A fitted array (numpy since issue 37; None; or a list of them, ``history_``) as tensors, for the checks
    that compute in torch."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [as_torch(v) for v in value]
    return torch.as_tensor(value)


def _safe():
    try:
        resolve_data_dir()
        return True
    except Exception:
        return False


def reference_pack(x, bits):
    """The wire layout of ``sharing.pack_words`` as first written (issue 11): low 16 bits, then bytes / nibbles, by
    torch.cat; the packing tests compare the optimised packers with it."""
    x = x.reshape(-1).to(torch.int32)
    low = x.to(torch.int16).view(torch.uint8)
    if bits == 16:
        return low
    high = ((x >> 16) & ((1 << (bits - 16)) - 1)).to(torch.uint8)
    if bits == 20:
        half = (high.numel() + 1) // 2
        top = high[half:]
        high = high[:half].clone()
        high[:top.numel()] |= top << 4
    return torch.cat([low, high])
