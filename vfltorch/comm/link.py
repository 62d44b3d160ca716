"""Links between organisations: mutually authenticated TLS 1.3 with pinned certificates.

``connect_federation(file, party, identity)`` turns a federation file (see
``federation_file.py``) and this organisation's identity (``identity.py``) into
the same ``Federation`` handle the gloo path gives, so every method runs on it
unchanged: ``send`` / ``recv`` / ``sendrecv`` / ``barrier`` go through a
``TLSMesh`` instead of ``torch.distributed``.

The mesh. Each party listens on the address the file gives it (a concrete
interface, never a wildcard) and dials every other party. Each ordered pair
(i -> j) has its own connection, which i only writes and j only reads, so no
TLS object is ever used by two threads and ``sendrecv`` (rings) cannot
deadlock. Both ends present their certificate (TLS 1.3, no session tickets,
no resumption); a dialling party trusts only the certificate pinned for the
party it dials, a listening party only certificates listed in the file, and
both then compare the SHA-256 fingerprint with the file's pin for that exact
rank. A hello frame carries the digest of the federation file, so two
organisations holding different files stop at once instead of computing
garbage. An outsider who dials a listener is refused and logged; the run goes
on (it can cost availability, nothing else). When every peer has dialled in
the listener closes.

Frames. Every message is ``magic | sequence number | kind | dtype | byte
count`` followed by the raw tensor bytes (nothing is ever unpickled). The
receiver checks magic, kind, dtype and byte count against what it expects
(and the byte count against ``max_message_bytes``) *before* allocating, and
the sequence number against its own count: TLS already rejects tampered,
replayed, reordered or truncated records within a connection; the number
catches any frame that is out of protocol. Every such failure raises
``LinkError`` naming the link and stops the run.

Liveness apart from progress. Once joined, a background thread sends a heartbeat frame (no payload) on every
outgoing link that has been idle for a quarter of the timeout (at most 5 s); the receiver skips heartbeats.
So a read times out only after ``--timeout`` seconds of *silence*: a peer that is alive but slow (a busy
machine, a long local step, a slow link) keeps its links warm and is waited for, while a dead peer's
connection closes at once and a frozen or cut-off one falls silent and is named after ``--timeout`` seconds.
The writer of each link holds its lock for a whole frame, so heartbeats never split a message.
A party that stops sends an abort frame with its reason instead (``abort``).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import ssl
import struct
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import torch

from .errors import PartyFailure
from .federation_file import FederationSpec, PartyEntry, load as load_federation_file
from .identity import Identity, fingerprint_der
from .start import party_threads

log = logging.getLogger(__name__)

_FRAME = struct.Struct("!4sQBBxxQ")   # magic, sequence, kind, dtype code, byte count
_MAGIC = b"VFL1"
_HELLO = struct.Struct("!32sI")       # federation digest, rank
KIND_DATA, KIND_BARRIER, KIND_HELLO, KIND_ABORT, KIND_HEARTBEAT = 1, 2, 3, 4, 5
_KIND_NAMES = {KIND_DATA: "data", KIND_BARRIER: "barrier", KIND_HELLO: "hello", KIND_ABORT: "abort",
               KIND_HEARTBEAT: "heartbeat"}
_HEARTBEAT_MAX_SECONDS = 5.0   # heartbeats at least this often on an idle link (a quarter of the timeout if less)
# An abort frame carries JSON {"party": rank, "reason": text}: why a party stops, so that its peers name the
# party and the reason instead of a closed connection or a timeout (issue 33). At most this many bytes.
_ABORT_MAX = 4096
_ABORT_SEND_SECONDS = 2.0     # a peer that does not take the abort frame this fast is not waited for
_ABORT_DIAL_SECONDS = 8.0     # a party that cannot listen dials its peers this long to tell them why
_HANDSHAKE_GRACE = 3.0        # after a broken-off handshake, how long to wait for the peer's own abort
# A party that cannot prove who it is (its key is not the one the file pins for it) cannot open a TLS link to say
# why it stops. It sends a *notice* instead, in the clear, before any TLS: magic, 2-byte length, JSON {"party":
# name, "reason": text}. A listener believes a notice only from an address the federation file gives that party
# (an off-path stranger cannot complete a TCP handshake from it), only while that party has not joined, and
# only to stop waiting for it: it names the party and the reason, marked as unauthenticated.
_NOTICE_MAGIC = b"VFLN"
_NOTICE_MAX = 2048
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}
_HANDSHAKE_SECONDS = 10.0
_SMALL = 1 << 16


class LinkError(PartyFailure):
    """A link failed its security checks (handshake, pin, integrity, order, limits): the run stops."""


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODE.get(dtype, 255)


def _server_context(identity: Identity, spec: FederationSpec) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(identity.path))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata="".join(p.certificate for p in spec.parties))
    ctx.num_tickets = 0   # no resumption: every connection proves its key afresh
    return ctx


def _client_context(identity: Identity, peer: PartyEntry) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False   # we pin the certificate itself, not a name
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=peer.certificate)
    ctx.load_cert_chain(str(identity.path))
    return ctx


def _addresses_of(host: str) -> set:
    """The IP addresses ``host`` (a name or an address from the federation file) stands for."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}


def _recv_exact(sock, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError("Connection closed by the peer")
        got += k


def _byte_view(t: torch.Tensor) -> memoryview:
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class TLSMesh:
    """One party's TLS links to every other party of a federation file."""

    def __init__(self, spec: FederationSpec, me: PartyEntry, identity: Identity, *, timeout: float,
                 join_timeout: float | None = None):
        self.spec, self.me, self.identity = spec, me, identity
        self.timeout = float(timeout)
        self.join_timeout = self.timeout if join_timeout is None else float(join_timeout)
        if identity.fingerprint != me.fingerprint:
            why = (f"the identity {identity.path} (fingerprint {identity.fingerprint}) is not the one the "
                   f"federation file pins for party {me.name!r} ({me.fingerprint}): pass that party's own key "
                   f"file, or fix the file")
            # The peers cannot authenticate this process: tell them in a notice, so that they stop waiting.
            self._notify_peers(f"its key is not the one the federation file pins for it ({identity.fingerprint} "
                               f"instead of {me.fingerprint}): it needs its own key file, or a new entry in the file")
            raise LinkError(why, reporter=me.rank, phase="join")
        self.max_message_bytes = spec.max_message_bytes
        self.out: dict[int, ssl.SSLSocket] = {}
        self.inc: dict[int, ssl.SSLSocket] = {}
        self.sent_seq: dict[int, int] = {}
        self.recv_seq: dict[int, int] = {}
        self.refused: list[str] = []
        self._fatal: PartyFailure | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._digest = bytes.fromhex(spec.digest)
        self._sender: ThreadPoolExecutor | None = None
        self._send_locks: dict[int, threading.Lock] = {}     # one writer at a time per outgoing link
        self._stashed: dict[int, tuple[int, int, int]] = {}  # a header read while joining, for the next recv
        self._last_sent: dict[int, float] = {}
        self._stop_heartbeats = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ---------------------------------------------------------------- naming
    def link_name(self, src: int, dst: int) -> str:
        a, b = self.spec.parties[src], self.spec.parties[dst]
        return f"link {a.name} (rank {src}) -> {b.name} (rank {dst}, {b.address})"

    def _err(self, text: str, peer: int | None) -> LinkError:
        return LinkError(text, party=peer, reporter=self.me.rank, phase="link")

    # ------------------------------------------------------------------ set-up
    def connect(self) -> None:
        peers = [p for p in self.spec.parties if p.rank != self.me.rank]
        if not peers:
            return
        try:
            self._listener = socket.create_server((self.me.listen_host, self.me.listen_port), backlog=64)
        except OSError as exc:
            self._cannot_listen(exc, peers)
        acceptor = threading.Thread(target=self._accept_loop, name="vfl-tls-accept", daemon=True)
        acceptor.start()
        deadline = time.monotonic() + self.join_timeout
        try:
            for peer in peers:
                self._dial(peer, deadline)
            while True:
                self._poll_aborts()
                with self._lock:
                    if self._fatal is not None:
                        raise self._fatal
                    missing = [p for p in peers if p.rank not in self.inc]
                if not missing:
                    break
                if time.monotonic() > deadline:
                    names = ", ".join(f"{p.name} (rank {p.rank})" for p in missing)
                    why = f"; refused meanwhile: {'; '.join(self.refused[-3:])}" if self.refused else ""
                    raise PartyFailure(f"{names} never dialled {self.me.name} within {self.join_timeout:g} s{why}",
                                       party=missing[0].rank, reporter=self.me.rank, phase="join")
                time.sleep(0.02)
            self._start_heartbeats()
        except PartyFailure as exc:
            # A reason this party knows (another federation file, a refused certificate) or was told (an abort):
            # tell every peer already linked, so that none of them waits out its timeout to report a closed
            # connection. A link check names this party as the one stopping; a peer's abort is passed on.
            # (A link check that failed on one peer - a wrong certificate at its address - is not told to that
            # peer: whatever answers there is not it.)
            failed = exc.party if isinstance(exc, LinkError) else None
            self._tell_everyone(str(exc), self.me.rank if isinstance(exc, LinkError) else exc.party,
                                [p for p in peers if p.rank != failed])
            raise
        finally:
            self._close_listener()

    def _start_heartbeats(self) -> None:
        if self._heartbeat is None and self.out:
            self._heartbeat = threading.Thread(target=self._heartbeats, name="vfl-tls-heartbeat", daemon=True)
            self._heartbeat.start()

    def _heartbeats(self) -> None:
        """Keep every idle outgoing link warm (see the module docstring): a heartbeat when nothing was sent for
        a quarter of the timeout. A link whose writer is busy is skipped: its data is the sign of life."""
        while not self._stop_heartbeats.is_set():
            interval = max(0.05, min(self.timeout / 4, _HEARTBEAT_MAX_SECONDS))
            self._stop_heartbeats.wait(interval / 2)
            now = time.monotonic()
            for dst in list(self.out):
                lock = self._send_locks.get(dst)
                if lock is None or now - self._last_sent.get(dst, now) < interval:
                    continue
                if not lock.acquire(blocking=False):
                    continue
                try:
                    if dst in self.out and not self._stop_heartbeats.is_set():
                        self._write_frame(dst, KIND_HEARTBEAT, None)
                except Exception:                 # noqa: BLE001 - the main thread meets the broken link itself
                    pass
                finally:
                    lock.release()

    def _cannot_listen(self, exc: OSError, peers) -> None:
        """This party cannot listen where the federation file says (a port in use, an address not of this
        machine): dial the peers for a few seconds to tell them why, then stop with a clear message."""
        import errno

        where = f"{self.me.listen_host}:{self.me.listen_port}"
        if exc.errno == errno.EADDRINUSE:
            why = (f"{self.me.name} cannot listen on {where}: the port is in use by another process (a second run, "
                   f"or another service): stop it, or give {self.me.name} another port in the federation file")
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = (f"{self.me.name} cannot listen on {where}: this machine has no such address; give its own "
                   f"address (or a \"listen\" entry) in the federation file")
        else:
            why = f"{self.me.name} cannot listen on {where} ({exc.strerror or exc})"
        self._tell_everyone(why, self.me.rank, peers)
        raise LinkError(why, party=self.me.rank, reporter=self.me.rank, phase="join")

    def _tell_everyone(self, reason: str, party: int | None, peers) -> None:
        """Stopping while joining: dial the peers not linked yet (for a few seconds) and send every linked peer
        an abort frame, so that each of them names ``party`` and ``reason`` instead of waiting out its timeout."""
        deadline = time.monotonic() + min(_ABORT_DIAL_SECONDS, self.join_timeout)
        for peer in peers:
            if peer.rank in self.out or peer.rank == party:     # (the party that stops is not told its own news)
                continue
            try:
                self._dial(peer, deadline)
            except Exception:                     # noqa: BLE001 - unreachable or refusing: it learns otherwise
                continue
        self.abort(reason, party)

    def abort(self, reason: str, party: int | None = None) -> None:
        """Send every linked peer an abort frame naming ``party`` (default: this one) and ``reason``; best effort,
        bounded by a short timeout per peer (a dead peer is not waited for)."""
        import json

        body = json.dumps({"party": self.me.rank if party is None else int(party),
                           "reason": reason[:_ABORT_MAX // 2]}).encode()[:_ABORT_MAX]
        payload = torch.frombuffer(bytearray(body), dtype=torch.uint8) if body else None
        for dst, sock in list(self.out.items()):
            try:
                sock.settimeout(_ABORT_SEND_SECONDS)
                self._send_frame(dst, KIND_ABORT, payload)
            except Exception:                     # noqa: BLE001 - the peer may be gone: nothing more to do
                pass

    def poll_aborts(self) -> None:
        """Raise the failure a linked peer announced with an abort frame, if one has arrived (without blocking:
        a data frame that arrived first is kept for the recv that takes it). Used while joining, and by a party
        that waits on something other than the mesh (``Federation.raise_if_peer_failed``)."""
        self._poll_aborts()

    def _poll_aborts(self) -> None:
        """While joining: an abort frame already sent by a linked peer (it stopped during its own join)."""
        import select

        with self._lock:
            links = {r: s for r, s in self.inc.items() if r not in self._stashed}
        for src, sock in links.items():
            try:
                ready = sock.pending() > 0 or bool(select.select([sock], [], [], 0)[0])
            except (OSError, ValueError):
                continue
            if not ready:
                continue
            name = self.link_name(src, self.me.rank)
            try:
                kind, code, nbytes = self._read_head(src, sock, name, skip_heartbeats=False)
            except (OSError, ssl.SSLError):
                continue                          # closed: the join names it
            if kind == KIND_HEARTBEAT:
                continue
            if kind == KIND_ABORT:
                raise self._abort_from(src, sock, nbytes, name)
            # A peer that has joined already sent its first message: keep the header for the recv that takes it.
            self._stashed[src] = (kind, code, nbytes)

    def _abort_from(self, src: int, sock, nbytes: int, name: str):
        """The error an abort frame from ``src`` stands for: a PartyFailure naming the party and its reason."""
        import json

        if not 0 < nbytes <= _ABORT_MAX:
            return self._err(f"{name}: an abort frame of {nbytes} bytes", src)
        raw = bytearray(nbytes)
        _recv_exact(sock, memoryview(raw))
        try:
            doc = json.loads(raw.decode())
            party, reason = int(doc["party"]), str(doc["reason"])
        except (ValueError, KeyError, TypeError):
            return self._err(f"{name}: a malformed abort frame", src)
        if not 0 <= party < len(self.spec.parties):
            party = src
        who = self.spec.parties[party]
        via = "" if party == src else f" (told by {self.spec.parties[src].name})"
        return PartyFailure(f"party {who.name} (rank {party}) stopped{via}: {reason}", party=party,
                            reporter=self.me.rank, phase="link")

    def _close_listener(self):
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
            self._listener = None

    def _dial(self, peer: PartyEntry, deadline: float) -> None:
        ctx = _client_context(self.identity, peer)
        name = self.link_name(self.me.rank, peer.rank)
        while True:
            try:
                raw = socket.create_connection((peer.host, peer.port), timeout=_HANDSHAKE_SECONDS)
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small protocol messages: no Nagle
                break
            except OSError as exc:
                with self._lock:
                    if self._fatal is not None:       # our listener learnt the real cause meanwhile
                        raise self._fatal from None
                self._poll_aborts()                   # a linked peer said why it stops
                if time.monotonic() > deadline:
                    raise PartyFailure(f"{name}: {peer.name} is not reachable within {self.join_timeout:g} s "
                                       f"({exc})", party=peer.rank, reporter=self.me.rank, phase="join") from None
                time.sleep(0.1)
        try:
            tls = ctx.wrap_socket(raw, server_side=False)
            fp = fingerprint_der(tls.getpeercert(binary_form=True))
            if fp != peer.fingerprint:   # cannot happen with the context above; checked anyway
                raise ssl.SSLError(f"certificate {fp} is not the pinned {peer.fingerprint}")
            tls.sendall(_FRAME.pack(_MAGIC, 0, KIND_HELLO, 0, _HELLO.size) + _HELLO.pack(self._digest, self.me.rank))
            self._read_hello(tls, peer.rank, name)
        except ssl.SSLCertVerificationError as exc:
            raw.close()
            raise self._err(f"{name}: the process at {peer.address} did not present {peer.name}'s pinned "
                            f"certificate ({exc.verify_message}); refusing to talk to it", peer.rank) from None
        except (ssl.SSLError, OSError) as exc:
            raw.close()
            # Something at the peer's address broke the handshake off: give a peer that stops for a reason of its
            # own (it cannot listen there, say) a moment to dial in and say so before blaming certificates.
            until = min(deadline, time.monotonic() + _HANDSHAKE_GRACE)
            while True:
                with self._lock:
                    if self._fatal is not None:   # our listener already knows the real cause
                        raise self._fatal from None
                self._poll_aborts()
                if time.monotonic() >= until:
                    break
                time.sleep(0.05)
            raise self._err(f"{name}: TLS handshake failed ({exc}); {peer.name} refused this party's certificate "
                            "or the connection was tampered with", peer.rank) from None
        tls.settimeout(self.timeout)
        self._send_locks[peer.rank] = threading.Lock()
        self._last_sent[peer.rank] = time.monotonic()
        self.out[peer.rank] = tls
        self.sent_seq[peer.rank] = 1

    def _read_hello(self, tls, peer_rank: int, name: str) -> None:
        head = bytearray(_FRAME.size + _HELLO.size)
        _recv_exact(tls, memoryview(head))
        magic, seq, kind, _, nbytes = _FRAME.unpack_from(head)
        if magic != _MAGIC or kind != KIND_HELLO or seq != 0 or nbytes != _HELLO.size:
            raise self._err(f"{name}: the peer's first frame is not a hello", peer_rank)
        digest, rank = _HELLO.unpack_from(head, _FRAME.size)
        if rank != peer_rank:
            raise self._err(f"{name}: the peer claims rank {rank} but holds the certificate of rank {peer_rank}",
                            peer_rank)
        if digest != self._digest:
            raise self._err(f"{name}: {self.spec.parties[peer_rank].name} holds a different federation file "
                            "(addresses, roles, pins or limits differ): every party must use the same file",
                            peer_rank)

    def _notify_peers(self, reason: str) -> None:
        """Send every peer a notice (module constants) saying why this party cannot join; each peer is dialled
        for a few seconds (it may start later), all at once. Best effort: a peer that never listens learns
        nothing and names this party when its join timeout ends."""
        import json

        body = json.dumps({"party": self.me.name, "reason": reason[:_NOTICE_MAX // 2]}).encode()[:_NOTICE_MAX]
        notice = _NOTICE_MAGIC + struct.pack("!H", len(body)) + body
        deadline = time.monotonic() + min(_ABORT_DIAL_SECONDS, self.join_timeout)

        def tell(peer):
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection((peer.host, peer.port), timeout=1.0) as sock:
                        sock.sendall(notice)
                        return
                except OSError:
                    time.sleep(0.1)

        threads = [threading.Thread(target=tell, args=(p,), daemon=True)
                   for p in self.spec.parties if p.rank != self.me.rank]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _read_notice(self, raw, addr) -> None:
        """A notice on an incoming connection (``_NOTICE_MAGIC``): believed from the named party's own address,
        while it has not joined; then this party stops waiting and names it and the reason."""
        import json

        raw.settimeout(_HANDSHAKE_SECONDS)
        try:
            head = bytearray(len(_NOTICE_MAGIC) + 2)
            _recv_exact(raw, memoryview(head))
            (size,) = struct.unpack_from("!H", head, len(_NOTICE_MAGIC))
            if size > _NOTICE_MAX:
                raise ValueError(f"a notice of {size} bytes")
            body = bytearray(size)
            _recv_exact(raw, memoryview(body))
            doc = json.loads(body.decode())
            name, reason = str(doc["party"]), str(doc["reason"])
        except (OSError, ValueError, KeyError, TypeError, ConnectionError) as exc:
            self._refuse(addr, f"a malformed notice ({exc})")
            return
        finally:
            raw.close()
        reason = "".join(c if c.isprintable() else " " for c in reason)[:_NOTICE_MAX // 2]
        peer = next((p for p in self.spec.parties if p.name == name and p.rank != self.me.rank), None)
        if peer is None:
            self._refuse(addr, "a notice from no party of the federation file")
            return
        if addr[0] not in _addresses_of(peer.host):
            self._refuse(addr, f"a notice claiming to be {peer.name} from an address that is not {peer.name}'s "
                               f"({peer.host}): ignored")
            return
        with self._lock:
            if peer.rank in self.inc or self._fatal is not None:
                return
            log.warning("%s: %s (rank %d) says it cannot join: %s", self.me.name, peer.name, peer.rank, reason)
            self._fatal = PartyFailure(f"party {peer.name} (rank {peer.rank}) cannot join: {reason} (its notice is "
                                       f"unauthenticated; it came from {addr[0]}, {peer.name}'s address in the "
                                       f"federation file)", party=peer.rank, reporter=self.me.rank, phase="join")

    def _accept_loop(self) -> None:
        ctx = _server_context(self.identity, self.spec)
        listener = self._listener
        if listener is None:
            return       # the mesh was closed before this thread ran (a run that stopped at once)
        while True:
            try:
                raw, addr = listener.accept()
            except OSError:
                return   # closed: every peer has dialled in, or the run stopped
            threading.Thread(target=self._handshake_incoming, args=(ctx, raw, addr), daemon=True).start()

    def _refuse(self, addr, why: str) -> None:
        note = f"{addr[0]}:{addr[1]} ({why})"
        log.warning("%s refused a connection from %s", self.me.name, note)
        with self._lock:
            self.refused.append(note)

    def _handshake_incoming(self, ctx, raw, addr) -> None:
        raw.settimeout(_HANDSHAKE_SECONDS)
        try:
            first = raw.recv(len(_NOTICE_MAGIC), socket.MSG_PEEK | socket.MSG_WAITALL)
        except OSError:
            first = b""
        if first == _NOTICE_MAGIC:
            self._read_notice(raw, addr)
            return
        try:
            tls = ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            raw.close()
            self._refuse(addr, f"TLS handshake failed: {exc}")
            return
        try:
            fp = fingerprint_der(tls.getpeercert(binary_form=True))
            rank = self.spec.rank_of_fingerprint(fp)
            if rank is None or rank == self.me.rank:
                raise ssl.SSLError(f"certificate {fp} is pinned for no peer")
            with self._lock:
                if rank in self.inc:
                    raise ssl.SSLError(f"rank {rank} has already dialled in")
            name = self.link_name(rank, self.me.rank)
            # Hello first, both ways: a dialler holding another file learns it from our digest too.
            tls.sendall(_FRAME.pack(_MAGIC, 0, KIND_HELLO, 0, _HELLO.size) + _HELLO.pack(self._digest, self.me.rank))
            self._read_hello(tls, rank, name)
        except LinkError as exc:
            tls.close()
            with self._lock:   # an authenticated peer with another file: a real misconfiguration, stop
                self._fatal = exc
            return
        except (ssl.SSLError, OSError, ConnectionError) as exc:
            tls.close()
            self._refuse(addr, str(exc))
            return
        tls.settimeout(self.timeout)
        with self._lock:
            self.inc[rank] = tls
            self.recv_seq[rank] = 1

    # --------------------------------------------------------------- messages
    def _send_frame(self, dst: int, kind: int, t: torch.Tensor | None) -> None:
        lock = self._send_locks.get(dst)
        if lock is None:
            return self._write_frame(dst, kind, t)
        with lock:
            return self._write_frame(dst, kind, t)

    def _write_frame(self, dst: int, kind: int, t: torch.Tensor | None) -> None:
        sock = self.out[dst]
        view = _byte_view(t) if t is not None else memoryview(b"")
        seq = self.sent_seq[dst]
        self.sent_seq[dst] = seq + 1
        code = _dtype_code(t.dtype) if t is not None else 0
        head = _FRAME.pack(_MAGIC, seq, kind, code, len(view))
        try:
            if len(view) <= _SMALL:   # one TLS record (and one syscall) for header + payload of small messages
                sock.sendall(b"".join((head, view)))
            else:
                sock.sendall(head)
                sock.sendall(view)
            self._last_sent[dst] = time.monotonic()
        except ssl.SSLError as exc:
            raise self._err(f"{self.link_name(self.me.rank, dst)}: TLS failure while sending ({exc})", dst) from None
        except socket.timeout:
            raise RuntimeError(f"Timed out sending on {self.link_name(self.me.rank, dst)}") from None
        except OSError as exc:
            raise RuntimeError(f"Connection reset on {self.link_name(self.me.rank, dst)}: {exc}") from None

    def _recv_frame(self, src: int, kind: int, dtype: torch.dtype | None, shape) -> torch.Tensor | None:
        sock = self.inc[src]
        name = self.link_name(src, self.me.rank)
        try:
            got_kind, code, nbytes = self._stashed.pop(src, None) or self._read_head(src, sock, name)
            if got_kind == KIND_ABORT:
                raise self._abort_from(src, sock, nbytes, name)
            if got_kind != kind:
                raise self._err(f"{name}: expected a {_KIND_NAMES.get(kind)} frame, got "
                                f"{_KIND_NAMES.get(got_kind, got_kind)}: the parties are out of step", src)
            if dtype is None:
                if nbytes:
                    raise self._err(f"{name}: a {_KIND_NAMES[kind]} frame carries {nbytes} bytes", src)
                return None
            numel = 1
            for s in shape:
                numel *= int(s)
            want = numel * dtype.itemsize
            if nbytes > self.max_message_bytes:
                raise self._err(f"{name}: a message of {nbytes} bytes exceeds max_message_bytes "
                                f"({self.max_message_bytes}); refused before allocating", src)
            if code != _dtype_code(dtype) or nbytes != want:
                raise self._err(f"{name}: expected {want} bytes of {dtype}, the header announces {nbytes} bytes "
                                f"of dtype code {code}; refused before allocating", src)
            buf = torch.empty(tuple(int(s) for s in shape), dtype=dtype)
            if want:
                _recv_exact(sock, _byte_view(buf))
            return buf
        except ssl.SSLError as exc:
            raise self._err(f"{name}: TLS integrity check failed ({exc.reason or exc}): the stream was tampered "
                            "with, replayed or truncated; stopping", src) from None
        except socket.timeout:
            raise RuntimeError(f"Timed out receiving on {name}") from None
        except OSError as exc:
            raise RuntimeError(f"Connection closed on {name}: {exc}") from None

    def _read_head(self, src: int, sock, name: str, *, skip_heartbeats: bool = True) -> tuple[int, int, int]:
        """The next frame header from ``src`` past any heartbeats (a live peer's sign of life), checked for magic
        and sequence: (kind, dtype code, byte count). Each read waits up to the timeout: silence, not work.
        ``skip_heartbeats=False``: one header, whatever its kind."""
        head = bytearray(_FRAME.size)
        while True:
            _recv_exact(sock, memoryview(head))
            magic, seq, kind, code, nbytes = _FRAME.unpack(head)
            if magic != _MAGIC:
                raise self._err(f"{name}: malformed frame header", src)
            if seq != self.recv_seq[src]:
                raise self._err(f"{name}: message {seq} arrived where {self.recv_seq[src]} was due "
                                "(replayed, dropped or reordered)", src)
            self.recv_seq[src] = seq + 1
            if kind == KIND_HEARTBEAT and nbytes:
                raise self._err(f"{name}: a heartbeat frame carries {nbytes} bytes", src)
            if kind != KIND_HEARTBEAT or not skip_heartbeats:
                return kind, code, nbytes

    def set_timeout(self, seconds: float) -> None:
        """Seconds a send or receive may block from now on (``Federation.expect_work`` raises it)."""
        self.timeout = float(seconds)
        for sock in list(self.out.values()) + list(self.inc.values()):
            sock.settimeout(self.timeout)

    def send(self, t: torch.Tensor, dst: int) -> None:
        self._send_frame(dst, KIND_DATA, t)

    def recv(self, src: int, shape, dtype: torch.dtype) -> torch.Tensor:
        return self._recv_frame(src, KIND_DATA, dtype, shape)

    def sendrecv(self, t: torch.Tensor, dst: int, src: int, shape, dtype) -> torch.Tensor:
        # The send runs on the mesh's one sender thread (started once, not per call: a ring makes 2 (Q - 1)
        # steps per all-reduce) while this thread receives; the link to ``dst`` is used by nobody else meanwhile.
        if self._sender is None:
            self._sender = ThreadPoolExecutor(1, thread_name_prefix="vfl-tls-send")
        sent = self._sender.submit(self.send, t, dst)
        try:
            buf = self.recv(src, shape, dtype)
        finally:
            error = sent.exception()   # waits for the send in every case: the link is free again after this
        if error is not None:
            raise error
        return buf

    def barrier(self) -> None:
        """A star through rank 0: everyone checks in, rank 0 releases everyone."""
        others = [p.rank for p in self.spec.parties if p.rank != self.me.rank]
        if self.me.rank == 0:
            for r in others:
                self._recv_frame(r, KIND_BARRIER, None, None)
            for r in others:
                self._send_frame(r, KIND_BARRIER, None)
        else:
            self._send_frame(0, KIND_BARRIER, None)
            self._recv_frame(0, KIND_BARRIER, None, None)

    def close(self) -> None:
        self._stop_heartbeats.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=2 * _ABORT_SEND_SECONDS)
            self._heartbeat = None
        self._close_listener()
        if self._sender is not None:
            self._sender.shutdown(wait=False)
            self._sender = None
        for sock in list(self.out.values()) + list(self.inc.values()):
            try:
                sock.close()
            except OSError:
                pass
        self.out.clear()
        self.inc.clear()


def connect_federation(path, party, identity, *, device="cpu", timeout: float | None = None,
                       join_timeout: float | None = None, record_transcript: bool = False):
    """Join the federation of file ``path`` as ``party`` (name or rank) with ``identity`` (key file)."""
    from .federation import Federation, default_timeout
    from .transcript import Transcript

    spec = load_federation_file(path)
    me = spec.party(party)
    ident = identity if isinstance(identity, Identity) else Identity.load(identity)
    timeout = default_timeout() if timeout is None else float(timeout)
    mesh = TLSMesh(spec, me, ident, timeout=timeout, join_timeout=join_timeout)
    mesh.connect()
    return Federation(me.rank, spec.roles, store=None, backend="tls", device=device, timeout=timeout,
                      transcript=Transcript() if record_transcript else None, transport=mesh,
                      max_message_bytes=spec.max_message_bytes)



def _local_party(path, name, key, fn, args, options, results):
    from .._lifetime import die_with_parent

    die_with_parent(ignore_sigint=False)          # a killed launcher takes its parties with it
    torch.set_num_threads(options["threads"])
    rank = load_federation_file(path).party(name).rank
    try:
        fed = connect_federation(path, name, key, timeout=options["timeout"])
        try:
            out = fn(fed, *args)
            fed.close()
        except BaseException as exc:
            fed.report_error(exc)         # the peers name this party and its reason (abort frames)
            raise
        finally:
            fed.transport.close()
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        kind = "failure" if isinstance(exc, PartyFailure) else "error"
        named = exc.party if isinstance(exc, PartyFailure) else None
        results.put((rank, kind, (f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", named)))


def launch_local(fn, path, identities: dict, args: tuple = (), *, timeout: float | None = None,
                 threads: int | None = None, start_delay: dict | None = None) -> list:
    """Run every party of federation file ``path`` as a local process over the TLS mesh (tests, benchmarks).

    ``identities`` maps party name to key file. Like ``launch``: ``fn(fed, *args)`` per party, results by
    rank, ``FederationError`` naming every failed party. ``start_delay`` (name -> seconds, or a callable that
    returns when the party may start) starts some parties late (tests of what a listener does meanwhile).
    """
    import multiprocessing as mp

    from .federation import default_timeout
    from .launcher import collect_results

    spec = load_federation_file(path)
    timeout = default_timeout() if timeout is None else float(timeout)
    options = dict(timeout=timeout, threads=party_threads(len(spec.parties), threads))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = {p.rank: ctx.Process(target=_local_party, name=f"vfl-tls-{p.name}",
                                 args=(str(path), p.name, str(identities[p.name]), fn, args, options, results))
             for p in spec.parties}
    delays = start_delay or {}
    # Numbers first (in order), then parties that wait for a condition (a callable that returns when they may start).
    for p in sorted(spec.parties, key=lambda p: (callable(delays.get(p.name)), 0.0 if callable(delays.get(p.name))
                                                 else delays.get(p.name, 0.0))):
        wait = delays.get(p.name, 0.0)
        if callable(wait):
            wait()
        elif wait:
            time.sleep(wait)
        procs[p.rank].start()
    return collect_results([procs[r] for r in sorted(procs)], results, spec.roles, timeout)
