"""Imported last by the parties' fork server (``start.PRELOAD``): the server leaves without the interpreter's
teardown of what it preloaded (torch, scikit-learn: a second and more on a loaded 2-core machine, during which
the server outlives the ``vfl`` that started it). Importing it anywhere else does nothing.
"""

from __future__ import annotations

import atexit
import os

from ._server_threads import _in_fork_server

if _in_fork_server():
    _SERVER = os.getpid()

    def _leave_quickly() -> None:
        if os.getpid() == _SERVER:           # the server only: the processes it forks inherit this handler
            os._exit(0)

    atexit.register(_leave_quickly)
