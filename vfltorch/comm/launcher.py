"""Starting a federation: Q local processes on loopback, or one party under torchrun / MPI.

``launch(fn, parties=Q)`` is what tests, notebooks and ``vfl --parties Q`` use:
it spawns one process per party, connects them through a TCP store that a
process of the launcher's hosts (so the store outlives any party, which failure
diagnosis needs), runs ``fn(fed, *args)`` in each, and returns the per-rank
results. If any party fails, it waits for all of them (each is bounded by the
federation timeout) and raises ``FederationError`` with every party's message.

This module imports no torch where it launches (``vfl`` never imports torch in the launching process): under
the fork server the store is hosted by a process forked from the server (``_store_host``), which imported
torch once for all; with VFLTORCH_START_METHOD=spawn the launcher hosts it itself.

``init_from_env()`` is the same federation under ``torchrun`` (env://) or
``mpirun`` (the MPI backend): the code that runs inside a party is identical.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter
import os
import pickle
import queue as queue_mod
import secrets
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING

from .errors import BackendUnavailable, FederationError, PartyFailure
from .start import Stdio, adopt, default_timeout, name_process, party_threads, profile_mark, server_started, start_context
from .roles import Roles
from .._lifetime import launcher_token

if TYPE_CHECKING:
    from .federation import Federation


def init_from_env(*, coordinator: bool = False, active: int = 0, backend: str = "gloo",
                  device: str = "cpu", timeout: float | None = None,
                  record_transcript: bool = False) -> Federation:
    """Join the federation this process was started into (torchrun's env:// or mpirun)."""
    import torch.distributed as dist

    from .federation import Federation, check_backend
    from .transcript import Transcript

    timeout = default_timeout() if timeout is None else float(timeout)
    transcript = Transcript() if record_transcript else None
    check_backend(backend)
    if backend == "mpi":
        dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=timeout))
        rank, world = dist.get_rank(), dist.get_world_size()
        roles = Roles(world, active=active, coordinator=world - 1 if coordinator else None)
        return Federation(rank, roles, store=None, backend="mpi", device=device, timeout=timeout,
                          transcript=transcript)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    roles = Roles(world, active=active, coordinator=world - 1 if coordinator else None)
    if world == 1:
        return Federation.local(device, transcript=transcript)
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=datetime.timedelta(seconds=timeout)))
    # torchrun's agent may restart the workers: keep each attempt's keys apart.
    prefix = f"vfl/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return Federation.connect(dist.PrefixStore(prefix, store), rank, roles, backend=backend, device=device,
                              timeout=timeout, transcript=transcript)


# After a party fails, the others get this long to notice and report before the launcher kills them: a healthy
# party notices within a second or two (the failure is posted in the store); one that is silent is hung.
STRAGGLER_GRACE = 5.0
# When the launcher itself is stopped (SIGINT / SIGTERM), parties get this long after SIGTERM before SIGKILL.
STOP_GRACE = 2.0
# A party reports JOINED once it is connected to the others. One that has not, this long after the join timeout
# (process start, imports and the rendezvous all count), is hung in its start-up: the launcher stops every party
# and says so, instead of waiting for results forever (seen once: a fork server that never ran its children).
START_GRACE = 60.0
JOINED = "joined"


def _party_main(rank, roles, port, options, fn, args, kwargs, results):
    from .._lifetime import die_with_parent

    adopt(options.get("environ"), options.get("stdio"))   # forkserver: the launcher's environment and stdio now
    import torch
    import torch.distributed as dist

    from .federation import Federation
    from .transcript import Transcript

    # Started with SIGINT ignored (see launch): from here on SIGINT ends this party at once, without a
    # traceback, and the launcher names it; a Ctrl-C at the terminal is answered by the launcher in one line.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # A killed launcher takes its parties with it: their parent is the fork server, which outlives the launcher
    # while they run, so they watch the launcher itself.
    die_with_parent(ignore_sigint=False, launcher=options.get("launcher"))
    if options.get("launcher"):
        os.environ["VFLTORCH_LAUNCHER"] = options["launcher"]      # its helper processes watch the launcher too
    torch.set_num_threads(options["threads"])
    fed = None
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=options["join_timeout"]))
        transcript = Transcript() if options["record_transcript"] else None
        fed = Federation.connect(store, rank, roles, backend=options["backend"], device=options["device"],
                                 timeout=options["timeout"], join_timeout=options["join_timeout"],
                                 transcript=transcript, store_secret=options["store_secret"])
        profile_mark(f"party{rank}_joined")
        results.put((rank, JOINED, None))           # the launcher's start-up watchdog (collect_results)
        out = fn(fed, *args, **kwargs)
        profile_mark(f"party{rank}_returned")
        fed.close()
        profile_mark(f"party{rank}_closed")
        # Plain pickle bytes: torch's queue pickler would share tensors through file
        # descriptors that vanish when this process exits.
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        if fed is not None:
            fed.report_error(exc)
        kind = "failure" if isinstance(exc, PartyFailure) else "error"
        named = exc.party if isinstance(exc, PartyFailure) else None
        results.put((rank, kind, (f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", named)))
    _exit_quickly(results)


def _exit_quickly(results) -> None:
    """End the party process without the interpreter's teardown of torch and gloo, which takes 3 s and more
    per process (measured with benchmarks/startup.py) while the launcher waits: the result is flushed to the
    launcher first, the atexit handlers run (logging, helper processes) and stdio is flushed."""
    import atexit

    results.close()
    results.join_thread()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def launch(fn, parties: int, args: tuple = (), kwargs: dict | None = None, *, coordinator: bool = False,
           active: int = 0, backend: str = "gloo", device: str = "cpu", timeout: float | None = None,
           join_timeout: float | None = None, record_transcript: bool = False,
           threads: int | None = None, preload: tuple = ()) -> list:
    """Run ``fn(fed, *args, **kwargs)`` in one process per party; return the results by rank.

    Processes start from a fork server that has imported torch once (or, with
    VFLTORCH_START_METHOD=spawn, each from a fresh interpreter); never by a
    plain fork, which CUDA forbids. Either way they import ``fn`` by name. A function they cannot import (defined in a notebook,
    in ``python -c``, a lambda or a nested function) is sent by value with
    cloudpickle instead (see ``portable``). A script that calls ``launch``
    needs its call under ``if __name__ == "__main__":`` (every party imports the
    script again); the error says so. With ``coordinator``
    the world has ``parties + 1`` ranks, the last one the coordinator. Each
    process gets ``threads`` torch threads (default: the cores divided among
    the processes, so Q parties do not oversubscribe a small machine). ``preload``:
    modules the fork server imports once for all parties (see ``start_context``).
    """
    if parties < 1:
        raise ValueError(f"parties must be at least 1, got {parties}")
    roles = Roles.for_parties(parties, coordinator=coordinator, active=active)
    world = roles.world_size
    timeout = default_timeout() if timeout is None else float(timeout)
    if world == 1:
        from .federation import Federation
        from .transcript import Transcript

        fed = Federation.local(device, transcript=Transcript() if record_transcript else None)
        return [fn(fed, *args, **(kwargs or {}))]
    if backend == "mpi":
        raise ValueError("the MPI backend takes its processes from mpirun: start the parties with "
                         "`mpirun -n Q vfl ... --backend mpi` instead of --parties")
    if backend != "gloo":
        raise ValueError(f"unknown backend {backend!r}: choose 'gloo' or 'mpi'")
    options = dict(backend=backend, device=device, timeout=timeout,
                   join_timeout=timeout if join_timeout is None else float(join_timeout),
                   record_transcript=record_transcript,
                   threads=party_threads(world, threads),
                   store_secret=secrets.token_bytes(32),   # reaches the children by spawn, never the network
                   launcher=launcher_token())              # every process of the run ends when this one does
    ctx = start_context(preload)
    options["environ"] = dict(os.environ) if server_started(ctx) else None
    options["stdio"] = Stdio() if options["environ"] is not None else None
    target = portable(fn)
    # The store lives outside the parties (a process of the launcher's): it survives any party, so failures can
    # be traced to their root.
    port, store_host = _start_store(ctx, backend, options, hint=_script_hint(fn))
    try:
        results = ctx.Queue()
        profile_mark("spawn")
        procs = [ctx.Process(target=_party_main, name=f"vfl-party-{r}",
                             args=(r, roles, port, options, target, args, kwargs or {}, results))
                 for r in range(world)]
        _start_ignoring_sigint(procs)
        out = collect_results(procs, results, roles, timeout, hint=_script_hint(fn),
                              start_timeout=options["join_timeout"] + START_GRACE)
    finally:
        store_host.close()
    profile_mark("collected")
    return out


def _listening_store(backend: str, join_timeout: float):
    """The rendezvous store's server, listening on loopback only (``backend`` checked first)."""
    import torch.distributed as dist

    from .federation import check_backend

    check_backend(backend)
    # TCPStore alone listens on every interface whatever host it is given: hand it a loopback-bound socket.
    listen = socket.create_server(("127.0.0.1", 0))
    return dist.TCPStore("127.0.0.1", listen.getsockname()[1], is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=join_timeout), master_listen_fd=listen.detach())


def _store_host(conn, backend: str, join_timeout: float, environ, stdio, launcher=None) -> None:
    """A process from the fork server that hosts the store until the launcher closes ``conn`` (or dies). Its
    output stays the server's (/dev/null): it must not hold the launcher's stdout open; its errors come back on
    ``conn``."""
    from .._lifetime import die_with_parent

    die_with_parent(launcher=launcher)           # SIGINT ignored: the launcher answers a Ctrl-C and closes conn
    name_process("vfl-store")
    adopt(environ, stdio)
    try:
        store = _listening_store(backend, join_timeout)
        conn.send(("port", store.port))
    except BaseException as exc:                 # noqa: BLE001 - the launcher raises it
        kind = "backend" if isinstance(exc, BackendUnavailable) else "error"
        conn.send((kind, f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    try:
        conn.recv()                              # nothing is ever sent: returns at EOF, when the launcher is done
    except (EOFError, OSError):
        pass
    os._exit(0)                                  # no torch teardown


class _StoreHost:
    """The launcher's handle on whoever hosts the store: ``close()`` ends it (a process, or the store in here)."""

    def __init__(self, proc=None, conn=None, store=None):
        self.proc, self.conn, self.store = proc, conn, store

    def close(self) -> None:
        self.store = None
        if self.proc is None or self.proc.pid is None:
            return
        self.conn.close()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)


def _start_store(ctx, backend: str, options: dict, hint: str | None = None):
    """(port, host): the store in a process forked from the fork server, or in this process under spawn.
    ``hint``: what to change when the host dies without reporting (a script without a main guard, which the host
    imports again before the parties do)."""
    if not server_started(ctx):
        store = _listening_store(backend, options["join_timeout"])
        return store.port, _StoreHost(store=store)
    here, there = ctx.Pipe()                    # the host replies (port or error) and then waits for EOF on it
    proc = ctx.Process(target=_store_host, name="vfl-store",
                       args=(there, backend, options["join_timeout"], options["environ"], None,
                             options.get("launcher")))
    # start() returns once the server has forked it, i.e. after the server's imports: SIGINT is not ignored
    # meanwhile, so a Ctrl-C then stops vfl at once (a host forked later finds its pipe closed and leaves).
    proc.start()
    there.close()
    host = _StoreHost(proc, here)
    try:
        try:
            kind, value = here.recv()            # waits for the server's imports (torch), as a party would
        except EOFError:
            proc.join(timeout=5)
            raise FederationError("the process hosting the rendezvous store "
                                  + _death(proc.exitcode).removeprefix("the process ")
                                  + (f"\n{hint}" if hint else ""), errors={}) from None
        if kind == "backend":
            raise BackendUnavailable(value.partition(": ")[2])
        if kind != "port":
            raise FederationError(f"the rendezvous store could not be started: {value}", errors={})
        return int(value), host
    except BaseException:
        host.close()
        raise


class _ByValue:
    """A function the parties cannot import by name, carried as cloudpickle bytes from the launching process
    (its own spawned children: the same trust as the arguments; nothing from a peer is unpickled)."""

    def __init__(self, fn):
        import cloudpickle

        self.name = getattr(fn, "__qualname__", repr(fn))
        self.payload = cloudpickle.dumps(fn)
        self._fn = None

    def __call__(self, *args, **kwargs):
        if self._fn is None:
            self._fn = pickle.loads(self.payload)
        return self._fn(*args, **kwargs)


def _importable(fn) -> bool:
    """Whether a spawned process can import ``fn`` by its module and name."""
    module = getattr(fn, "__module__", None)
    if module == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
        return False                    # python -c, a notebook, the REPL: the children cannot import __main__
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False                    # a lambda, a nested function
    return True


def portable(fn):
    """``fn`` itself when the parties can import it; else ``fn`` by value (cloudpickle); else a clear error."""
    if _importable(fn):
        return fn
    try:
        return _ByValue(fn)
    except ImportError:
        raise ValueError(
            f"launch() runs {getattr(fn, '__qualname__', fn)!r} in new processes, which import it by name, and "
            f"they cannot import it from {getattr(fn, '__module__', '?')!r} (a notebook, python -c, a lambda or a "
            f"nested function). Define it at module level in a .py file next to your notebook (e.g. parties.py: "
            f"`def train(fed): ...`), then `from parties import train; launch(train, ...)`; or install "
            f"cloudpickle, with which launch() sends such a function by value") from None
    except Exception as exc:            # noqa: BLE001 - cloudpickle cannot serialise what it closes over
        raise ValueError(f"launch() cannot send {getattr(fn, '__qualname__', fn)!r} to the party processes "
                         f"({type(exc).__name__}: {exc}). Define it at module level in a .py file and import it, "
                         f"so the parties import it by name") from None


def _script_hint(fn) -> str | None:
    """What to change when ``fn`` comes from a script that every spawned party imports again."""
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) != "__main__" or not getattr(main, "__file__", None):
        return None
    return (f"hint: {getattr(fn, '__qualname__', 'the function')} is defined in the script {main.__file__}, which "
            f"every party process imports again: put the code that calls launch() under "
            f"`if __name__ == \"__main__\":` (or move the function into a module and import it)")


def collect_results(procs, results, roles: Roles, timeout: float, *, hint: str | None = None,
                    start_timeout: float | None = None) -> list:
    """Wait for the started party processes ``procs`` (index = rank) and return their results by rank.

    One loop for every way of starting parties (``launch`` here, ``link.launch_local`` over TLS): a
    party that fails gives the others ``STRAGGLER_GRACE`` seconds before they are killed, a party
    that exits without reporting is named with how it died, and a launcher that is stopped itself
    (Ctrl-C, SIGTERM) stops every party. Raises ``FederationError`` naming every failed party;
    ``hint`` is added to its message when a party died without reporting. ``start_timeout`` (parties that
    report ``JOINED`` once connected, as ``launch``'s do): a party that has neither joined nor ended that many
    seconds after the start is hung in its start-up; every party is stopped and the error names it.
    """
    world = len(procs)
    outcome: dict[int, tuple[str, object]] = {}
    joined: set[int] = set()
    stragglers_deadline = None
    grace = min(timeout, STRAGGLER_GRACE)
    start_deadline = None if start_timeout is None else time.monotonic() + start_timeout

    def record(item) -> None:
        rank, kind, value = item
        if kind == JOINED:
            joined.add(rank)
        else:
            outcome[rank] = (kind, value)
    try:
        while len(outcome) < world:
            if start_deadline is not None and time.monotonic() > start_deadline:
                hung = [r for r in range(world) if r not in joined and r not in outcome]
                if hung:
                    for r in hung:
                        procs[r].kill()
                        outcome[r] = ("error", (
                            f"the process did not join the federation within {start_timeout:g} s of its start "
                            "(hung in its start-up: imports, the fork server, the rendezvous) and was killed by "
                            "the launcher; if the fork server hangs on this machine, try "
                            "VFLTORCH_START_METHOD=spawn", None))
                    stragglers_deadline = time.monotonic()       # the others: stopped at once below
                start_deadline = None
            if stragglers_deadline is None and any(k != "ok" for k, _ in outcome.values()):
                # Someone failed: the others notice within a second or two, or are hung. Don't wait for them.
                stragglers_deadline = time.monotonic() + grace
            if stragglers_deadline is not None and time.monotonic() > stragglers_deadline:
                for r, p in enumerate(procs):
                    if r not in outcome:
                        p.kill()
                        outcome[r] = ("killed", (f"the process did not stop within {grace:g} s after another "
                                               "party failed (hung?) and was killed by the launcher", None))
                break
            try:
                record(results.get(timeout=0.2))
                continue
            except queue_mod.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in outcome and not p.is_alive() and p.exitcode is not None:
                    # It may have reported just before exiting: drain once more before calling it dead.
                    try:
                        while True:
                            record(results.get(timeout=0.5))
                    except queue_mod.Empty:
                        pass
                    if r not in outcome:
                        outcome[r] = ("died", (_death(p.exitcode), None))
    except BaseException:
        # The launcher is stopped (Ctrl-C, SIGTERM) or failed itself: stop every party now.
        _stop_all(procs, STOP_GRACE)
        raise
    finally:
        deadline = time.monotonic() + 5
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        _stop_all(procs, 0.0)
    failed = {r: (k, v) for r, (k, v) in outcome.items() if k != "ok"}
    if failed:
        error = _federation_error(roles, failed)
        if hint and any(kind == "died" for kind, _ in failed.values()):
            error = FederationError(f"{error}\n{hint}", errors=error.errors, root=error.root)
        raise error
    return [pickle.loads(outcome[r][1]) for r in range(world)]


def _start_ignoring_sigint(procs) -> None:
    """Start the parties with SIGINT ignored: a Ctrl-C during their start-up cannot print tracebacks."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:                       # not the main thread
        previous = None
    try:
        for p in procs:
            p.start()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _stop_all(procs, grace: float) -> None:
    """SIGTERM every live party, SIGKILL what is left after ``grace`` seconds, and reap them all."""
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    if grace > 0:
        for p in alive:
            try:
                p.terminate()
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + grace
        for p in alive:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            try:
                p.kill()
            except (OSError, ValueError):
                pass
        p.join(timeout=2)


def _death(exitcode) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the process was killed by {name} without reporting"
    return f"the process exited with code {exitcode} without reporting"


def _federation_error(roles: Roles, failed: dict) -> FederationError:
    # The root cause: a party that raised its own error or died; else the party most failures name.
    roots = [r for r, (kind, _) in sorted(failed.items()) if kind in ("error", "died")]
    named = Counter(party for kind, (_, party) in failed.values() if kind == "failure" and party is not None)
    if named:
        root = named.most_common(1)[0][0]
        if roots and root not in roots:
            root = roots[0]
    else:
        # Parties the launcher killed after someone else failed are never the cause, unless there is no other.
        others = [r for r, (kind, _) in sorted(failed.items()) if kind != "killed"]
        root = roots[0] if roots else (others[0] if others else min(failed))
    lines = [f"{len(failed)} of {roles.world_size} parties failed; the cause is {roles.name(root)}:"]
    for r in [root] + [r for r in sorted(failed) if r != root] if root in failed else sorted(failed):
        lines.append(f"  {roles.name(r)}: {failed[r][1][0].splitlines()[0]}")
    return FederationError("\n".join(lines), errors={r: v[1][0] for r, v in failed.items()}, root=root)
