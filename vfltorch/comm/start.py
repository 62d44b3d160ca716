"""How party processes start: from a fork server that imported torch once, or fresh interpreters.

Kept free of torch so that ``vfl`` can start the fork server (``warm_start``) before it imports torch
itself for the option checks: on a 2-core machine the server's imports then overlap the launcher's.
"""

from __future__ import annotations

import multiprocessing as mp
import os

# Party processes start from a fork server that has imported torch and the launcher once (one torch import per
# launching process instead of one per party: 18-19 s -> 11-12 s for 3 parties and a coordinator on a loaded 2-core
# machine); VFLTORCH_START_METHOD=spawn starts each party from a fresh interpreter instead.
PRELOAD = ["torch", "torch.distributed", "vfltorch.comm.launcher"]


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
        ctx.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload])))
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

    # The server gets /dev/null as stdout and stderr: a party takes the launcher's own at launch (launcher._Stdio),
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
