"""The one place that moves tensors between a party's device, the host (wire, numpy) and back (issue 34).

Every method computes on its party's device (``--device cpu``, ``cuda`` or ``cuda:N``; ``Federation.device``)
and reports, saves and scores on the host. What crosses between the two goes through these functions, never
through a hand-written ``.numpy()`` or ``.cpu().numpy()``: a CUDA tensor has no numpy view, and a host tensor
met by a device tensor in one operation is an error on a GPU that no CPU run shows. Messages go through
``Federation.send`` / ``recv``, which move device tensors through host memory themselves (gloo and MPI move host
memory) and deliver on the party's device unless asked otherwise.

The CPU test suite runs the methods under ``tests/fake_cuda.py`` (a CPU stand-in for ``cuda`` that raises where
CUDA would), and ``tests/test_devices.py`` forbids ``.numpy()`` outside this module.
"""

from __future__ import annotations

# torch and numpy are imported inside the functions: the command-line modules import this one, and
# `vfl METHOD --help` imports no torch (tests/test_startup.py).


def as_device(device=None, default="cpu") -> "torch.device":
    """``device`` (a string such as ``"cuda:1"``, a ``torch.device`` or None for ``default``) as a torch.device."""
    import torch

    return torch.device(default if device is None else device)


def to_host(t, dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """A CPU tensor with the values of ``t`` (detached; no copy when it already is one), optionally cast."""
    import numpy as np
    import torch

    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(np.asarray(t))
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu", dtype) if dtype is not None else t.cpu()
    elif dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t


def to_numpy(t, dtype=None) -> "np.ndarray":
    """A numpy array with the values of ``t``: a tensor on any device (copied to the host when it is not there,
    detached when it needs grad) or anything ``np.asarray`` takes. ``dtype``: a numpy dtype to cast to."""
    import numpy as np
    import torch

    if isinstance(t, torch.Tensor):
        out = to_host(t).numpy()
    else:
        out = np.asarray(t)
    return out if dtype is None or out.dtype == np.dtype(dtype) else out.astype(dtype)


def to_device(x, device, dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """``x`` (a tensor on any device, a numpy array or a list) as a tensor on ``device`` (no copy when it is
    already there with that dtype)."""
    import numpy as np
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x) if not isinstance(x, (int, float)) else x)
    return x.to(device=as_device(device), dtype=dtype) if dtype is not None else x.to(as_device(device))


def to_item(t) -> float:
    """A Python float from a one-element tensor on any device (one host round trip: call it outside loops)."""
    import torch

    return float(t.item()) if isinstance(t, torch.Tensor) else float(t)


def same_device(t, like):
    """``t`` on the device of ``like`` (a tensor or a device); None stays None."""
    import torch

    if t is None or like is None:
        return t
    device = like.device if isinstance(like, torch.Tensor) else as_device(like)
    return t if t.device == device else t.to(device)
