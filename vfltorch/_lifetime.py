"""Helper processes die with the process that started them.

A party's background helpers (the obfuscator filler, crypto worker pools) and
the parties themselves (children of ``vfl``) call ``die_with_parent()`` first
thing. A daemon thread then watches the parent's pid: when the parent is gone
- even by SIGKILL, which runs no cleanup - the process is re-parented and the
thread ends it within ``interval`` seconds. (``PR_SET_PDEATHSIG`` would be
immediate but fires when the parent *thread* exits, which pool-managing
threads do.)
"""

from __future__ import annotations

import os
import threading
import time

_started = False


def die_with_parent(interval: float = 0.25, *, ignore_sigint: bool = True) -> None:
    """Watch the parent; ``ignore_sigint``: a Ctrl-C at the terminal is the parent's to answer, not ours."""
    global _started
    if ignore_sigint:
        import signal

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:                   # not the main thread
            pass
    if _started:
        return
    parent = os.getppid()
    if parent <= 1:
        return

    def watch():
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="vfl-parent-watch", daemon=True).start()
    _started = True
