"""Imported first by the parties' fork server (``start.PRELOAD``): the server runs torch on one thread.

GNU OpenMP (torch's intra-op pool on Linux) is not fork-safe: a process forked after its parent ran a parallel
region inherits a pool whose worker threads do not exist, and its own first parallel region waits for them
forever. The server's preloads may run tensor ops at import (a module-level table, for example), and on a
many-core machine such an op runs in parallel; the parties forked afterwards then hung in their first parallel
op as soon as they had more than one thread (issue 34: 3 of 3 runs on a 16-core box; reproduced on 2 cores with
VFLTORCH_THREADS=4). With one thread the server never starts a pool, and each party builds its own when it sets
its thread count (``launcher._party_main``). Importing this module anywhere but in the fork server does nothing
beyond importing torch.
"""

from __future__ import annotations

import sys

import torch


def _in_fork_server() -> bool:
    """Whether this import runs inside multiprocessing's fork server main loop (its preloading)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if _in_fork_server():
    torch.set_num_threads(1)
