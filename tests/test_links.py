"""Links between organisations (issue 18): TLS 1.3 with pinned certificates, over loopback.

Real party processes over the TLS mesh give what gloo gives; an impostor is refused; a
man-in-the-middle that flips, replays or reorders TLS records stops the run with an error
naming the link; a peer's headers are checked before anything is allocated; the launcher's
store listens on loopback only and ignores notes it did not sign.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import ssl
import struct
import threading
import time

import pytest
import torch
import torch.distributed as dist

from vfltorch.comm import (Federation, FederationError, LinkError, PartyFailure, Roles, allreduce, build, launch)
from vfltorch.comm import federation_file as ff
from vfltorch.comm.identity import Identity, generate
from vfltorch.comm.link import _FRAME, _MAGIC, KIND_DATA, TLSMesh, connect_federation, launch_local

TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_federation(tmp_path, n: int, *, names=None, addresses=None, listen=None, max_bytes=None):
    """Keys for n parties and a federation file; returns (path, {name: key file})."""
    names = names or ["bank", "shop", "lender", "insurer"][:n]
    keys, parties = {}, []
    for r, name in enumerate(names):
        ident = generate(name, tmp_path / f"{name}.pem")
        keys[name] = ident.path
        entry = dict(name=name, rank=r, role="active" if r == 0 else "passive",
                     address=(addresses or {}).get(name, f"127.0.0.1:{free_port()}"),
                     fingerprint=ident.fingerprint, certificate=f"{name}.crt")
        if listen and name in listen:
            entry["listen"] = listen[name]
        parties.append(entry)
    kw = {} if max_bytes is None else {"max_message_bytes": max_bytes}
    ff.write(tmp_path / "fed.json", parties, federation="test", **kw)
    return tmp_path / "fed.json", keys


# --------------------------------------------------------------- party functions (spawned)
def exchange(fed):
    """Every kind of message the methods use: reductions over the three structures, framed tensors, JSON."""
    g = torch.Generator().manual_seed(100 + fed.rank)
    x = torch.randn(37, 5, generator=g, dtype=torch.float64)
    out = {name: allreduce(fed, x, build(name, fed.parties)).tolist() for name in ("tree", "star", "ring")}
    nxt, prv = (fed.rank + 1) % fed.world_size, (fed.rank - 1) % fed.world_size
    got = fed.sendrecv(torch.arange(6, dtype=torch.int64) * fed.rank, nxt, prv)
    out["ring_step"] = got.tolist()
    # 8 MB each way at once, more than the socket buffers hold: a send that did not overlap the receive would hang.
    got = fed.sendrecv(torch.arange(1 << 20, dtype=torch.float64) + 10 * fed.rank, nxt, prv)
    out["ring_big"] = [float(got[0]), float(got[-1])]
    if fed.rank == 0:
        fed.send_tensor(torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16), 1)
        fed.send_json({"epoch": 3, "note": "hello"}, 1)
    elif fed.rank == 1:
        t = fed.recv_tensor(0)
        out["framed"] = [str(t.dtype), t.float().tolist(), fed.recv_json(0)]
    fed.barrier()
    out["bytes"] = fed.meter.totals()
    return out


def chatter(fed, messages=40, size=2048):
    """Party 1 streams tensors to party 0 (the link a man in the middle sits on)."""
    for i in range(messages):
        if fed.rank == 1:
            fed.send(torch.full((size,), float(i)), 0)
        else:
            got = fed.recv(1, (size,))
            assert float(got[0]) == i
    return "done"


def refused_list(fed):
    allreduce(fed, torch.ones(3), "tree")
    return list(fed.transport.refused)


# ------------------------------------------------------------------------------ the tests
def test_tls_mesh_gives_what_gloo_gives(tmp_path):
    path, keys = make_federation(tmp_path, 3)
    tls = launch_local(exchange, path, keys, timeout=TIMEOUT)
    gloo = launch(exchange, 3, timeout=TIMEOUT)
    assert tls == gloo                                  # bit for bit, and the same bytes counted
    assert tls[1]["framed"] == ["torch.bfloat16", [[1.5, -2.0]], {"epoch": 3, "note": "hello"}]


def test_an_impostor_is_refused_and_the_run_goes_on(tmp_path):
    path, keys = make_federation(tmp_path, 2)
    spec = ff.load(path)
    bank = spec.party("bank")
    rogue = generate("bank", tmp_path / "rogue" / "rogue.pem")   # same name, its own key
    outcome = {}

    def intrude():
        # Wait for bank's listener, then dial it with the impostor's certificate, claiming to be shop.
        # (Generous: on a loaded 2-core machine starting bank's process alone can take over 20 s.)
        deadline = time.monotonic() + 6 * TIMEOUT
        while True:
            try:
                raw = socket.create_connection((bank.host, bank.port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    outcome["error"] = "bank never listened"
                    return
                time.sleep(0.05)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(str(rogue.path))
        try:
            tls = ctx.wrap_socket(raw)
            tls.sendall(b"x" * 64)
            outcome["read"] = tls.recv(64)         # the server's alert ends this
        except (ssl.SSLError, OSError) as exc:
            outcome["error"] = str(exc)

    th = threading.Thread(target=intrude)
    th.start()
    # shop starts only once the impostor has come and gone (not after a fixed delay, which raced on a loaded
    # machine where bank's process took longer to listen): the impostor must not take shop's place.
    result = launch_local(refused_list, path, keys, timeout=TIMEOUT, start_delay={"shop": th.join})
    th.join()
    assert "read" not in outcome or outcome["read"] == b""
    assert any("TLS handshake failed" in r or "pinned for no peer" in r for r in result[0]), result[0]


def test_a_party_with_the_wrong_key_stops_before_talking(tmp_path):
    path, keys = make_federation(tmp_path, 2)
    with pytest.raises(LinkError, match="not the one the federation file pins for party 'shop'"):
        connect_federation(path, "shop", keys["bank"], timeout=2)


def test_a_listener_with_the_wrong_certificate_is_named(tmp_path):
    """shop dials bank's address, but another process answers there: shop refuses it, naming the link."""
    path, keys = make_federation(tmp_path, 2)
    bank = ff.load(path).party("bank")
    rogue = generate("bank", tmp_path / "rogue" / "rogue.pem")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(rogue.path))
    server = socket.create_server((bank.host, bank.port))

    def serve():
        try:
            conn, _ = server.accept()
            ctx.wrap_socket(conn, server_side=True).recv(1)
        except (ssl.SSLError, OSError):
            pass

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    with pytest.raises(LinkError, match=r"link shop \(rank 1\) -> bank \(rank 0.*did not present bank's pinned"):
        connect_federation(path, "shop", keys["shop"], timeout=2)     # (the rogue listens already)
    server.close()


class RecordProxy:
    """A man in the middle on one TCP link: forwards TLS records, and tampers with one of them.

    ``mode``: 'flip' a bit, 'replay' a record (send it twice) or 'reorder' two records, at the
    ``at``-th encrypted record from the dialling side (past the handshake).
    """

    def __init__(self, listen_port: int, target_port: int, mode: str, at: int = 12):
        self.mode, self.at = mode, at
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", listen_port))
        self.done = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            client, _ = self.server.accept()
        except OSError:
            return
        deadline = time.monotonic() + TIMEOUT
        while True:   # the dialler may come before the real listener is up
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
                break
            except OSError:
                if time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.05)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._records(client, upstream)

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _read(sock, n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise OSError("closed")
            buf += chunk
        return buf

    def _records(self, src, dst):
        count, held = 0, None
        try:
            while True:
                head = self._read(src, 5)
                body = self._read(src, struct.unpack("!H", head[3:5])[0])
                record = head + body
                if head[0] == 23:   # application data: every encrypted TLS 1.3 record
                    count += 1
                    if count == self.at and not self.done:
                        self.done = True
                        if self.mode == "flip":
                            record = record[:-1] + bytes([record[-1] ^ 1])
                        elif self.mode == "replay":
                            dst.sendall(record)
                        elif self.mode == "reorder":
                            held = record
                            continue
                dst.sendall(record)
                if held is not None and record is not held:
                    dst.sendall(held)
                    held = None
        except OSError:
            pass


@pytest.mark.parametrize("mode", ["flip", "replay", pytest.param("reorder", marks=pytest.mark.slow)])
def test_a_tampered_stream_stops_the_run_naming_the_link(tmp_path, mode):
    # bank listens on `real`; the file tells shop to dial the proxy, which forwards to `real`.
    real, proxied = free_port(), free_port()
    path, keys = make_federation(tmp_path, 2, addresses={"bank": f"127.0.0.1:{proxied}"},
                                 listen={"bank": f"127.0.0.1:{real}"})
    proxy = RecordProxy(proxied, real, mode)
    with pytest.raises(FederationError) as info:
        launch_local(chatter, path, keys, timeout=10)
    assert proxy.done
    first = info.value.errors[0].splitlines()[0]
    assert first.startswith("LinkError: link shop (rank 1) -> bank (rank 0"), first
    assert "TLS integrity check failed" in first and "tampered" in first, first


# ------------------------------------------------------- frames and headers (no processes)
def _mesh_with_pipe(tmp_path, max_bytes=1 << 20):
    path, keys = make_federation(tmp_path, 2, max_bytes=max_bytes)
    spec = ff.load(path)
    mesh = TLSMesh(spec, spec.party("bank"), Identity.load(keys["bank"]), timeout=5)
    ours, theirs = socket.socketpair()
    mesh.inc[1], mesh.recv_seq[1] = ours, 1
    return mesh, theirs


def test_frames_are_checked_before_allocation(tmp_path, monkeypatch):
    mesh, peer = _mesh_with_pipe(tmp_path, max_bytes=4096)
    allocated = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocated.append(a) or real_empty(*a, **k))
    # A frame announcing more than the limit: refused from its header, nothing allocated or read.
    peer.sendall(_FRAME.pack(_MAGIC, 1, KIND_DATA, 0, 1 << 40))
    with pytest.raises(LinkError, match="exceeds max_message_bytes"):
        mesh.recv(1, (1 << 38,), torch.float32)
    assert not [a for a in allocated if a and a[0] == (1 << 38,)]
    # A frame whose size differs from what the protocol step expects.
    mesh.recv_seq[1] = 2
    peer.sendall(_FRAME.pack(_MAGIC, 2, KIND_DATA, 0, 400))
    with pytest.raises(LinkError, match="expected 40 bytes of torch.float32"):
        mesh.recv(1, (10,), torch.float32)
    # A skipped (or replayed) sequence number, from a peer that authenticated fine.
    mesh.recv_seq[1] = 3
    peer.sendall(_FRAME.pack(_MAGIC, 5, KIND_DATA, 0, 40))
    with pytest.raises(LinkError, match="message 5 arrived where 3 was due"):
        mesh.recv(1, (10,), torch.float32)
    # An honest frame passes.
    mesh.recv_seq[1] = 7
    peer.sendall(_FRAME.pack(_MAGIC, 7, KIND_DATA, 0, 8) + struct.pack("<ff", 1.0, 2.0))
    assert mesh.recv(1, (2,), torch.float32).tolist() == [1.0, 2.0]
    peer.close()


def test_a_peer_closing_is_a_party_failure_not_a_link_error(tmp_path):
    mesh, peer = _mesh_with_pipe(tmp_path)
    peer.close()
    fed = Federation(0, Roles(2), store=None, backend="tls", transport=mesh, timeout=5)
    with pytest.raises(PartyFailure, match="party 1 \\(passive\\) is gone: its connection closed") as info:
        fed.recv(1, (3,))
    assert not isinstance(info.value, LinkError)


def test_tensor_headers_are_checked_on_every_transport(tmp_path):
    """recv_tensor refuses a header announcing too many bytes, an unknown dtype or too many dims."""
    fed = Federation(0, Roles(2), store=None, backend="tls", transport=None, timeout=5, max_message_bytes=10_000)

    def header(code, shape):
        h = torch.zeros(10, dtype=torch.int64)
        h[0], h[1] = code, len(shape)
        h[2:2 + len(shape)] = torch.tensor(shape)
        return h

    assert fed._check_header(header(1, [10, 20]), 1) == (torch.float64, [10, 20])
    with pytest.raises(PartyFailure, match="announcing 8000000000000 bytes .* refused before allocating"):
        fed._check_header(header(1, [1_000_000, 1_000_000]), 1)
    with pytest.raises(PartyFailure, match="unknown dtype code 99"):
        fed._check_header(header(99, [1]), 1)
    with pytest.raises(PartyFailure, match="negative size"):
        fed._check_header(header(0, [-4, 5]), 1)
    bad = header(0, [1])
    bad[1] = 40
    with pytest.raises(PartyFailure, match="40 dimensions"):
        fed._check_header(bad, 1)


# ---------------------------------------------------------------------- federation file
def test_federation_file_refuses_wildcards_and_mismatched_pins(tmp_path):
    path, keys = make_federation(tmp_path, 2)
    doc = json.loads(path.read_text())
    for bad_address in ("0.0.0.0:4000", "[::]:4000", ":4000"):
        d = json.loads(json.dumps(doc))
        d["parties"][0]["address"] = bad_address
        with pytest.raises(ff.FederationFileError, match="wildcard|no host|HOST:PORT"):
            ff.parse(d, base=tmp_path)
    d = json.loads(json.dumps(doc))
    d["parties"][0]["fingerprint"] = d["parties"][1]["fingerprint"]
    with pytest.raises(ff.FederationFileError, match="not the one agreed on"):
        ff.parse(d, base=tmp_path)
    d = json.loads(json.dumps(doc))
    d["parties"][1]["role"] = "active"
    with pytest.raises(ff.FederationFileError, match="exactly one party must be 'active'"):
        ff.parse(d, base=tmp_path)
    spec = ff.load(path)
    assert spec.roles == Roles(2) and spec.party("shop").rank == 1


def test_keygen_command_writes_a_private_key_and_an_entry(tmp_path, capsys):
    from vfltorch.cli import main

    assert main(["keygen", "--name", "bank", "--out", str(tmp_path / "bank.pem"), "--rank", "0",
                 "--role", "active", "--address", "10.0.0.1:29400"]) == 0
    out = capsys.readouterr().out
    entry = json.loads(out[out.index("{"):])
    assert entry["fingerprint"] == Identity.load(tmp_path / "bank.pem").fingerprint
    assert (tmp_path / "bank.pem").stat().st_mode & 0o077 == 0
    assert "PRIVATE KEY" not in (tmp_path / "bank.crt").read_text()
    assert main(["keygen", "--name", "bank", "--out", str(tmp_path / "bank.pem")]) == 2   # no overwrite


# ------------------------------------------------------------------- the launcher's store
def store_listeners(fed):
    """Run inside a launched party: where does the launcher's store (its parent) listen?"""
    return _listening(fed.store.port)


def _listening(port: int) -> list[str]:
    """Local addresses of listening sockets on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr, p = f[1].rsplit(":", 1)
            if int(p, 16) == port and f[3] == "0A":
                found.append(addr)
    return found


def test_launcher_store_listens_on_loopback_only():
    addrs = launch(store_listeners, 2, timeout=TIMEOUT)
    assert addrs[0] == addrs[1] == ["0100007F"], addrs   # 127.0.0.1 only: no 0.0.0.0, no ::


def test_planted_store_notes_are_ignored():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    fed = Federation(0, Roles(3), store=store, backend="gloo", timeout=1.0, store_secret=b"k" * 32)
    # An outsider plants a report blaming party 2 and a non-integer 'lost' value.
    store.set("vfl/lost/1", "2")
    store.set("vfl/error/2", "ValueError: planted blame")
    store.set("vfl/lost/2", "not-a-rank")
    assert fed._root_cause(1) == (1, None)
    # Notes written by a party of this run (same secret) are followed.
    peer = Federation(1, Roles(3), store=store, backend="gloo", timeout=1.0, store_secret=b"k" * 32)
    peer._store_set("vfl/lost/1", "2")
    other = Federation(2, Roles(3), store=store, backend="gloo", timeout=1.0, store_secret=b"k" * 32)
    other._store_set("vfl/error/2", "ValueError: real")
    assert fed._root_cause(1) == (2, "ValueError: real")
    # Without a secret (torchrun's store), junk values no longer crash the diagnosis.
    plain = Federation(0, Roles(3), store=store, backend="gloo", timeout=1.0)
    store.set("vfl/lost/1", "junk")
    assert plain._root_cause(1)[0] == 1


def test_parties_holding_different_federation_files_stop(tmp_path):
    """Same keys and addresses, a different limit: the digest in the hello frame differs; both stop."""
    path, keys = make_federation(tmp_path, 2)
    errors, _ = _join_all({"bank": path, "shop": _another_file(path)}, keys, timeout=15)
    assert set(errors) == {"bank", "shop"}
    assert all(isinstance(e, LinkError) for e in errors.values()), errors
    assert any("holds a different federation file" in str(e) for e in errors.values()), errors


def test_cli_federation_options_are_checked(tmp_path, capsys):
    from vfltorch.cli import main

    path, keys = make_federation(tmp_path, 2)
    assert main(["fdskl", "--federation", str(path)]) == 2
    assert "--federation needs --party NAME and --identity KEYFILE" in capsys.readouterr().err
    assert main(["fdskl", "--federation", str(path), "--party", "nobody", "--identity", str(keys["bank"])]) == 2
    assert "no party 'nobody'" in capsys.readouterr().err


def test_federation_file_in_toml(tmp_path):
    path, keys = make_federation(tmp_path, 2)
    doc = json.loads(path.read_text())
    lines = [f'federation = "{doc["federation"]}"', ""]
    for p in doc["parties"]:
        lines.append("[[parties]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in p.items()]
    (tmp_path / "fed.toml").write_text("\n".join(lines) + "\n")
    assert ff.load(tmp_path / "fed.toml").digest == ff.load(path).digest


@pytest.mark.slow
def test_tls_waits_follow_announced_work(tmp_path):
    # The TLS mesh's socket timeouts follow Federation.expect_work as gloo's waits do (tests/test_failures.py):
    # party 1 computes 1.5 timeouts inside an announced block of 3 timeouts; the others wait it out.
    from test_failures import working_job

    path, keys = make_federation(tmp_path, 3)
    out = launch_local(working_job, path, keys, args=("work", 1, 12.0, 24.0), timeout=8.0)
    assert all(o[0] == 8.0 and o[1] >= 12.0 for o in out), out


# --------------------------------------------------------------- failures named by every party (issue 33)
def _another_file(path):
    """The same federation with one limit changed: its digest (in every hello frame) differs."""
    doc = json.loads(path.read_text())
    doc["max_message_bytes"] = 4096
    other = path.with_name("other.json")
    other.write_text(json.dumps(doc))
    return other


def _join_all(files: dict, keys, timeout=30.0):
    """Each party (name -> the federation file it holds) joins in a thread: (errors, seconds) by name."""
    errors, took = {}, {}

    def party(name):
        started = time.monotonic()
        try:
            connect_federation(files[name], name, keys[name], timeout=timeout).transport.close()
        except PartyFailure as exc:
            errors[name] = exc
        took[name] = time.monotonic() - started

    threads = [threading.Thread(target=party, args=(n,)) for n in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, took


def test_a_port_in_use_is_named_by_every_party_within_seconds(tmp_path):
    """The bank's port is taken by another service (it accepts and hangs up): the bank says so, and the shop
    names the bank and that reason within 10 s (not a certificate, not the 30 s join timeout)."""
    path, keys = make_federation(tmp_path, 2)
    bank = ff.load(path).party("bank")
    squatter = socket.create_server((bank.host, bank.port))
    stop = threading.Event()

    def hang_up():
        squatter.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = squatter.accept()
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    try:
        errors, took = _join_all({"bank": path, "shop": path}, keys)
    finally:
        stop.set()
        t.join()
        squatter.close()
    assert set(errors) == {"bank", "shop"}, errors
    assert "port is in use" in str(errors["bank"]) and errors["bank"].party == 0
    assert "bank" in str(errors["shop"]) and "port is in use" in str(errors["shop"]), errors["shop"]
    assert errors["shop"].party == 0
    assert max(took.values()) < 10, took


def test_different_federation_files_are_named_by_a_third_party_within_seconds(tmp_path):
    """bank and shop hold different files; the lender (same file as the bank) learns why within 10 s."""
    path, keys = make_federation(tmp_path, 3)
    errors, took = _join_all({"bank": path, "shop": _another_file(path), "lender": path}, keys)
    assert set(errors) == {"bank", "shop", "lender"}, errors
    assert "different federation file" in str(errors["lender"]), errors["lender"]
    assert max(took.values()) < 10, took


def fails_at_shop(fed):
    if fed.rank == 1:
        raise ValueError("shop.csv: line 7 is not numeric")
    return fed.recv_tensor(1)


def test_a_party_that_stops_mid_run_is_named_with_its_reason_over_tls(tmp_path):
    path, keys = make_federation(tmp_path, 3)
    started = time.monotonic()
    with pytest.raises(FederationError) as info:
        launch_local(fails_at_shop, path, keys, timeout=30)
    assert time.monotonic() - started < 20
    for rank in (0, 2):
        text = info.value.errors[rank]
        assert "shop" in text and "shop.csv: line 7 is not numeric" in text, text


# --------------------------------------------------------------- liveness apart from progress (issue 33)
def slow_then_send(fed, seconds):
    import signal as sig

    if fed.rank == 1:
        if seconds == "stop":
            time.sleep(0.3)
            os.kill(os.getpid(), sig.SIGSTOP)        # frozen: alive to the kernel, silent on the link
        elif seconds == "kill":
            time.sleep(0.3)
            os.kill(os.getpid(), sig.SIGKILL)
        time.sleep(seconds)                           # long local work, no message
        fed.send_tensor(torch.arange(3.0), 0)
        return "sent"
    started = time.monotonic()
    t = fed.recv_tensor(1)
    return t.tolist(), time.monotonic() - started


def test_a_slow_peer_is_waited_for_beyond_the_timeout_over_tls(tmp_path):
    """--timeout bounds silence, not work: 6 s of local work under a 2 s timeout; heartbeats keep the link live."""
    path, keys = make_federation(tmp_path, 2)
    out = launch_local(slow_then_send, path, keys, args=(6.0,), timeout=2.0)
    assert out[0][0] == [0.0, 1.0, 2.0] and out[0][1] > 5.5 and out[1] == "sent"


@pytest.mark.parametrize("how, within", [("kill", 5.0), ("stop", 12.0)])
def test_a_dead_or_frozen_peer_is_named_over_tls(tmp_path, how, within):
    """A killed peer's link closes: named at once. A frozen one (SIGSTOP) falls silent: named after the 3 s
    timeout of silence (plus the launcher's own bookkeeping)."""
    path, keys = make_federation(tmp_path, 2)
    started = time.monotonic()
    with pytest.raises(FederationError) as info:
        launch_local(slow_then_send, path, keys, args=(how,), timeout=3.0)
    took = time.monotonic() - started
    text = info.value.errors[0]
    assert "party 1" in text and ("closed" in text or "did not answer" in text), text
    assert took < within + 8, took            # + process start and join of two spawned interpreters


def test_a_party_started_with_another_key_is_named_by_every_party_within_seconds(tmp_path):
    """The shop starts with a key the federation file does not pin for it (it made a new one, say). It cannot
    open a TLS link to say so; its notice tells the bank and the lender, who stop within 10 s naming the shop and
    the reason, not a missing party after the 30 s join timeout."""
    path, keys = make_federation(tmp_path, 3)
    wrong = {**keys, "shop": generate("shop", tmp_path / "new" / "shop.pem").path}
    errors, took = _join_all({"bank": path, "shop": path, "lender": path}, wrong)
    assert set(errors) == {"bank", "shop", "lender"}, errors
    assert "not the one the federation file pins for party 'shop'" in str(errors["shop"])
    for name in ("bank", "lender"):
        text = str(errors[name])
        assert "shop" in text and "key is not the one the federation file pins" in text, (name, text)
        assert errors[name].party == 1, (name, errors[name].party)
    assert max(took.values()) < 10, took


def test_a_notice_from_another_address_is_ignored(tmp_path, caplog):
    """A notice names a party whose address in the file is not the sender's: refused and logged, the join goes
    on (a stranger on the network cannot stop the bank by claiming to be the shop)."""
    path, keys = make_federation(tmp_path, 2, addresses={"shop": f"127.0.0.2:{free_port()}"})
    bank = ff.load(path).party("bank")
    result = {}

    def join():
        try:
            connect_federation(path, "bank", keys["bank"], timeout=2).transport.close()
        except PartyFailure as exc:
            result["error"] = exc

    t = threading.Thread(target=join)
    t.start()
    body = json.dumps({"party": "shop", "reason": "forged"}).encode()
    for _ in range(100):
        try:
            with socket.create_connection((bank.host, bank.port), timeout=1) as s:
                s.sendall(b"VFLN" + struct.pack("!H", len(body)) + body)
            break
        except OSError:
            time.sleep(0.05)
    t.join()
    text = str(result["error"])            # the bank waited its whole join timeout for the real shop
    assert "shop" in text and "within 2 s" in text and "forged" not in text and "cannot join" not in text, text
    assert "a notice claiming to be shop from an address that is not shop's" in caplog.text, caplog.text
