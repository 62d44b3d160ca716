"""Run outputs at the active party: TensorBoard scalars, progress bars, the JSON record.

Only the active party writes (``enabled``); the other parties get a RunLog
that does nothing, so algorithm code can log unconditionally.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


class RunLog:
    def __init__(self, logdir: str | None = None, *, enabled: bool = True, progress: bool = True):
        self.enabled = enabled
        self.show_progress = progress and enabled
        self._writer = None
        if enabled and logdir:
            from torch.utils.tensorboard import SummaryWriter

            Path(logdir).mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(logdir))

    def scalar(self, tag: str, value: float, step: int | float) -> None:
        """One TensorBoard point. ``step`` may be an epoch, a round, a byte count or milliseconds."""
        if self._writer is not None and value is not None and math.isfinite(float(value)):
            self._writer.add_scalar(tag, float(value), int(step))

    def scalars(self, values: dict, step: int | float, prefix: str = "") -> None:
        for k, v in values.items():
            self.scalar(prefix + k, v, step)

    def progress(self, iterable=None, *, total=None, desc=None, unit="it"):
        """A tqdm bar on the active party's stderr; a plain iterator elsewhere."""
        if not self.show_progress:
            return _Silent(iterable, total)
        return _bar_class()(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=True,
                            dynamic_ncols=True, mininterval=0.5, delay=0.5)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _bar_class():
    """tqdm, except that a bar closed before its total (converged, time budget) ends full at what was done,
    so the console shows a finished bar with its count, never one left at 5%."""
    from tqdm.auto import tqdm

    class FinishingBar(tqdm):
        def close(self):
            if not self.disable and (self.total is None or self.n < self.total):
                self.total = self.n
                self.refresh()
            super().close()

    return FinishingBar


class _Silent:
    """The part of tqdm's interface that algorithm code uses, doing nothing."""

    def __init__(self, iterable=None, total=None):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n=1):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def write_json(path: str | None, record: dict) -> str | None:
    """Write ``record`` to ``path`` atomically; return the path actually written.

    The text goes to a temporary file beside ``path`` and replaces it with
    ``os.replace``, so a reader (or a crash) never sees half a record and an
    earlier file is only replaced by a complete one. If ``path`` cannot be
    written, the record goes to a fallback file (``fallback_path``), the
    reason and the place are printed on stderr, and that place is returned:
    a trained result is never thrown away.
    """
    if not path:
        return None
    text = json.dumps(record, indent=2, default=_jsonable) + "\n"
    try:
        write_atomic(path, text)
        return str(path)
    except OSError as exc:
        reason = f"{type(exc).__name__}: {exc.strerror or exc}"
    for candidate in fallback_paths(record):
        try:
            write_atomic(candidate, text)
        except OSError:
            continue
        print(f"vfl: could not write --output-json {path} ({reason}); the record was written to {candidate} "
              f"instead", file=sys.stderr, flush=True)
        return str(candidate)
    print(f"vfl: could not write --output-json {path} ({reason}) nor a fallback file; the record follows on "
          f"stderr", file=sys.stderr, flush=True)
    print(text, file=sys.stderr, flush=True)
    return "<stderr>"


def write_atomic(path, data: str | bytes, *, mode: int | None = None) -> None:
    """``data`` (text or bytes) into ``path`` through a temporary file in the same folder and ``os.replace``;
    ``mode`` (e.g. 0o600) is set on the temporary file before anything is written to it."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        from ._lifetime import launcher_gone

        if launcher_gone():            # a party whose launcher was killed writes nothing: it ends here
            os.unlink(tmp)
            os._exit(1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def fallback_paths(record: dict) -> list[Path]:
    """Where a record goes when its own path fails: the temporary folder, then the working directory."""
    import os
    import tempfile
    import time

    name = f"vfl-{record.get('method', 'run')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    return [Path(tempfile.gettempdir()) / name, Path.cwd() / name]


def _jsonable(value):
    try:
        import numpy as np
        import torch

        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(value)
