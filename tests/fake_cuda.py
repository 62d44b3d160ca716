"""A CPU stand-in for CUDA devices, so that the CPU test suite catches device mistakes (issue 34).

On a machine without a GPU every tensor is on the CPU, so a path that mixes devices or converts a device tensor
to numpy by hand works here and fails on ``--device cuda``. Inside ``fake_cuda()`` a tensor asked for on
``cuda`` / ``cuda:N`` is made on the CPU and tagged with that device; from then on, as torch does on a GPU:

* ``t.device`` reads ``cuda:N`` and ``t.is_cuda`` is True, so code that creates tensors ``device=t.device``
  creates tagged ones;
* an operation whose tensor arguments sit on different (fake) devices raises torch's
  ``RuntimeError: Expected all tensors to be on the same device`` (0-dim CPU tensors mix freely, as on CUDA;
  indexing and ``copy_`` may cross devices, as on CUDA);
* ``t.numpy()`` / ``np.asarray(t)`` of a tagged tensor raise torch's ``TypeError: can't convert cuda:0 device
  type tensor to numpy``;
* ``t.cpu()`` / ``t.to("cpu")`` give an untagged copy, ``t.to("cuda")`` a tagged one; results of operations on
  tagged tensors are tagged.

``torch.cuda.is_available()`` reads True and ``device_count()`` 2 while it is active (``--device cuda`` passes the
CLI's check). The values are the CPU's, so results can be compared with a plain CPU run. Only Python-level torch
calls are checked (a TorchFunctionMode): what C++ does inside one call, and what gloo moves, are not.

``VFLTORCH_FAKE_CUDA=1`` with ``tests/fake_cuda_site`` on PYTHONPATH turns it on for a whole process tree (the CLI
and the party processes it starts): see ``fake_cuda_env``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

_TAG = "_fake_cuda_index"
SITE = Path(__file__).resolve().parent / "fake_cuda_site"


def _index(device) -> int | None:
    """The CUDA index a device argument names, None for the CPU (or no device)."""
    if device is None:
        return None
    if isinstance(device, torch.Tensor):
        return tag(device)
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "cuda":
        return device.index or 0
    return None


def tag(t) -> int | None:
    return getattr(t, _TAG, None) if isinstance(t, torch.Tensor) else None


def _tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out)
    return out


def _set_tags(x, index):
    if isinstance(x, torch.Tensor):
        try:
            setattr(x, _TAG, index)
        except (AttributeError, RuntimeError):
            pass
    elif isinstance(x, (list, tuple)):
        for v in x:
            _set_tags(v, index)
    return x


def _fail(exc_type, message):
    """Raise as torch would on a GPU; with VFLTORCH_FAKE_CUDA_TRACE=1 print where first (party processes report
    one line)."""
    if os.environ.get("VFLTORCH_FAKE_CUDA_TRACE") == "1":
        import sys
        import traceback

        traceback.print_stack(limit=12, file=sys.stderr)
    raise exc_type(message)


def _name(index):
    return "cpu" if index is None else f"cuda:{index}"


_T = torch.Tensor
_CROSSING = {_T.__getitem__, _T.__setitem__, _T.copy_, _T.index_put_, _T.index_put}
_TO_NUMPY = {_T.numpy, _T.__array__}
_TYPE_CHECKS = {"_has_compatible_shallow_copy_type", "is_tensor", "is_floating_point", "is_complex"}
_FACTORY_LIKE = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
                 torch.linspace, torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm, torch.zeros_like,
                 torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like}


class FakeCudaMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            owner = getattr(func, "__self__", None)
            attr = getattr(owner, "__name__", None)
            if attr in ("device", "is_cuda", "is_cpu") and args and tag(args[0]) is not None:
                index = tag(args[0])
                return {"device": torch.device("cuda", index), "is_cuda": True, "is_cpu": False}[attr]
            out = func(*args, **kwargs)            # (.T, .mT, .data, .real ...: views on the same device)
            if isinstance(out, torch.Tensor) and args and tag(args[0]) is not None:
                _set_tags(out, tag(args[0]))
            return out
        if name == "__set__":                     # t.data = other: t takes other's device (nn.Module.to)
            out = func(*args, **kwargs)
            if getattr(getattr(func, "__self__", None), "__name__", None) == "data" and len(args) > 1:
                _set_tags(args[0], tag(args[1]))
            return out
        if name in _TYPE_CHECKS:
            return func(*args, **kwargs)
        if func in _TO_NUMPY:
            if args and tag(args[0]) is not None:
                _fail(TypeError, f"can't convert {_name(tag(args[0]))} device type tensor to numpy. Use Tensor.cpu() "
                                "to copy the tensor to host memory first. (fake_cuda)")
            return func(*args, **kwargs)
        if func is _T.cpu:
            out = func(*args, **kwargs)
            return out.clone() if tag(args[0]) is not None else out
        if func is _T.cuda:
            index = _index(args[1] if len(args) > 1 else kwargs.get("device", 0)) or 0
            return _set_tags(args[0].clone(), index)
        if func is _T.to:
            return self._to(func, args, kwargs)
        if "device" in kwargs:
            index = _index(kwargs["device"])
            if index is not None or (func in _FACTORY_LIKE and name.endswith("_like")):
                kwargs = dict(kwargs, device="cpu")
                out = func(*args, **kwargs)
                return _set_tags(out, index) if index is not None else out
        tensors = _tensors(args, []) + _tensors(kwargs, [])
        tags = {tag(t) for t in tensors if tag(t) is not None or t.dim() > 0}
        if len(tags) > 1 and func not in _CROSSING:
            _fail(RuntimeError, "Expected all tensors to be on the same device, but found at least two devices, "
                               + " and ".join(sorted(_name(t) for t in tags)) + f"! (fake_cuda: {name})")
        if func in _CROSSING:
            out = func(*args, **kwargs)
            index = tag(args[0])
            if name == "__getitem__" and index is None:
                for t in tensors[1:]:
                    if tag(t) is not None:
                        _fail(RuntimeError, "indices should be either on cpu or on the same device as the indexed "
                                           f"tensor (cpu) (fake_cuda)")
            return _set_tags(out, index) if index is not None and out is not args[0] else out
        out = func(*args, **kwargs)
        index = next((t for t in tags if t is not None), None)
        if index is not None:
            _set_tags(out, index)
        return out

    def _to(self, func, args, kwargs):
        src, rest, kw = args[0], list(args[1:]), dict(kwargs)
        target, found = kw.pop("device", None), "device" in kwargs
        for i, a in enumerate(rest):
            if isinstance(a, (str, torch.device, torch.Tensor)) or (isinstance(a, int) and not isinstance(a, bool)):
                target, found = a, True
                rest[i] = a.dtype if isinstance(a, torch.Tensor) else "cpu"
                break
        if found and not isinstance(target, torch.Tensor) and "device" in kwargs:
            kw["device"] = "cpu"
        out = func(src, *rest, **kw)
        index = _index(target) if found else tag(src)
        if index == tag(src):
            return out if out is src else _set_tags(out, index)
        return _set_tags(src.clone() if out is src else out, index)


_real = {}


@contextlib.contextmanager
def fake_cuda():
    """Run the block with ``cuda`` / ``cuda:N`` simulated on the CPU (see the module docstring)."""
    activate()
    try:
        yield
    finally:
        deactivate()


class _FakeGenerator(torch.Generator):
    """``torch.Generator(device="cuda")``: a CPU generator that reports its fake device."""

    def __new__(cls, device=None):
        return _REAL_GENERATOR.__new__(cls)

    def __init__(self, device=None):
        _REAL_GENERATOR.__init__(self)
        self._fake_device = torch.device("cuda", _index(device) or 0)

    @property
    def device(self):
        return self._fake_device


class _AnyGenerator(type(torch.Generator)):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)


_REAL_GENERATOR = torch.Generator


class _GeneratorProxy(torch.Generator, metaclass=_AnyGenerator):
    """What ``torch.Generator`` is while active: cuda devices give a ``_FakeGenerator``, the rest a real one."""

    def __new__(cls, device="cpu"):
        return _FakeGenerator(device) if _index(device) is not None else _REAL_GENERATOR(device)


def activate():
    mode = FakeCudaMode()
    mode.__enter__()
    _real.setdefault("stack", []).append(mode)
    if "is_available" not in _real:
        _real["is_available"], _real["device_count"] = torch.cuda.is_available, torch.cuda.device_count
        _real["synchronize"] = torch.cuda.synchronize
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 2
        torch.cuda.synchronize = lambda *a, **k: None
        _real["Generator"] = torch.Generator
        torch.Generator = _GeneratorProxy


def deactivate():
    mode = _real["stack"].pop()
    mode.__exit__(None, None, None)
    if not _real["stack"]:
        torch.cuda.is_available = _real.pop("is_available")
        torch.cuda.device_count = _real.pop("device_count")
        torch.cuda.synchronize = _real.pop("synchronize")
        torch.Generator = _real.pop("Generator")


def fake_cuda_env(env=None) -> dict:
    """An environment under which every Python process started (the CLI, its fork server and parties) runs
    inside ``fake_cuda`` (``fake_cuda_site/sitecustomize.py``)."""
    env = dict(os.environ if env is None else env)
    path = [str(SITE), str(SITE.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["VFLTORCH_FAKE_CUDA"] = "1"
    return env


def is_fake() -> bool:
    return bool(_real.get("stack"))


def assert_on(t, device, what: str = "tensor") -> None:
    """``t`` (a tensor, or None) is on ``device`` (fake or real)."""
    if t is None:
        return
    want = torch.device(device)
    got = t.device
    assert got.type == want.type and (want.index is None or (got.index or 0) == want.index), \
        f"{what} is on {got}, expected {want}"


