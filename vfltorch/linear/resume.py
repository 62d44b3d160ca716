"""What each hetero-LR role keeps across an epoch end, for ``--checkpoint`` (``vfltorch.checkpoint``).

At an epoch end every role's state is small and local: a data party's block of w (the paper's protocol) or its
shares of every block (the shared protocol), its block of the SQN window sum and of the previous window average,
the curvature pairs where they live (the key holder's plaintext pairs, or the two data parties' shares of them),
the accepted / rejected counts and the loss history of the stopping rule. The batch schedule is a function of
``random_state`` and the epoch, the step size of the epoch: nothing else is needed to go on. Masks, Beaver
triples and Paillier keys are drawn afresh after a restart; they hide values, they are not state.

``snapshot(role)`` gives (JSON-able state, numpy arrays) and ``restore(role, state, arrays)`` puts them back into
a freshly built role of the same kind; a checkpoint of another kind, or with arrays of other shapes, is refused.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checkpoint import CheckpointError
from ..devices import to_numpy
from .coordinator import Coordinator
from .local import LocalLearner
from .party import DataParty
from .shared import SharedRole


def _put(arrays: dict, name: str, t) -> None:
    if t is not None:
        arrays[name] = to_numpy(t)


def _get(arrays: dict, name: str, like: torch.Tensor | None = None, *, dtype=None, device=None):
    if name not in arrays:
        return None
    a = arrays[name]
    if like is not None and tuple(a.shape) != tuple(like.shape):
        raise CheckpointError(f"the checkpoint's {name} has shape {tuple(a.shape)}, this run's {tuple(like.shape)}: "
                              f"delete the --checkpoint folder and start again")
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(dtype=dtype or (like.dtype if like is not None else t.dtype),
                device=device or (like.device if like is not None else "cpu"))


def _pairs(arrays: dict, prefix: str, pairs) -> None:
    live = [(s, v) for s, v in pairs if s is not None]
    if live:
        arrays[f"{prefix}_s"] = np.stack([to_numpy(s) for s, _ in live])
        arrays[f"{prefix}_v"] = np.stack([to_numpy(v) for _, v in live])


def _pairs_back(arrays: dict, prefix: str, count: int, dtype, holds: bool) -> list:
    if not holds:                      # the dealer of the shared protocol counts the pairs, holds none
        return [(None, None)] * count
    s, v = arrays.get(f"{prefix}_s"), arrays.get(f"{prefix}_v")
    got = 0 if s is None else len(s)
    if got != count or (v is None) != (s is None) or (v is not None and len(v) != count):
        raise CheckpointError("the checkpoint's curvature pairs do not match its counts: delete the --checkpoint "
                              "folder and start again")
    return [(torch.from_numpy(s[i].copy()).to(dtype), torch.from_numpy(v[i].copy()).to(dtype)) for i in range(count)]


def _averager(arrays: dict, state: dict, averager) -> None:
    _put(arrays, "window_sum", averager._sum)
    _put(arrays, "window_previous", averager.previous)
    state["window_count"] = averager._count


def _averager_back(arrays: dict, state: dict, averager, like: torch.Tensor) -> None:
    averager._sum = _get(arrays, "window_sum", like)
    averager.previous = _get(arrays, "window_previous", like)
    averager._count = int(state["window_count"])


def _memory(arrays: dict, state: dict, memory) -> None:
    _pairs(arrays, "pairs", memory.pairs)
    state["pairs"] = len(memory.pairs)
    state["accepted"], state["rejected"] = memory.accepted, memory.rejected


def _memory_back(arrays: dict, state: dict, memory) -> None:
    memory.pairs.clear()
    memory.pairs.extend(_pairs_back(arrays, "pairs", int(state["pairs"]), torch.float64, True))
    memory.accepted, memory.rejected = int(state["accepted"]), int(state["rejected"])


def snapshot(role) -> tuple[dict, dict]:
    """(state, arrays) of ``role`` at an epoch end."""
    state, arrays = {"kind": type(role).__name__}, {}
    tracker = getattr(role, "tracker", None)
    if tracker is not None:
        state["loss_history"] = list(tracker.history)
    if isinstance(role, SharedRole):
        state["pairs"] = len(role.pairs)
        state["accepted"], state["rejected"] = role.memory.accepted, role.memory.rejected
        if role.index is not None:
            for P, share in enumerate(role.shares):
                arrays[f"share_{P}"] = to_numpy(share)
            _put(arrays, "window_sum", role.window)
            _put(arrays, "window_previous", role.previous)
            state["window_count"] = role.window_count
            _pairs(arrays, "pairs", role.pairs)
    elif isinstance(role, (DataParty, LocalLearner)):
        arrays["w"] = to_numpy(role.w)
        _averager(arrays, state, role.averager)
        if isinstance(role, LocalLearner):
            _memory(arrays, state, role.memory)
    elif isinstance(role, Coordinator):
        _memory(arrays, state, role.memory)
    else:
        raise CheckpointError(f"hetero-LR cannot checkpoint a {type(role).__name__}")
    return state, arrays


def restore(role, state: dict, arrays: dict) -> None:
    """Put ``snapshot``'s (state, arrays) back into a freshly built ``role`` of the same kind."""
    if state.get("kind") != type(role).__name__:
        raise CheckpointError(f"the checkpoint holds a {state.get('kind')} role, this party is a "
                              f"{type(role).__name__}: delete the --checkpoint folder and start again")
    try:
        tracker = getattr(role, "tracker", None)
        if tracker is not None:
            tracker.history = [float(x) for x in state["loss_history"]]
        if isinstance(role, SharedRole):
            holds = role.index is not None
            if holds:
                role.shares = [_get(arrays, f"share_{P}", share) for P, share in enumerate(role.shares)]
                if any(s is None for s in role.shares):
                    raise CheckpointError("the checkpoint lacks this party's shares")
                full = torch.cat(role.shares)
                role.window = _get(arrays, "window_sum", full)
                role.previous = _get(arrays, "window_previous", full)
                role.window_count = int(state["window_count"])
            role.pairs.clear()
            role.pairs.extend(_pairs_back(arrays, "pairs", int(state["pairs"]), torch.int64, holds))
            role.memory.accepted, role.memory.rejected = int(state["accepted"]), int(state["rejected"])
        elif isinstance(role, (DataParty, LocalLearner)):
            w = _get(arrays, "w", role.w)
            if w is None:
                raise CheckpointError("the checkpoint lacks this party's block of the model")
            role.w = w
            _averager_back(arrays, state, role.averager, role.w)
            if isinstance(role, LocalLearner):
                _memory_back(arrays, state, role.memory)
        elif isinstance(role, Coordinator):
            _memory_back(arrays, state, role.memory)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint cannot be resumed ({exc!r}): delete the --checkpoint folder and "
                              f"start again") from None


__all__ = ["restore", "snapshot"]
