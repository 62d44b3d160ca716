"""Run outputs at the active party: TensorBoard scalars, progress bars, the JSON record.

Only the active party writes (``enabled``); the other parties get a RunLog
that does nothing, so algorithm code can log unconditionally.
"""

from __future__ import annotations

import json
import math
import os
import sys
import weakref
from pathlib import Path


class RunLog:
    def __init__(self, logdir: str | None = None, *, enabled: bool = True, progress: bool = True):
        self.enabled = enabled
        self.show_progress = progress and enabled
        self._writer = None
        self.logdir = logdir
        if enabled and logdir:
            from torch.utils.tensorboard import SummaryWriter

            try:
                make_private_dirs(logdir)
                self._writer = SummaryWriter(log_dir=str(logdir))
                _quiet_writer_thread(self._writer)
                os.chmod(self._writer._get_file_writer().event_writer._file_name, 0o600)
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """TensorBoard output failed (a full disk, a folder made unwritable): one line naming the folder, and the
        run goes on without its scalars (the JSON record still holds the results)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:                # noqa: BLE001 - the writer is broken already
                pass
        self._writer = None
        reason = getattr(exc, "strerror", None) or exc
        print(f"vfl: could not write TensorBoard scalars to --logdir {self.logdir} ({type(exc).__name__}: "
              f"{reason}); the run goes on without them", file=sys.stderr, flush=True)

    def scalar(self, tag: str, value: float, step: int | float) -> None:
        """One TensorBoard point. ``step`` may be an epoch, a round, a byte count or milliseconds."""
        if self._writer is not None and value is not None and math.isfinite(float(value)):
            try:
                self._writer.add_scalar(tag, float(value), int(step))
            except OSError as exc:
                self._failed(exc)

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
            try:
                self._writer.flush()
                self._writer.close()
            except OSError as exc:
                self._failed(exc)
            self._writer = None


def _quiet_writer_thread(writer) -> None:
    """The event file's writer thread re-raises a failed write, and the thread's traceback (without the folder)
    would reach the console; the error also reaches the next add_scalar / flush / close, which ``RunLog``
    answers in one line. So the traceback of that thread is not printed."""
    import threading

    worker = getattr(getattr(writer._get_file_writer().event_writer, "_async_writer", None), "_worker", None)
    if worker is None:
        return
    previous = threading.excepthook

    def hook(args):
        if args.thread is worker and isinstance(args.exc_value, OSError):
            return
        previous(args)

    threading.excepthook = hook


def make_private_dirs(path) -> Path:
    """``path`` and every missing folder above it, each made 0700 (only the user who ran `vfl` reads a run's
    outputs); folders that exist already are left as they are."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)          # mkdir's mode is masked by the umask
    return path


# A long run says once, early, how long the rest will take (issue 38: a default run that took 8 minutes said
# nothing at its start). Measured over the steps after the first (which carries set-up work) for at least
# FORECAST_AFTER seconds; said only when the rest is FORECAST_MIN seconds or more.
FORECAST_AFTER = 2.0
FORECAST_MIN = 60.0


def forecast_line(desc: str | None, unit: str, done: int, seconds: float, left: int, total: int | None) -> str | None:
    """The one line a long run prints: ``done`` steps (after the first) took ``seconds`` and ``left`` of ``total``
    remain; None when there is no total, too little measured, or less than FORECAST_MIN seconds to go."""
    if not total or done <= 0 or seconds < FORECAST_AFTER:
        return None
    left = max(0, int(left))
    per = seconds / done
    rest = left * per
    if rest < FORECAST_MIN:
        return None
    when = f"{rest / 60:.1f} min" if rest < 5400 else f"{rest / 3600:.1f} h"
    return (f"vfl: {desc or 'run'}: about {when} to go ({left} of {int(total)} {unit}s left at {per:.3g} s each, "
            f"measured over {done})")


def _bar_class():
    """tqdm, except that a bar closed before its total (converged, time budget) ends full at what was done,
    so the console shows a finished bar with its count, never one left at 5%; and a long run's bar says once
    how long the rest will take (``forecast_line``)."""
    import time

    from tqdm.auto import tqdm

    class FinishingBar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _OPEN_BARS.add(self)
            self._first = None              # (perf_counter, n) at the end of the first step
            self._forecast_done = False

        def update(self, n=1):
            out = super().update(n)
            if not self._forecast_done:
                now = time.perf_counter()
                if self._first is None:
                    self._first = (now, self.n)
                else:
                    seconds, done = now - self._first[0], self.n - self._first[1]
                    if seconds >= FORECAST_AFTER:
                        self._forecast_done = True
                        left = (self.total - self.n) if self.total else 0
                        line = forecast_line(self.desc.rstrip(": ") if self.desc else None, self.unit, done,
                                             seconds, left, self.total)
                        if line is not None:
                            self.write(line, file=self.fp)
            return out

        def close(self):
            _OPEN_BARS.discard(self)
            if not self.disable and (self.total is None or self.n < self.total):
                self.total = self.n
                self.refresh()
            super().close()

    return FinishingBar


_OPEN_BARS: "weakref.WeakSet" = weakref.WeakSet()


def end_progress_line() -> None:
    """Before a message on stderr: close the progress bars still open (a run stopped by a failure), which ends
    their line, so the message stands on its own line instead of being glued to a bar's."""
    import time

    for bar in list(_OPEN_BARS):
        if time.time() - getattr(bar, "start_t", 0) < getattr(bar, "delay", 0):
            bar.disable = True           # not shown yet (tqdm's delay): it stays unshown
        try:
            bar.close()                  # shown (leave=True): redrawn at what was done, then a newline
        except (OSError, ValueError):
            pass


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

    def write(self, *args, **kwargs):      # (a line the bar would print: --quiet asked for none)
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
    make_private_dirs(path.parent)
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
