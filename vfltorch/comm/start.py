"""How party processes start: from a fork server that imported torch once, or fresh interpreters.

Kept free of torch, like the launcher: ``vfl`` starts the fork server (``warm_start``) as soon as the
cheap checks pass, and what needs torch before the parties start (a method's option check:
``run_in_server``; the rendezvous store: ``launcher._store_host``) runs in processes forked from that
server, which imported torch once. So the launching process need not import torch (a second torch
import on a 2-core machine competes with the server's); a local `vfl METHOD` run does not.
"""

from __future__ import annotations

import multiprocessing as mp
import os

# Party processes start from a fork server that has imported torch and the launcher once (one torch import per
# launching process instead of one per party: 18-19 s -> 11-12 s for 3 parties and a coordinator on a loaded 2-core
# machine); VFLTORCH_START_METHOD=spawn starts each party from a fresh interpreter instead.
# vfltorch.comm._server_threads first: the server runs torch on one thread, so that no preload starts a thread
# pool that the forked parties would inherit broken (GNU OpenMP is not fork-safe; see that module).
PRELOAD = ["vfltorch.comm._server_threads", "torch", "torch.distributed", "vfltorch.comm.launcher"]


DEFAULT_TIMEOUT = 60.0


def positive_setting(name: str, default: float) -> float:
    """A positive finite number from the environment variable ``name`` (``default`` when unset or empty); a clear
    ValueError naming the variable otherwise (nan, inf, 0 and negatives included: each would fail later, deep in
    a store or a division, without saying where it came from)."""
    import math

    raw = os.environ.get(name, "").strip()
    if not raw:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {raw!r}: unset it (default {default:g}) or give "
                         f"one")
    return value


def default_timeout() -> float:
    """Seconds a party waits for a peer before declaring it gone (VFLTORCH_TIMEOUT, default 60)."""
    return positive_setting("VFLTORCH_TIMEOUT", DEFAULT_TIMEOUT)


def party_threads(processes: int, threads: int | None = None) -> int:
    """torch threads per party process: ``threads`` if given, else VFLTORCH_THREADS, else the cores divided among
    the ``processes`` of this machine (so Q parties do not oversubscribe a small machine). The variable lets a
    2-core test machine run parties with several threads each, as a many-core server does."""
    if threads is None:
        raw = os.environ.get("VFLTORCH_THREADS")
        if raw:
            try:
                threads = int(raw)
            except ValueError:
                raise ValueError(f"VFLTORCH_THREADS must be a whole number of threads, got {raw!r}") from None
    if threads is None:
        return max(1, (os.cpu_count() or 1) // max(1, processes))
    if not 1 <= int(threads) <= 1024:
        raise ValueError(f"torch threads per party must be between 1 and 1024, got {threads}")
    return int(threads)


def profile_mark(event: str) -> None:
    """With VFLTORCH_PROFILE_STARTUP=FILE, append 'event wall-clock-time' to FILE (benchmarks/startup.py)."""
    path = os.environ.get("VFLTORCH_PROFILE_STARTUP")
    if path:
        import time

        with open(path, "a") as f:
            f.write(f"{event} {time.time():.6f}\n")


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or anything else that sets RANK/WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def under_mpirun() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def start_context(preload=()):
    """The multiprocessing context the parties start from (forkserver where the platform has it, else spawn)."""
    method = os.environ.get("VFLTORCH_START_METHOD") or (
        "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"VFLTORCH_START_METHOD must be forkserver or spawn, got {method!r}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        # Effective when this process starts its fork server (its first launch); later launches reuse it.
        # vfltorch.comm._server last: it makes the server leave without tearing down what it imported.
        ctx.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload, "vfltorch.comm._server"])))
    return ctx


def warm_start(preload=()) -> None:
    """Start the fork server now, so that it imports torch while this process does other work.

    Call it with the same ``preload`` the later ``launch`` gets (the server keeps the list it started with).
    Nothing happens under the spawn start method; a server that is never used exits with this process.
    """
    import sys

    ctx = start_context(preload)
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    # The server gets /dev/null as stdout and stderr: a party takes the launcher's own at launch (Stdio),
    # and a server holding the launcher's pipe open would keep `vfl ... | tee` waiting after an early error
    # until the server's imports finish.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        forkserver.ensure_running()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


class Stdio:
    """The launcher's stdout and stderr as they are now, for a process started by the fork server (which would
    otherwise write where the launcher's output went when the server started: /dev/null, pytest's capfd)."""

    def __init__(self, fds=None):
        self.fds = fds

    def __reduce__(self):                        # while Process.start() pickles: the fds travel with the process
        from multiprocessing.reduction import DupFd

        return Stdio, ((DupFd(1), DupFd(2)),)

    def apply(self) -> None:
        import sys

        for target, fd in zip((1, 2), self.fds or ()):
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            source = fd.detach()
            os.dup2(source, target)
            if source != target:
                os.close(source)


def adopt(environ, stdio) -> None:
    """In a process from the fork server: take the launcher's environment and stdio of now (see ``Stdio``)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if stdio is not None:
        stdio.apply()


def server_started(ctx) -> bool:
    """Whether processes of ``ctx`` start from the fork server (else each from a fresh interpreter)."""
    return ctx.get_start_method() == "forkserver"


def name_process(name: str) -> None:
    """Set this process's name as the OS shows it (/proc/PID/comm, `ps -o comm`), to tell a helper process of
    the launcher's (the store host, a check) from the parties; a no-op where prctl is missing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)     # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _run_child(conn, environ, stdio, fn, args, launcher=None):
    from .._lifetime import die_with_parent

    die_with_parent(launcher=launcher)           # SIGINT ignored first: a Ctrl-C is the launcher's to answer
    name_process("vfl-check")
    adopt(environ, stdio)
    try:
        out = ("ok", fn(*args))
    except BaseException as exc:                 # noqa: BLE001 - every failure goes back to the launcher
        import traceback

        out = ("error", exc, traceback.format_exc())
    try:
        try:
            conn.send(out)
        except (OSError, EOFError):
            raise
        except Exception:                        # an exception that does not pickle: its text
            conn.send(("error", RuntimeError(f"{type(out[1]).__name__}: {out[1]}"), out[2]))
        conn.close()
    except (OSError, EOFError):                  # the launcher is gone (stopped while this process started)
        pass
    for stream in (__import__("sys").stdout, __import__("sys").stderr):
        stream.flush()
    os._exit(0)                                  # no torch teardown


def run_in_server(fn, args: tuple = (), preload=()):
    """``fn(*args)`` in a process forked from the fork server (it has imported torch and ``preload`` once), with
    this process's environment and stdio; its result, or its exception raised here. ``fn`` must be importable by
    name (a module-level function); the launcher's own children are trusted like ``launch``'s results."""
    ctx = start_context(preload)
    here, there = ctx.Pipe(duplex=False)
    server = server_started(ctx)
    from .._lifetime import launcher_token

    proc = ctx.Process(target=_run_child, name="vfl-check",
                       args=(there, dict(os.environ) if server else None, Stdio() if server else None, fn, args,
                             launcher_token()))
    proc.start()
    there.close()
    try:
        try:
            out = here.recv()
        except EOFError:
            proc.join(5)
            raise RuntimeError(f"the check process exited with code {proc.exitcode} without answering") from None
    finally:
        here.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(1)
    if out[0] == "ok":
        return out[1]
    exc = out[1]
    if not isinstance(exc, ValueError) and hasattr(exc, "add_note"):      # not an input error: a bug, keep its trace
        exc.add_note(f"(raised in the check process:)\n{out[2]}")
    raise exc
