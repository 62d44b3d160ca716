"""Row alignment by RR22 PSI (vfltorch/data/psi_rr22.py, SecretFlow's libpsi): the plain intersection, and no ID
outside it in anything a party receives (federation messages, libpsi's traffic) or keeps (libpsi's files)."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from vfltorch.comm import launch
from vfltorch.data import psi, psi_rr22
from vfltorch.data.loaders import stable_id_hash

needs_spu = pytest.mark.skipif(not psi_rr22.available(),
                               reason=f"SecretFlow's spu=={psi_rr22.SPU_VERSION} is not installed (make install)")


_RELAY = r"""
import socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
prefix = sys.argv[2]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print(srv.getsockname()[1], flush=True)
def pipe(src, dst, log):
    with open(log, "ab") as f:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            f.write(data)
            f.flush()
            dst.sendall(data)
def connect(client):
    for _ in range(600):     # the peer's listener may not be up yet: hold the client until it is
        try:
            upstream = socket.create_connection((host, int(port)))
            break
        except OSError:
            time.sleep(0.05)
    else:
        client.close()
        return
    threading.Thread(target=pipe, args=(client, upstream, prefix + ".sent")).start()
    threading.Thread(target=pipe, args=(upstream, client, prefix + ".received")).start()
while True:
    client, _ = srv.accept()
    threading.Thread(target=connect, args=(client,)).start()
"""


class _Recorder:
    """A loopback TCP relay (its own process: libpsi holds the GIL) in front of a peer's libpsi listener,
    recording both directions to files."""

    def __init__(self, target: str, prefix: str):
        import subprocess
        import sys

        self.prefix = prefix
        self.proc = subprocess.Popen([sys.executable, "-c", _RELAY, target, prefix], stdout=subprocess.PIPE)
        self.address = f"127.0.0.1:{int(self.proc.stdout.readline())}"

    def collect(self) -> tuple[bytes, bytes]:
        self.proc.kill()
        self.proc.wait()
        return tuple(Path(self.prefix + ext).read_bytes() if Path(self.prefix + ext).exists() else b""
                     for ext in (".sent", ".received"))


def _align_job(fed, id_lists, engine="rr22"):
    """Align, and keep everything the party received or libpsi wrote (for the attack below)."""
    relays, files = [], {}
    open_link, close = psi_rr22.open_link, psi_rr22.Workspace.close

    import tempfile

    capture = tempfile.mkdtemp(prefix="psi-wire-")

    def recording_link(fed_, peer, mine, theirs, work):      # dial the peer through a recording relay
        relays.append((peer, _Recorder(theirs, f"{capture}/{fed_.rank}-{peer}")))
        return open_link(fed_, peer, mine, relays[-1][1].address, work)

    folder = []

    def snapshot_then_close(work):
        folder.append(str(work.path))
        for path in Path(work.path).rglob("*"):
            if path.is_file():
                files[path.name] = path.read_bytes()
        for t in work.trace_files():
            files["trace:" + t] = Path(t).read_bytes()
        assert oct(os.stat(work.path).st_mode & 0o777) == "0o700"
        close(work)

    psi_rr22.open_link = recording_link
    psi_rr22.Workspace.close = snapshot_then_close
    ids = id_lists[fed.parties.index(fed.rank)]
    rows, counts = psi.align_rows(fed, ids, engine=engine)
    messages = [(m.dst, m.tensor.numpy().tobytes()) for m in fed.transcript]
    wire = [(peer, *r.collect()) for peer, r in relays]
    return rows, counts, messages, wire, files, folder[0]


def _universe(seed=1, n=300):
    rng = np.random.default_rng(seed)
    everyone = [f"user-{i:04d}@example.org" for i in range(n)]
    sets = []
    for share in (0.8, 0.7, 0.6):
        pick = [u for u in everyone if rng.random() < share]
        sets.append([pick[i] for i in rng.permutation(len(pick))])   # each file in its own order
    return everyone, sets


def _forms(d) -> list[bytes]:
    """How an ID could show up: raw text, unkeyed hashes (the old alignment's, libpsi's item key, hex and raw)."""
    key = psi_rr22.item_keys([d])[0]
    return [str(d).encode(), int(stable_id_hash([d])[0]).to_bytes(8, "little", signed=True),
            hashlib.blake2b(str(d).encode(), digest_size=8).digest(), key.encode(), bytes.fromhex(key)]


def _found(dictionary, blob: bytes) -> set:
    return {d for d in dictionary if any(f in blob for f in _forms(d))}


@needs_spu
def test_rr22_three_parties_align_on_the_plain_intersection_and_leak_no_other_id():
    everyone, sets = _universe()
    out = launch(_align_job, 3, args=(sets,), record_transcript=True)
    common = set(sets[0]) & set(sets[1]) & set(sets[2])
    expected = [u for u in sets[0] if u in common]            # the active party's row order
    assert 0 < len(expected) < min(map(len, sets))
    for q, (rows, counts, *_rest) in enumerate(out):
        assert [sets[q][r] for r in rows] == expected
        assert counts["aligned"] == len(expected) and counts["method"].startswith("rr22")
    assert out[0][1]["rows"] == {str(q): len(s) for q, s in enumerate(sets)}

    # Dictionary attack: party q pools the federation messages and libpsi traffic it received, and the
    # files libpsi left in its private folder, and tests every ID of the universe in every form above.
    for q in range(3):
        received = [b for _, _, msgs, _, _, _ in out for dst, b in msgs if dst == q]
        for p, (_, _, _, wire, _, _) in enumerate(out):
            received += [sent for peer, sent, _ in wire if peer == q]          # what p's libpsi sent to q
        received += [back for _, _, back in out[q][3]]                         # what q's peers answered
        assert sum(map(len, received)) > 1000, "the attack needs the traffic"
        assert not _found(everyone, b"".join(received)), f"party {q} received an ID in a testable form"

        files = out[q][4]
        assert any(k.endswith("-out.csv") for k in files) and any(k.startswith("trace:") for k in files)
        logs = {k: v for k, v in files.items() if k == "spu.log" or k.startswith("trace:")}
        data = {k: v for k, v in files.items() if k not in logs}    # its inputs, libpsi's buckets and results
        results = {k: v for k, v in data.items() if k.endswith("-out.csv") or ".inter." in k}
        assert results and not _found(everyone, b"".join(logs.values()))
        for k, v in data.items():
            assert _found(everyone, v) <= set(sets[q]), f"party {q}: another party's ID in {k}"
        if q > 0:   # a passive party's results hold the final intersection only (not its intersection with A)
            for k, v in results.items():
                assert _found(everyone, v) in (set(), common), f"party {q}: {k} holds more than the intersection"
            assert _found(everyone, b"".join(results.values())) == common
    for q in range(3):   # the private folder and the trace files are gone
        assert not Path(out[q][5]).exists()
        assert all(not Path(k[6:]).exists() for k in out[q][4] if k.startswith("trace:"))


@needs_spu
def test_rr22_string_and_numeric_ids_match_as_ecdh_does():
    # 7 and "7" are one ID (canonical_id: an integer as its decimal text); rows present at one party only are
    # dropped; shuffled files.
    a = [7, 8, "x-1", "only-a", 12]
    b = ["12", "x-1", "7", "8", "only-b"]
    rr22 = launch(_align_job, 2, args=([a, b],), record_transcript=True)
    assert [a[r] for r in rr22[0][0]] == [7, 8, "x-1", 12]
    assert [b[r] for r in rr22[1][0]] == ["7", "8", "x-1", "12"]
    assert rr22[0][1]["rows"] == {"0": 5, "1": 5} and rr22[1][1]["aligned"] == 4


def _refuse_job(fed, id_lists, rogue):
    """The passive party presents a certificate the federation file does not pin for it (its mesh link
    is genuine): the active party's libpsi must refuse the PSI link."""
    from vfltorch.comm.identity import Identity

    if not fed.is_active:
        fed.transport.identity = Identity.load(rogue)
    return psi.align_rows(fed, id_lists[fed.parties.index(fed.rank)], engine="rr22")[1]


def _tls_job(fed, id_lists):
    rows, counts = psi.align_rows(fed, id_lists[fed.parties.index(fed.rank)], engine="rr22")
    return rows, counts


@needs_spu
def test_rr22_over_a_tls_federation(tmp_path):
    from vfltorch.comm.link import launch_local

    from test_links import make_federation

    everyone, sets = _universe(seed=2, n=120)
    path, keys = make_federation(tmp_path, 2)
    out = launch_local(_tls_job, path, keys, args=(sets[:2],), timeout=20)
    common = set(sets[0]) & set(sets[1])
    expected = [u for u in sets[0] if u in common]
    assert [[sets[q][r] for r in out[q][0]] for q in range(2)] == [expected, expected]


@needs_spu
@pytest.mark.slow     # about 2 minutes: libpsi retries the refused TLS handshake before it gives up
def test_rr22_link_refuses_a_certificate_the_federation_file_does_not_pin(tmp_path):
    from vfltorch.comm.identity import generate
    from vfltorch.comm.link import launch_local

    from test_links import make_federation

    everyone, sets = _universe(seed=2, n=120)
    path, keys = make_federation(tmp_path, 2)
    rogue = generate("shop", tmp_path / "rogue" / "shop.pem")
    with pytest.raises(Exception) as info:
        launch_local(_refuse_job, path, keys, args=(sets[:2], str(rogue.path)), timeout=6)
    assert "connect to mesh failed" in info.value.errors[0] and "rr22 PSI" in info.value.errors[0]


def test_rr22_without_spu_is_refused_before_any_party_starts(monkeypatch):
    import argparse

    from vfltorch.data import preflight
    from vfltorch.data.validation import VFLInputError

    args = argparse.Namespace(party_files=["a.csv", "b.csv"], id_column="id", psi="rr22", aligned_rows=None)
    monkeypatch.setattr(psi_rr22, "available", lambda: False)
    with pytest.raises(VFLInputError, match="--psi rr22 needs SecretFlow's spu==0.9.5.*--psi ecdh"):
        preflight.check_options(args)
    assert psi.default_engine() == "ecdh" and "ECDH-PSI" in psi.fallback_note(None)
    assert psi.fallback_note("ecdh") is None      # an explicit --psi ecdh needs no note


def test_the_psi_gate_forwards_tls_handshakes_only():
    # brpc answers plain TCP too; across organisations its listener is on loopback behind psi_gate.py,
    # which passes a connection on only if it opens with a TLS handshake record.
    import socket
    import subprocess
    import sys
    import threading

    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(4)

    def serve():
        while True:
            c, _ = echo.accept()
            c.sendall(c.recv(100))
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    gate = subprocess.Popen([sys.executable, str(Path(psi_rr22.__file__).with_name("psi_gate.py")), "127.0.0.1", "0",
                             str(echo.getsockname()[1])], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        port = int(gate.stdout.readline())

        def ask(payload: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(payload)
                try:
                    return s.recv(100)
                except OSError:
                    return b""

        assert ask(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n") == b""       # plain: closed, never forwarded
        assert ask(b"\x00\x00\x00\x10RPC0") == b""                          # baidu_std's clear framing too
        hello = b"\x16\x03\x01\x00\x05hello"
        assert ask(hello) == hello                                          # a TLS record: forwarded
    finally:
        gate.stdin.close()          # the gate exits when its party's pipe closes
        assert gate.wait(timeout=10) == 0
        gate.stdout.close()


def _crashing_job(fed, ids):
    if fed.rank == 1:
        os.environ["VFLTORCH_TEST_PSI_CRASH"] = "run"      # libpsi aborts in this party's worker, as brpc's check did
    return psi.align_rows(fed, ids, engine="rr22")


@needs_spu
def test_a_crash_inside_libpsi_is_named_by_every_party():
    """The native code runs in a child process per link: its abort (SIGABRT) stops the party with the signal,
    and the other party names that party and the reason, instead of losing a process without a word."""
    from vfltorch.comm import FederationError

    with pytest.raises(FederationError) as info:
        launch(_crashing_job, 2, args=(["a", "b", "c"],), timeout=30)
    errors = info.value.errors
    assert "crashed at party 1 (passive) (signal SIGABRT)" in errors[1], errors[1]
    assert "party 1" in errors[0] and "crashed" in errors[0], errors[0]
