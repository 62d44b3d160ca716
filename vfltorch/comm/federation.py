"""The federation handle: one per party process.

A ``Federation`` wraps an initialised ``torch.distributed`` process group (one
organisation: the launcher, torchrun, mpirun) or a TLS mesh between
organisations (``transport``, see ``link.py``) and is the only object algorithm
code talks to: the methods run unchanged on either. It offers point-to-point ``send`` /
``recv`` (the papers' trees, stars and rings are built on these in
``reduce.py``), a communication meter, an optional transcript of everything
sent, and failure handling: when a peer dies, never joins, or stops answering,
the party raises ``PartyFailure`` naming the party that is gone instead of
hanging.

Failure diagnosis. gloo reports either "connection closed" (the peer process
exited) or a timeout (the peer did not answer within ``timeout`` seconds).
The peer we were talking to is not always the culprit: it may itself have
stopped because *its* peer died. So every party that detects a failure writes
"I lost party p" into the rendezvous store, and a party that raises follows
that chain to the first party that reported nothing: the root cause. The store
lives outside the parties (a helper process of the launcher's, or torchrun's
agent), so it survives any of them.

Timeouts that follow the work. A party that only waits while others compute
would time out after ``timeout`` seconds however legitimate the computation.
So protocol code announces heavy local work with ``expect_work(operations)``,
called by every rank of the federation at the same place of the protocol
(SPMD, with the same public count: sizes every party knows, such as n x D x D
multiply-adds): inside the block every wait (receive, send, barrier) may last
``timeout + operations / work_rate`` seconds (``work_rate()``, a deliberately
slow machine: VFLTORCH_WORK_RATE operations per second, default 3e7). A party
that dies is still noticed at once (its connection closes); one that stops
answering (stopped, hung, cut off) is noticed after the timeout plus the
announced work's allowance, and the message says so. Nothing but public sizes
goes into the allowance, so it reveals nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import time

import torch
import torch.distributed as dist

from .errors import BackendUnavailable, PartyFailure
from .meter import CommMeter
from .roles import Roles
from .start import DEFAULT_TIMEOUT, default_timeout  # noqa: F401 - one definition, torch-free (the launcher's)
from .transcript import Transcript


# Framed messages (shape and dtype not known to the receiver) carry this header.
_MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_DTYPE_CODE = {d: i for i, d in enumerate(_DTYPES)}

_CLOSED_MARKERS = ("Connection closed", "Connection reset", "Broken pipe", "ECONNRESET",
                   "Socket closed", "Connection refused")


def work_rate() -> float:
    """Operations per second assumed by ``Federation.expect_work`` (VFLTORCH_WORK_RATE, default 3e7: five
    times slower than the shared, loaded 2-core machine ran rffkpca's n D^2 + D^3 (1.5e8 per second at
    D = 1024), so the allowance is generous; "operations" is whatever unit the caller counts in)."""
    from .start import positive_setting

    return positive_setting("VFLTORCH_WORK_RATE", 3e7)


def default_max_message_bytes() -> int:
    """Largest message a party accepts from a peer (VFLTORCH_MAX_MESSAGE_BYTES, default 1 GiB)."""
    return int(os.environ.get("VFLTORCH_MAX_MESSAGE_BYTES", 1 << 30))


_CPU = torch.device("cpu")


class Federation:
    """One party's view of the federation.

    Parameters are normally filled in by ``vfltorch.comm.launch`` (local
    processes) or ``vfltorch.comm.init_from_env`` (torchrun, MPI). A single
    party (``world_size == 1``) needs no process group: every reduction is the
    identity, which makes Q = 1 the centralised algorithm.
    """

    def __init__(self, rank: int, roles: Roles, *, store=None, backend: str | None = "gloo",
                 device: str | torch.device = "cpu", timeout: float | None = None,
                 transcript: Transcript | None = None, transport=None,
                 max_message_bytes: int | None = None, store_secret: bytes | None = None):
        self.rank = rank
        # With ``store_secret`` (the launcher hands one to its children, never over the network) every
        # diagnosis note in the store carries an HMAC; notes planted by anyone else are ignored.
        self._store_secret = store_secret
        # ``transport``: the TLS mesh between organisations (link.py); None means torch.distributed.
        self.transport = transport
        self.max_message_bytes = default_max_message_bytes() if max_message_bytes is None else int(max_message_bytes)
        self.roles = roles
        self.store = store
        self.backend = backend
        self.device = torch.device(device)
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self.meter = CommMeter()
        self.transcript = transcript
        self._phase = ["default"]
        self._closed = False
        self._allowances: list[float] = []    # seconds added to every wait by the enclosing expect_work blocks
        self._posted: dict[int, list] = {}     # src -> receives posted ahead (``post_recv``), in order

    # ------------------------------------------------------------------ set-up
    @classmethod
    def local(cls, device: str | torch.device = "cpu", *, transcript: Transcript | None = None) -> "Federation":
        """A federation of one party: no process group, the centralised twin."""
        return cls(0, Roles(world_size=1), store=None, backend=None, device=device, transcript=transcript)

    @classmethod
    def connect(cls, store, rank: int, roles: Roles, *, backend: str = "gloo",
                device: str | torch.device = "cpu", timeout: float | None = None,
                join_timeout: float | None = None, transcript: Transcript | None = None,
                store_secret: bytes | None = None) -> "Federation":
        """Join the federation through ``store`` and initialise the process group.

        Every party first announces itself in the store and waits (at most
        ``join_timeout`` seconds, default ``timeout``) for the others, so that a
        party that never starts is named instead of surfacing as an anonymous
        rendezvous timeout.
        """
        fed = cls(rank, roles, store=store, backend=backend, device=device, timeout=timeout,
                  transcript=transcript, store_secret=store_secret)
        if roles.world_size == 1:
            return fed
        check_backend(backend)
        fed._join(fed.timeout if join_timeout is None else float(join_timeout))
        pg_timeout = datetime.timedelta(seconds=fed.timeout)
        if backend == "mpi":
            dist.init_process_group("mpi", timeout=pg_timeout)
        else:
            dist.init_process_group(backend, store=dist.PrefixStore("vfl/pg", store), rank=rank,
                                    world_size=roles.world_size, timeout=pg_timeout)
        return fed

    def _join(self, join_timeout: float) -> None:
        self.store.set(f"vfl/joined/{self.rank}", "1")
        deadline = time.monotonic() + join_timeout
        keys = [f"vfl/joined/{r}" for r in range(self.world_size)]
        while True:
            missing = [r for r, k in zip(range(self.world_size), keys) if not self.store.check([k])]
            if not missing:
                return
            if time.monotonic() > deadline:
                names = ", ".join(self.roles.name(r) for r in missing)
                raise PartyFailure(
                    f"{names} never joined the federation within {join_timeout:g} s "
                    f"(seen from {self.roles.name(self.rank)}). Start every party with the same "
                    f"world size and rendezvous address, or raise --timeout.",
                    party=missing[0], reporter=self.rank, phase="join")
            time.sleep(0.05)

    def close(self) -> None:
        """Leave the federation after a final barrier, so no party exits while others still talk."""
        if self._closed:
            return
        self._closed = True
        left = {src: len(q) for src, q in self._posted.items() if q}
        if left:        # (a protocol error: their messages never came, or came to no one; the barrier would hang)
            raise RuntimeError(f"{self.name()} leaves the federation with receives posted but never taken: {left}")
        if self.transport is not None:
            try:
                self.barrier()
            finally:
                self.transport.close()
        elif self.world_size > 1 and dist.is_initialized():
            try:
                self.barrier()
            finally:
                dist.destroy_process_group()

    # ------------------------------------------------------------------- roles
    @property
    def world_size(self) -> int:
        return self.roles.world_size

    @property
    def parties(self) -> list[int]:
        return self.roles.parties

    @property
    def num_parties(self) -> int:
        return self.roles.num_parties

    @property
    def active(self) -> int:
        return self.roles.active

    @property
    def coordinator(self) -> int | None:
        return self.roles.coordinator

    @property
    def is_active(self) -> bool:
        return self.rank == self.roles.active

    @property
    def is_coordinator(self) -> bool:
        return self.rank == self.roles.coordinator

    @property
    def is_data_party(self) -> bool:
        return self.rank in self.roles.parties

    def name(self, rank: int | None = None) -> str:
        return self.roles.name(self.rank if rank is None else rank)

    # ------------------------------------------------------------------ phases
    @property
    def current_phase(self) -> str:
        return self._phase[-1]

    def phase(self, name: str) -> "_Phase":
        """Count the communication inside this block under ``name`` (``with fed.phase(name): ...``)."""
        return _Phase(self._phase, name)

    # ----------------------------------------------------------- waiting time
    @property
    def wait_timeout(self) -> float:
        """Seconds a wait may last here: the timeout plus the announced work's allowance (``expect_work``)."""
        return self.timeout + sum(self._allowances)

    @contextlib.contextmanager
    def expect_work(self, operations: float, what: str = "local computation"):
        """Every rank calls this at the same place with the same public ``operations`` (e.g. n D^2 for an
        n x D by D x n product): waits inside the block follow the work (module docstring)."""
        extra = max(0.0, float(operations)) / work_rate()
        self._allowances.append(extra)
        self._set_transport_timeout()
        try:
            yield extra
        finally:
            self._allowances.pop()
            self._set_transport_timeout()

    def _set_transport_timeout(self) -> None:
        if self.transport is not None and hasattr(self.transport, "set_timeout"):
            self.transport.set_timeout(self.wait_timeout)

    def _wait(self, work) -> None:
        """Wait for a gloo work item within ``wait_timeout`` (torch's own default is the process group's)."""
        if self.backend == "mpi":
            work.wait()                    # MPI has no per-wait timeout: its process group's applies
        else:
            work.wait(datetime.timedelta(seconds=self.wait_timeout))

    # ---------------------------------------------------------- point-to-point
    def _outgoing(self, tensor: torch.Tensor, dst: int) -> torch.Tensor:
        self._check_peer(dst)
        # gloo and MPI move host memory: CUDA tensors travel through the CPU.
        t = tensor.detach() if tensor.requires_grad else tensor     # (no aten call per message when not needed)
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        self.meter.record_send(self.current_phase, nbytes)
        if self.transcript is not None:
            self.transcript.record(self.current_phase, self.rank, dst, t)
        return t

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Send a tensor whose shape and dtype the receiver knows (see ``recv``)."""
        t = self._outgoing(tensor, dst)
        if self.transport is not None:
            self._guard(lambda: self.transport.send(t, dst), dst, "sending to")
        else:
            self._guard(lambda: self._wait(dist.isend(t, dst)) if self._allowances else dist.send(t, dst), dst,
                        "sending to")

    def send_nowait(self, tensor: torch.Tensor, dst: int) -> "PendingSend":
        """Start sending a tensor (as ``send``) without waiting for the receiver; returns a ``PendingSend``.

        Opt-in for protocol code whose sender has nothing to wait for (FDSKL's dealer window,
        ``kernels.shared.DealerWindow``): ``send`` is a rendezvous of two processes, this is not. The
        caller keeps the handle and calls its ``wait()`` before it next synchronises with the receiver
        or returns (the tensor stays referenced until then); a dead receiver then raises
        ``PartyFailure`` as ``send`` would. Messages to one receiver arrive in the order sent, blocking
        or not. Over a ``transport`` (TLS mesh) this sends at once and the handle is already done.
        """
        t = self._outgoing(tensor, dst)
        if self.transport is not None:
            self._guard(lambda: self.transport.send(t, dst), dst, "sending to")
            return PendingSend(self, None, t, dst)
        return PendingSend(self, self._guard(lambda: dist.isend(t, dst), dst, "sending to"), t, dst)

    def post_recv(self, src: int, shape, dtype: torch.dtype) -> None:
        """Post the receive of ``src``'s next message (known shape and dtype) ahead of the ``recv`` that takes it.

        For protocol code that knows what a peer sends next before it is ready to read it. Over gloo a
        send is a rendezvous: the sender's bytes leave once the receiver has posted its buffer. A receive posted
        early lets the sender write at once, in its own thread, instead of waking gloo's loop thread in both
        processes for the handshake: on these 2-core VMs a round trip of 8 B took 209 us against 443 us, of 200 kB
        301 against 521, and the loop threads' CPU fell 3-7x (``python -m benchmarks.posted_receives``; FDSKL's
        shared iteration: ``docs/fdskl.md``). The next ``recv`` from ``src`` must ask for exactly this shape and
        dtype (a protocol error otherwise, raised, never a silent mix-up); posted receives are taken in order.
        Over the TLS mesh and MPI this does nothing (their sends do not wait for the receiver's buffer).
        """
        if self.transport is not None or self.backend != "gloo":
            return
        self._check_peer(src)
        shape = tuple(int(s) for s in shape)
        buf = torch.empty(shape, dtype=dtype)
        work = self._guard(lambda: dist.irecv(buf, src), src, "receiving from")
        self._posted.setdefault(src, []).append((shape, dtype, buf, work))

    def _take_posted(self, src: int, shape, dtype: torch.dtype):
        queue = self._posted.get(src)
        if not queue:
            return None
        want, got_dtype, buf, work = queue.pop(0)
        # (waited for first, also on a mismatch: gloo must not be left with a posted buffer that is freed)
        self._guard(lambda: self._wait(work), src, "receiving from")
        if want != tuple(int(s) for s in shape) or got_dtype != dtype:
            raise RuntimeError(f"{self.name()}: a receive from {self.name(src)} was posted for {want} {got_dtype}, "
                               f"but {tuple(shape)} {dtype} was asked for (a protocol error)")
        return buf

    def recv(self, src: int, shape, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """Receive a tensor of known shape and dtype from ``src``; returned on ``device`` (default: the party's)."""
        self._check_peer(src)
        if self.transport is not None:
            buf = self._guard(lambda: self.transport.recv(src, shape, dtype), src, "receiving from")
        elif self._posted.get(src):
            buf = self._take_posted(src, shape, dtype)
        else:
            buf = torch.empty(tuple(shape), dtype=dtype)
            self._guard(lambda: self._wait(dist.irecv(buf, src)) if self._allowances else dist.recv(buf, src), src,
                        "receiving from")
        self.meter.record_recv(self.current_phase, buf.numel() * buf.element_size())
        dev = self.device if device is None else device
        if dev == "cpu" or dev == _CPU:
            return buf if buf.device.type == "cpu" else buf.cpu()
        return buf.to(dev)

    def sendrecv(self, tensor: torch.Tensor, dst: int, src: int, shape=None, dtype=None) -> torch.Tensor:
        """Send to ``dst`` while receiving from ``src`` (rings would deadlock on blocking sends)."""
        if self._posted.get(src):
            raise RuntimeError(f"{self.name()}: sendrecv from {self.name(src)} while receives from it are posted "
                               "(a protocol error: the posted ones would take its message)")
        t = self._outgoing(tensor, dst)
        shape = tuple(t.shape if shape is None else shape)
        dtype = t.dtype if dtype is None else dtype
        if self.transport is not None:
            buf = self._guard(lambda: self.transport.sendrecv(t, dst, src, shape, dtype), src, "exchanging with")
        else:
            buf = torch.empty(shape, dtype=dtype)

            def both():
                req = dist.isend(t, dst)
                self._wait(dist.irecv(buf, src))
                self._wait(req)

            self._guard(both, src, "exchanging with")
        self.meter.record_recv(self.current_phase, buf.numel() * buf.element_size())
        return buf.to(self.device)

    def send_tensor(self, tensor: torch.Tensor, dst: int) -> None:
        """Send a tensor of any shape and dtype: a small header goes first (counted by the meter)."""
        if tensor.dim() > _MAX_DIMS:
            raise ValueError(f"send_tensor supports at most {_MAX_DIMS} dimensions, got {tensor.dim()}")
        if tensor.dtype not in _DTYPE_CODE:
            raise TypeError(f"send_tensor cannot send dtype {tensor.dtype}")
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
        header[0] = _DTYPE_CODE[tensor.dtype]
        header[1] = tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        self.send(header, dst)
        self.send(tensor, dst)

    def recv_tensor(self, src: int, device=None) -> torch.Tensor:
        header = self.recv(src, (2 + _MAX_DIMS,), torch.int64, device="cpu")
        dtype, shape = self._check_header(header, src)
        return self.recv(src, shape, dtype, device=device)

    def _check_header(self, header: torch.Tensor, src: int) -> tuple[torch.dtype, list[int]]:
        """A peer's header decides nothing before it is checked: dtype known, rank and size within limits."""
        code, ndim = int(header[0]), int(header[1])
        where = f"{self.name()} received from {self.name(src)} a tensor header"
        if not 0 <= code < len(_DTYPES):
            raise PartyFailure(f"{where} with unknown dtype code {code}; refused", party=src, reporter=self.rank,
                               phase=self.current_phase)
        if not 0 <= ndim <= _MAX_DIMS:
            raise PartyFailure(f"{where} with {ndim} dimensions (at most {_MAX_DIMS}); refused", party=src,
                               reporter=self.rank, phase=self.current_phase)
        shape = [int(s) for s in header[2:2 + ndim]]
        nbytes = _DTYPES[code].itemsize
        for s in shape:
            if s < 0:
                raise PartyFailure(f"{where} with a negative size {shape}; refused", party=src, reporter=self.rank,
                                   phase=self.current_phase)
            nbytes *= s   # Python integers: no overflow to hide a huge product
        if nbytes > self.max_message_bytes:
            raise PartyFailure(f"{where} announcing {nbytes} bytes (shape {shape}), over the limit of "
                               f"{self.max_message_bytes} (VFLTORCH_MAX_MESSAGE_BYTES / max_message_bytes); "
                               "refused before allocating", party=src, reporter=self.rank, phase=self.current_phase)
        return _DTYPES[code], shape

    def send_json(self, obj, dst: int) -> None:
        """Send a JSON-serialisable object. JSON, not pickle: unpickling a peer's bytes would let it run code."""
        data = json.dumps(obj).encode()
        self.send_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst)

    def recv_json(self, src: int):
        return json.loads(bytes(self.recv_tensor(src, device="cpu").numpy()).decode())

    def gather_json(self, obj, dst: int, ranks=None) -> list | None:
        """Every rank in ``ranks`` (default: all) sends ``obj`` to ``dst``; ``dst`` gets them in rank order."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        if self.rank != dst:
            self.send_json(obj, dst)
            return None
        return [obj if r == dst else self.recv_json(r) for r in ranks]

    def broadcast_json(self, obj, src: int, ranks=None):
        """``src``'s object to every rank in ``ranks`` (a star: small control messages only)."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        if self.rank == src:
            for r in ranks:
                if r != src:
                    self.send_json(obj, r)
            return obj
        return self.recv_json(src)

    def barrier(self) -> None:
        if self.world_size > 1:
            if self.transport is not None:
                op = self.transport.barrier
            elif self._allowances:
                def op():
                    self._wait(dist.barrier(async_op=True))
            else:
                op = dist.barrier
            self._guard(op, None, "waiting at a barrier with")

    # ---------------------------------------------------------------- failures
    def raise_if_peer_failed(self, peer: int) -> None:
        """While this party waits outside the federation's own messages (a native library's link, a helper
        process): raise ``PartyFailure`` if ``peer`` has reported that it stopped, with its reason."""
        if self.transport is not None and hasattr(self.transport, "poll_aborts"):
            self.transport.poll_aborts()
            return
        if self.store is not None:
            err = self._store_get(f"vfl/error/{peer}")
            if err:
                raise PartyFailure(f"{self.name(peer)} stopped; it reported: {err}", party=peer, reporter=self.rank,
                                   phase=self.current_phase)

    def _check_peer(self, peer: int) -> None:
        if self.world_size == 1:
            raise RuntimeError("a single-party federation has no peers to talk to")
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"{self.name()} cannot talk to rank {peer} (world size {self.world_size})")

    def _guard(self, op, peer: int | None, doing: str):
        try:
            return op()
        except RuntimeError as exc:
            if isinstance(exc, PartyFailure):
                raise
            raise self._diagnose(exc, peer, doing) from exc

    def _diagnose(self, exc: RuntimeError, peer: int | None, doing: str) -> PartyFailure:
        text = str(exc)
        closed = any(m in text for m in _CLOSED_MARKERS)
        timed_out = "Timed out" in text or "timeout" in text.lower()
        if peer is not None:  # collectives (barrier) name no single peer
            self._store_set(f"vfl/lost/{self.rank}", str(peer))
        root, err = self._root_cause(peer)
        phase = self.current_phase
        if root is None:
            return PartyFailure(f"{self.name()} failed while {doing} a peer during phase '{phase}': {text}",
                                reporter=self.rank, phase=phase)
        gone = self.roles.name(root)
        if root == peer:
            waited = (f"{self.timeout:g} s" if not self._allowances else
                      f"{self.wait_timeout:g} s (the timeout, {self.timeout:g} s, plus {sum(self._allowances):.0f} s "
                      f"allowed for the announced work)")
            how = ("its connection closed (the process died or exited)" if closed else
                   f"it did not answer within {waited}" if timed_out else text)
            msg = f"{gone} is gone: {how}" + (f"; it reported: {err}" if err else "")
            msg += f". Seen from {self.name()} while {doing} it during phase '{phase}'."
        else:
            msg = f"{gone} is gone" + (f"; it reported: {err}" if err else "")
            msg += (f". {self.roles.name(peer)}, which {self.name()} was {doing}, lost it first "
                    f"(phase '{phase}').")
        return PartyFailure(msg, party=root, reporter=self.rank, phase=phase)

    def _root_cause(self, peer: int | None) -> tuple[int | None, str | None]:
        """Follow 'party a lost party b' reports to the party that reported nothing."""
        if peer is None or self.store is None:
            return peer, None
        # Give the peer a moment to file its own report if it is merely a messenger.
        deadline = time.monotonic() + min(2.0, max(0.2, self.timeout / 10))
        while True:
            seen, node = set(), peer
            while True:
                nxt = self._store_get(f"vfl/lost/{node}")
                # What the store holds is a hint for diagnosis only: ignore anything that is not a rank.
                if nxt is None or not nxt.isdigit() or not 0 <= int(nxt) < self.world_size:
                    break
                if node in seen or int(nxt) == self.rank:
                    break
                seen.add(node)
                node = int(nxt)
            err = self._store_get(f"vfl/error/{node}")
            if err is not None or node != peer or time.monotonic() > deadline:
                return node, err
            time.sleep(0.05)

    def report_error(self, exc: BaseException) -> None:
        """Tell the peers why this party stops: in the store (gloo), or as an abort frame on every TLS link (across
        organisations there is no store), so that they name this party and its reason, not a closed connection.
        A failure this party only saw (a peer's) is passed on over TLS with the party it names."""
        if self.transport is not None and hasattr(self.transport, "abort"):
            if isinstance(exc, PartyFailure):
                if exc.party is not None and exc.party != self.rank:
                    self.transport.abort(str(exc), exc.party)
            else:
                self.transport.abort(f"{type(exc).__name__}: {exc}"[:2000], self.rank)
            return
        if self.store is not None and not isinstance(exc, PartyFailure):
            self._store_set(f"vfl/error/{self.rank}", f"{type(exc).__name__}: {exc}"[:2000])

    def _store_mac(self, key: str, value: str) -> str:
        return hmac.new(self._store_secret, f"{key}\0{value}".encode(), hashlib.sha256).hexdigest()

    def _store_get(self, key: str) -> str | None:
        try:
            if not self.store.check([key]):
                return None
            value = self.store.get(key).decode(errors="replace")
        except Exception:  # the store itself may be gone (e.g. under MPI, or its host died)
            return None
        if self._store_secret is None:
            return value
        mac, sep, text = value.partition(":")
        if not sep or not hmac.compare_digest(mac, self._store_mac(key, text)):
            return None   # not written by a party of this run: ignore it
        return text

    def _store_set(self, key: str, value: str) -> None:
        if self.store is None:
            return
        if self._store_secret is not None:
            value = f"{self._store_mac(key, value)}:{value}"
        try:
            self.store.set(key, value)
        except Exception:
            pass


class _Phase:
    """The context of ``Federation.phase``: a plain class (0.5 us against a generator context's 1.5; FDSKL's shared
    iteration enters about 17 per process)."""

    __slots__ = ("_stack", "_name")

    def __init__(self, stack: list, name: str):
        self._stack, self._name = stack, name

    def __enter__(self) -> None:
        self._stack.append(self._name)

    def __exit__(self, *exc) -> None:
        self._stack.pop()


class PendingSend:
    """A send started by ``Federation.send_nowait``: ``wait()`` returns once the receiver has it."""

    def __init__(self, fed: "Federation", work, tensor: torch.Tensor, dst: int):
        self._fed, self._work, self._tensor, self.dst = fed, work, tensor, dst

    def wait(self) -> None:
        if self._work is not None:
            work, self._work = self._work, None
            self._fed._guard(lambda: self._fed._wait(work), self.dst, "sending to")
        self._tensor = None


def check_backend(backend: str) -> None:
    """Fail early, with a fix, when a backend is unavailable in this torch build."""
    if backend == "gloo":
        if not dist.is_gloo_available():
            raise BackendUnavailable("this torch build has no gloo backend; install an official torch wheel")
    elif backend == "mpi":
        if not dist.is_mpi_available():
            raise BackendUnavailable(
                "--backend mpi was asked for, but this torch build has no MPI support "
                "(torch.distributed.is_mpi_available() is False). Use --backend gloo, or build "
                "torch from source against an MPI library and start the parties with mpirun.")
    else:
        raise ValueError(f"unknown backend {backend!r}: choose 'gloo' or 'mpi'")
