"""Helper processes die with the process that started them, and every process of a run with its launcher.

A party's background helpers (the obfuscator filler, crypto worker pools) and
the parties themselves call ``die_with_parent()`` first thing. A daemon thread
then watches the parent's pid: when the parent is gone - even by SIGKILL, which
runs no cleanup - the process is re-parented and the thread ends it within
``interval`` seconds. (``PR_SET_PDEATHSIG`` would be immediate but fires when
the parent *thread* exits, which pool-managing threads do.)

The parent is not enough for what the fork server starts (the parties, the
store host, a check): their parent is the server, and the server outlives a
killed launcher, because every process it forked holds the pipe whose end-of-
file tells it to leave (issue 36: 13 processes still running 135 s after a
``kill -9`` of ``vfl hetero-lr``). So those processes also watch the launcher
itself, named by ``launcher_token()`` (its pid and its start time, so that a
pid reused by another process does not count as the launcher). Once they are
gone, the server sees that end-of-file and leaves, and so does the resource
tracker; their helpers follow their party through the parent watch.
"""

from __future__ import annotations

import os
import threading
import time

_started: int | None = None          # the pid that started its watch (a forked child must start its own)
_launcher: str | None = None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when it has ended
    (no such process, or a zombie that nobody has reaped yet) or /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if not fields or fields[0] in ("Z", "X", "x"):
        return None
    return fields[19]


def launcher_token(pid: int | None = None) -> str:
    """This process (or ``pid``) as the launcher its children watch: 'pid:start-time'."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid) or ''}"


def launcher_alive(token: str | None) -> bool:
    """Whether the launcher named by ``token`` still runs (True for None: no launcher to watch)."""
    if not token:
        return True
    pid_text, _, start = token.partition(":")
    pid = int(pid_text)
    if os.path.isdir("/proc/self"):
        return _start_time(pid) == start if start else _start_time(pid) is not None
    try:                                   # no /proc: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def launcher_gone() -> bool:
    """Whether the launcher this process watches has ended: asked before a run's output becomes visible, so that
    nothing is written after the command that asked for it has ended (the watch may not have run yet)."""
    return _launcher is not None and not launcher_alive(_launcher)


def die_with_parent(interval: float = 0.25, *, ignore_sigint: bool = True, launcher: str | None = None,
                    parent: int | None = None) -> None:
    """Watch the parent and, with ``launcher`` (a ``launcher_token``), the launcher of the run; ``ignore_sigint``:
    a Ctrl-C at the terminal is the parent's to answer, not ours. ``parent``: the pid that started this process,
    passed along by it: a helper whose parent died while it was still starting (a spawned interpreter's imports
    take seconds) finds itself re-parented already and ends, instead of never watching. Without ``launcher``, the
    launcher a party named in VFLTORCH_LAUNCHER (inherited by the helpers it spawns) is watched."""
    global _started, _launcher
    if ignore_sigint:
        import signal

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:                   # not the main thread
            pass
    if _started == os.getpid():
        return
    launcher = launcher or os.environ.get("VFLTORCH_LAUNCHER") or None
    if parent is not None and os.getppid() != parent:
        os._exit(1)
    parent = os.getppid()
    if not launcher_alive(launcher):
        os._exit(1)
    if parent <= 1 and not launcher:
        return
    _launcher = launcher

    def watch():
        while True:
            time.sleep(interval)
            if os.getppid() != parent or not launcher_alive(launcher):
                os._exit(1)

    threading.Thread(target=watch, name="vfl-parent-watch", daemon=True).start()
    _started = os.getpid()
