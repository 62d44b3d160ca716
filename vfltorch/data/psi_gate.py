"""A TLS-only gate in front of libpsi's brpc listener (run as a script, stdlib only).

brpc's server answers plain TCP as well as TLS on the same port (yacl does not set ``force_ssl``, and
its Python binding cannot). So across organisations libpsi's server listens on 127.0.0.1 only, and this
gate, in a process of its own (libpsi holds the GIL while it runs), listens on the party's public PSI
port and forwards a connection to it only if its first bytes are a TLS handshake record; anything
else is closed before one byte reaches brpc. The TLS session itself is brpc's, end to end: the
handshake must present the certificate the federation file pins for the peer (brpc verifies it),
so a stranger can neither talk in clear nor complete the handshake.

    python psi_gate.py LISTEN_HOST LISTEN_PORT TARGET_PORT

prints the port it listens on (LISTEN_PORT 0: a free one), and exits when its standard input closes
(its party ended or died).
"""

import os
import socket
import sys
import threading

TLS_HANDSHAKE = 0x16      # TLS record content type of a ClientHello
TLS_MAJOR = 0x03
FIRST_BYTES_SECONDS = 10.0


def _close(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def _pipe(src, dst):
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    _close(src, dst)


def _starts_with_tls(conn) -> bool:
    conn.settimeout(FIRST_BYTES_SECONDS)
    head = b""
    try:
        while len(head) < 2:
            head = conn.recv(2, socket.MSG_PEEK)
            if not head:
                return False
            if len(head) < 2:
                threading.Event().wait(0.01)
    except OSError:
        return False
    conn.settimeout(None)
    return head[0] == TLS_HANDSHAKE and head[1] == TLS_MAJOR


def _handle(conn, target: int):
    if not _starts_with_tls(conn):
        _close(conn)
        return
    try:
        upstream = socket.create_connection(("127.0.0.1", target))
    except OSError:
        _close(conn)
        return
    for s in (conn, upstream):      # brpc's own sockets set it: Nagle's delay would stall each small message
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()


def main(host: str, port: int, target: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    print(srv.getsockname()[1], flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_handle, args=(conn, target), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
