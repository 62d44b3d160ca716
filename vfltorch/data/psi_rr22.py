"""Row alignment by RR22 PSI (OT extension; Raghuraman and Rindal, CCS 2022) from SecretFlow's ``spu``.

The protocol is libpsi's, in SecretFlow's ``spu`` wheel (Ant Group, Apache-2.0; ``spu/libpsi.so``,
its brpc link in ``spu/libspu.so``): nothing cryptographic is written here. ``spu``'s Python package
imports jax and wants numpy < 2 (neither needed by the two extension modules), so it is installed with
``pip install --no-deps spu==0.9.5`` (the Makefile does) and the two extension modules are loaded
directly from its folder, without running ``spu/__init__.py``.

Input goes through files, as libpsi wants: each party writes ``key,row`` for its IDs to a private
temporary folder (mode 0700, files 0600, deleted afterwards), ``key`` the 128-bit BLAKE2b of
(domain tag, ``canonical_id``) in hex and ``row`` the 0-based row of the party's table. The hash
only gives libpsi a fixed-length, CSV-safe item with the same equality as the IDs (never sent;
libpsi hashes its items again inside the OPRF); ``row`` never leaves the party (libpsi joins the
extra columns locally). libpsi's own temporary folder goes to the same private folder (``TMPDIR``),
its console log to a file there (shown only when it fails), and the trace file it always writes to
``/tmp/psi_<random>.trace`` (span names only, checked by the tests) is deleted.

Protocol between the active party A and each passive party P (A is libpsi's receiver):

1. A and P announce their row counts and PSI listening addresses over the federation's own
   authenticated messages (``fed.send_json``).
2. Round 1, P_1 .. P_k in turn: RR22 with A's current rows against P_i's IDs; only A learns the
   common rows (P_i learns nothing but the sizes), and A keeps only those as its input for the next
   passive party, so A ends with F, the rows common to all parties. With the last passive party the
   result is broadcast (``broadcast_result``), so P_k learns F (its rows of it).
3. Round 2, P_1 .. P_{k-1}: RR22 once more with A's input F, result broadcast: P_i learns F ∩ P_i = F.
   (With two parties there is one PSI.)
4. libpsi's output is sorted by key, identically at both ends of a PSI. A sends each P the permutation
   that puts that sorted list into A's row order, and a 128-bit digest of the sorted keys so that P
   checks both ends hold the same list (both already hold F: it tells nothing new).

Transport. libpsi talks over its own brpc links, not over ``Federation``. Over a TLS federation
(``--federation``) every PSI link is TLS (OpenSSL inside brpc) with the party's identity key and
certificate, and each end trusts only the one certificate the federation file pins for its peer
(verified on both sides: mutual authentication). brpc's server also answers plain TCP on its TLS
port, so libpsi listens on 127.0.0.1 behind a TLS-only gate (``psi_gate.py``) on the party's
``listen`` host from the federation file, on a free port (or ``VFLTORCH_PSI_PORT + peer rank``)
announced over the TLS mesh; the peer dials the host the file names. Over gloo (``--parties Q`` on one machine)
the links are plain TCP on 127.0.0.1 (``VFLTORCH_PSI_HOST`` to change), acceptable only where gloo's
own clear TCP is.

Isolation. libpsi and brpc are native code, and a failed check inside them aborts their process (seen once
between two organisations: ``brpc/controller.cpp:457] Check failed``). So each link and its PSIs run in a child
process (``psi_rr22_worker``, ``LinkWorker``): a crash there stops the party with the signal and spu's log, the
federation tells every other party why, and a party waiting on its own link meanwhile learns of the peer's
failure within half a second instead of libpsi's receive timeout.

Memory: libpsi processes its input in buckets of ``BUCKET`` items; the keys are hashed as they are
written, never held as a list. Measured peaks are in docs/alignment.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

# numpy and torch are imported where used: ``available()`` runs in the launcher's preflight, before any party.

SPU_VERSION = "0.9.5"
DOMAIN = b"vfltorch/psi/rr22/v1\x00"
KEY_BYTES = 16
BUCKET = 1 << 16       # items per libpsi bucket: libpsi streams the input file bucket by bucket
_TRACE_LINE = re.compile(r"Trace has been written to (\S+\.trace)")


class PSIUnavailable(RuntimeError):
    pass


def spu_folder() -> str | None:
    """The installed ``spu`` package's folder if both extension modules are there (imports nothing)."""
    try:
        spec = importlib.util.find_spec("spu")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(spec.origin)
    ok = all(os.path.exists(os.path.join(folder, n + ".so")) for n in ("libspu", "libpsi"))
    return folder if ok else None


def available() -> bool:
    return spu_folder() is not None


_MODULES: dict = {}


def _modules():
    """``(libspu, libpsi)``, loaded from spu's folder without running ``spu/__init__.py`` (which needs jax)."""
    if not _MODULES:
        folder = spu_folder()
        if folder is None:
            raise PSIUnavailable(f"the rr22 PSI engine needs SecretFlow's spu=={SPU_VERSION}: run `make install`, or "
                                 f"`pip install --no-deps spu=={SPU_VERSION}` (Linux x86_64, Python 3.10-3.11); "
                                 f"or pass --psi ecdh")
        for name in ("libspu", "libpsi"):
            spec = importlib.util.spec_from_file_location("spu." + name, os.path.join(folder, name + ".so"))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _MODULES[name] = mod
    return _MODULES["libspu"], _MODULES["libpsi"]


def item_key(v) -> str:
    """The item given to libpsi for ID ``v``: hex BLAKE2b-128 of (domain tag, canonical ID). Never sent."""
    from .ids import canonical_id

    return hashlib.blake2b(DOMAIN + canonical_id(v).encode(), digest_size=KEY_BYTES).hexdigest()


def item_keys(ids) -> list[str]:
    return [item_key(v) for v in ids]


def _private_file(path: Path):
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w")


def _write_input(path: Path, ids, rows) -> None:
    """``key,row`` for ``rows`` of ``ids``, written in blocks (the keys are not kept in memory)."""
    with _private_file(path) as f:
        f.write("key,row\n")
        for s in range(0, len(rows), 1 << 16):
            f.write("".join(f"{item_key(ids[r])},{r}\n" for r in rows[s:s + (1 << 16)].tolist()))


def _read_output(path: Path) -> tuple:
    """libpsi's result file: (rows in its sorted order, a 128-bit digest of their keys in that order)."""
    import numpy as np

    rows, digest = [], hashlib.blake2b(digest_size=16)
    with open(path) as f:
        header = [h.strip().strip('"') for h in f.readline().strip().split(",")]
        if header[:2] != ["key", "row"] and header[:2] != ["row", "key"]:
            raise RuntimeError(f"unexpected PSI output header {header}")
        ki, ri = header.index("key"), header.index("row")
        for line in f:
            cols = line.rstrip("\n").split(",")
            if len(cols) < 2:
                continue
            digest.update(cols[ki].strip('"').encode() + b"\n")
            rows.append(int(cols[ri].strip('"')))
    return np.asarray(rows, dtype=np.int64), digest.hexdigest()


class Workspace:
    """A private folder (0700) for libpsi's files; removed, with libpsi's trace files, on exit."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="vfltorch-psi-"))
        os.chmod(self.path, 0o700)
        self.log = self.path / "spu.log"
        self._count = 0
        self.gates: dict = {}        # peer -> (TLS-only gate process, loopback port of libpsi's listener)
        self.workers: list = []      # the libpsi processes (LinkWorker), ended with the workspace

    def file(self, stem: str) -> Path:
        self._count += 1
        return self.path / f"{self._count:03d}-{stem}.csv"

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [ln for ln in text if "error" in ln.lower() or "what:" in ln] or text
        return "\n".join(keep[-lines:])

    def trace_files(self) -> list[str]:
        """The trace files libpsi wrote for this party's runs (it names each in its log)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [t for t in _TRACE_LINE.findall(text) if t.startswith("/tmp/psi_")]

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()
        for gate, _ in self.gates.values():
            gate.kill()
            gate.wait()
            gate.stdin.close()
            gate.stdout.close()
        traces = self.trace_files()
        shutil.rmtree(self.path, ignore_errors=True)
        for t in traces:
            with contextlib.suppress(OSError):
                os.unlink(t)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------- links
def _tls_spec(fed):
    spec = getattr(fed.transport, "spec", None)
    return spec if spec is not None and getattr(fed.transport, "identity", None) is not None else None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_address(fed, peer: int, work: Workspace) -> str:
    """Where this party's libpsi listens for its link with ``peer``; its port is announced to ``peer``.

    Over TLS: a TLS-only gate (``psi_gate.py``) on the ``listen`` host of the federation file, port
    ``VFLTORCH_PSI_PORT + peer`` if that is set (a port range to open in a firewall), else a free one;
    libpsi's own listener is on 127.0.0.1 behind it. Over gloo: ``VFLTORCH_PSI_HOST`` or 127.0.0.1, a
    free port."""
    spec = _tls_spec(fed)
    if spec is not None:
        import subprocess
        import sys

        host = spec.parties[fed.rank].listen_host
        base = os.environ.get("VFLTORCH_PSI_PORT")
        inner = _free_port("127.0.0.1")
        gate = subprocess.Popen([sys.executable, str(Path(__file__).with_name("psi_gate.py")), host,
                                 str(int(base) + peer if base else 0), str(inner)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        work.gates[peer] = (gate, inner)
        line = gate.stdout.readline().strip()
        if not line.isdigit():
            from .ids import PSIError

            raise PSIError(f"the PSI gate could not listen on {host} (port {base or 'any'}): see its error above")
        return f"{host}:{int(line)}"
    host = os.environ.get("VFLTORCH_PSI_HOST", "127.0.0.1")
    return f"{host}:{_free_port(host)}"


def _peer_address(fed, peer: int, announced: str) -> str:
    """Where to dial ``peer``: over TLS its host from the federation file and the port it announced over the
    authenticated mesh; over gloo the announced address."""
    from .ids import PSIError

    host, _, port = announced.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise PSIError(f"{fed.name(peer)} announced a malformed PSI address")
    spec = _tls_spec(fed)
    if spec is not None:
        return f"{spec.parties[peer].host}:{port}"
    return announced


class LinkWorker:
    """One libpsi link and its PSIs in a child process (``psi_rr22_worker``): a crash inside the native code ends
    that process, not the party, which then stops with the signal and spu's log, and its peers learn why."""

    def __init__(self, fed, work: Workspace, desc: dict, rank: int, peer: int):
        import subprocess
        import sys

        self.rank, self.work, self.where, self.fed, self.peer = rank, work, fed.name(), fed, peer
        env = {**os.environ, "TMPDIR": str(work.path)}          # libpsi's bucket files: the private folder
        self.proc = subprocess.Popen([sys.executable, "-m", "vfltorch.data.psi_rr22_worker", str(work.log)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        work.workers.append(self)
        self.call({"op": "open", "desc": desc, "rank": rank})

    def call(self, cmd: dict) -> None:
        """Send one command and wait for its answer; meanwhile, a peer that reports its own failure (its worker
        crashed, say) stops this party at once with that reason instead of libpsi's receive timeout."""
        import json
        import select

        from .ids import PSIError

        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            while not select.select([self.proc.stdout], [], [], 0.5)[0]:
                self.fed.raise_if_peer_failed(self.peer)
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise PSIError(self._crash())
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(str(reply["error"]))

    def _crash(self) -> str:
        import signal

        try:
            code = self.proc.wait(timeout=10)
        except Exception:                         # noqa: BLE001 - still running: stop it
            self.proc.kill()
            code = self.proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        tail = self.work.log_tail()
        return (f"the rr22 PSI's native code (spu {SPU_VERSION}: libpsi / brpc) crashed at {self.where} ({how}); "
                f"nothing was aligned. Run again, or align with --psi ecdh"
                + (f"\nspu's log:\n{tail}" if tail else ""))

    def stop_link(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"op": "stop"})
            except Exception:                     # noqa: BLE001 - it is being stopped anyway
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def open_link(fed, peer: int, mine: str, theirs: str, work: Workspace) -> LinkWorker:
    """A two-party libpsi link (rank 0 the active party, rank 1 the passive one), in its own process."""
    if peer in work.gates:     # TLS: libpsi listens on loopback behind the TLS-only gate announced as ``mine``
        mine = f"127.0.0.1:{work.gates[peer][1]}"
    addrs = [mine, theirs] if fed.is_active else [theirs, mine]
    desc = {"id": "vfltorch-psi", "recv_timeout_ms": int(fed.timeout * 1000), "connect_retry_interval_ms": 500,
            "connect_retry_times": max(10, int(math.ceil(fed.timeout * 2))), "active": addrs[0],
            "passive": addrs[1]}
    spec = _tls_spec(fed)
    if spec is not None:
        pin = work.path / f"pin-{peer}.crt"
        with _private_file(pin) as f:
            f.write(spec.parties[peer].certificate)
        desc["ssl"] = {"key": str(fed.transport.identity.path), "pin": str(pin)}
    return LinkWorker(fed, work, desc, 0 if fed.is_active else 1, peer)


def run_psi(lctx: LinkWorker, work: Workspace, ids, rows, *, broadcast: bool):
    """One RR22 run on ``lctx`` (receiver: the active party, link rank 0). Returns (rows, key digest) of the
    result in libpsi's sorted order where this party gets it, else None."""
    src, out = work.file("in"), work.file("out")
    _write_input(src, ids, rows)
    lctx.call({"op": "run", "src": str(src), "out": str(out), "broadcast": bool(broadcast), "bucket": BUCKET})
    if not (lctx.rank == 0 or broadcast):
        return None
    return _read_output(out)        # the files stay in the private folder until the Workspace removes it


# ---------------------------------------------------------------------------------------------- protocol
def align_rows(fed, ids) -> tuple:
    """As ``psi.align_rows`` (rows in the active party's order, counts), by RR22 (module docstring)."""
    from .ids import PSIError

    if not available():
        raise PSIUnavailable(f"the rr22 PSI engine needs SecretFlow's spu=={SPU_VERSION}: run `make install`, or "
                             f"`pip install --no-deps spu=={SPU_VERSION}` (Linux x86_64, Python 3.10-3.11); "
                             f"or pass --psi ecdh")
    n = len(ids)
    with Workspace() as work:
        try:
            with fed.phase("data/psi"):
                if fed.is_active:
                    return _active(fed, ids, n, work)
                return _passive(fed, ids, n, work)
        except RuntimeError as exc:
            if isinstance(exc, PSIError):
                raise
            detail = str(exc).strip().splitlines()
            tail = work.log_tail()
            raise PSIError(f"the rr22 PSI (spu {SPU_VERSION}) failed at {fed.name()}: "
                           f"{' '.join(detail[:2])}" + (f"\nspu's log:\n{tail}" if tail else "")) from exc


def _active(fed, ids, n, work):
    import numpy as np
    import torch

    from .ids import PSIError

    peers = [p for p in fed.parties if p != fed.rank]
    sizes = {str(fed.rank): n}
    links, results = {}, {}
    current = np.arange(n, dtype=np.int64)
    for i, peer in enumerate(peers):                  # round 1: A's rows common with every passive party so far
        last = i == len(peers) - 1
        hello = fed.recv_json(peer)
        if not (isinstance(hello, dict) and isinstance(hello.get("rows"), int) and isinstance(hello.get("address"), str)):
            raise PSIError(f"{fed.name(peer)} sent a malformed PSI hello")
        sizes[str(peer)] = hello["rows"]
        run = len(current) > 0 and hello["rows"] > 0
        mine = listen_address(fed, peer, work) if run else ""
        fed.send_json({"rows": n, "address": mine, "run": run, "broadcast": last}, peer)
        if not run:
            current = current[:0]
            continue
        links[peer] = open_link(fed, peer, mine, _peer_address(fed, peer, hello["address"]), work)
        rows, got = run_psi(links[peer], work, ids, current, broadcast=last)
        current = np.sort(rows)
        if last:
            results[peer] = (rows, got)
    final = current
    for peer in peers[:-1]:                           # round 2: the earlier passive parties learn F only
        if peer not in links:
            continue
        run = len(final) > 0
        fed.send_json({"run": run}, peer)
        if run:
            results[peer] = run_psi(links[peer], work, ids, final, broadcast=True)
    for lctx in links.values():
        lctx.stop_link()
    for peer in peers:
        if peer in results and len(final):
            rows, got = results[peer]
            if not np.array_equal(np.sort(rows), final):
                raise PSIError("the rr22 PSI returned different final rows in two runs")
            order = np.argsort(rows, kind="stable")    # libpsi's sorted list -> A's row order
            fed.send_json({"aligned": int(len(final)), "digest": got}, peer)
            fed.send_tensor(torch.from_numpy(order.astype(np.int64)), peer)
        else:
            fed.send_json({"aligned": 0, "digest": ""}, peer)
    return final, {"rows": sizes, "aligned": int(len(final))}


def _passive(fed, ids, n, work):
    import numpy as np

    from .ids import PSIError

    active = fed.active
    mine = listen_address(fed, active, work)
    fed.send_json({"rows": n, "address": mine}, active)
    plan = fed.recv_json(active)
    if not (isinstance(plan, dict) and isinstance(plan.get("rows"), int) and isinstance(plan.get("run"), bool)):
        raise PSIError("the active party sent a malformed PSI plan")
    result, lctx = None, None
    all_rows = np.arange(n, dtype=np.int64)
    if plan["run"]:
        lctx = open_link(fed, active, mine, _peer_address(fed, active, str(plan.get("address", ""))), work)
        result = run_psi(lctx, work, ids, all_rows, broadcast=bool(plan["broadcast"]))
        if not plan["broadcast"]:
            again = fed.recv_json(active)
            if isinstance(again, dict) and again.get("run") is True:
                result = run_psi(lctx, work, ids, all_rows, broadcast=True)
        lctx.stop_link()
    done = fed.recv_json(active)
    if not (isinstance(done, dict) and isinstance(done.get("aligned"), int)):
        raise PSIError("the active party sent a malformed PSI result")
    counts = {"rows": {str(fed.rank): n}, "aligned": done["aligned"]}
    if done["aligned"] == 0:
        return all_rows[:0], counts
    order = fed.recv_tensor(active, device="cpu").numpy()
    if result is None:
        raise PSIError("the active party announced an intersection this party's PSI did not produce")
    rows, got = result
    m = len(rows)
    if order.dtype != np.int64 or order.ndim != 1 or len(order) != m or m != done["aligned"] or \
            not np.array_equal(np.sort(order), np.arange(m)):
        raise PSIError("the active party sent a malformed row order")
    if got != done.get("digest"):
        raise PSIError("the two ends of the rr22 PSI hold different intersections (digest mismatch)")
    return rows[order], counts
