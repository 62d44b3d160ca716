"""The process that runs libpsi for one RR22 link, apart from the party (``psi_rr22.LinkWorker``).

libpsi and brpc are native code: a failed check inside them (``brpc/controller.cpp:457] Check failed``, seen
once between two organisations, issue 33) aborts the whole process. Run in the party's own process, that took
the party down without a word, and its peers could only report a closed connection. Here the link and every
PSI on it live in this child process; when it dies the party sees the signal and the tail of spu's log, stops
with that reason, and the federation tells every other party (abort frames, the store).

Protocol: one JSON object per line on stdin, one answer per line on the stdout the party gave it (libpsi's own
console output goes to the log file, argv[1]):

    {"op": "open", "desc": {...}, "rank": 0|1}      -> {"ok": true}
    {"op": "run", "src": PATH, "out": PATH, "broadcast": bool, "bucket": N}  -> {"ok": true}
    {"op": "stop"}                                   -> {"ok": true}, then exit
    any failure                                      -> {"error": "Type: text"}

Nothing received is unpickled; the files are the party's private workspace (``psi_rr22.Workspace``).
"""

from __future__ import annotations

import json
import os
import sys


def _desc(libspu, d: dict):
    desc = libspu.link.Desc()
    desc.id = str(d["id"])
    desc.recv_timeout_ms = int(d["recv_timeout_ms"])
    desc.connect_retry_interval_ms = int(d["connect_retry_interval_ms"])
    desc.connect_retry_times = int(d["connect_retry_times"])
    desc.brpc_channel_protocol = "baidu_std"
    desc.brpc_channel_connection_type = "single"
    desc.add_party("active", str(d["active"]))
    desc.add_party("passive", str(d["passive"]))
    if d.get("ssl"):
        desc.enable_ssl = True
        for opts in (desc.client_ssl_opts, desc.server_ssl_opts):
            opts.cert.certificate_path = str(d["ssl"]["key"])      # the PEM holds the key and the certificate
            opts.cert.private_key_path = str(d["ssl"]["key"])
            opts.verify.verify_depth = 1                            # > 0: verify the peer (mutual)
            opts.verify.ca_file_path = str(d["ssl"]["pin"])         # the peer's pinned certificate only
    return desc


def main() -> int:
    from .._lifetime import die_with_parent
    from .psi_rr22 import _modules

    answer = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    die_with_parent()                             # the party gone: this process too
    libspu, libpsi = _modules()
    lctx = None
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "open":
                lctx = libspu.link.create_brpc(_desc(libspu, cmd["desc"]), int(cmd["rank"]))
            elif op == "run":
                if os.environ.get("VFLTORCH_TEST_PSI_CRASH") == "run":     # tests: a native abort, as brpc's
                    os.abort()
                cfg = libpsi.PsiExecuteConfig(
                    protocol_conf=libpsi.PsiProtocolConfig(protocol=libpsi.PsiProtocol.PROTOCOL_RR22,
                                                           receiver_rank=0, bucket_size=int(cmd["bucket"]),
                                                           broadcast_result=bool(cmd["broadcast"])),
                    input_params=libpsi.InputParams(path=str(cmd["src"]), selected_keys=["key"], keys_unique=True),
                    output_params=libpsi.OutputParams(path=str(cmd["out"]), disable_alignment=False))
                libpsi.psi_execute(cfg, lctx)
            elif op == "stop":
                if lctx is not None:
                    lctx.stop_link()
                answer.write(json.dumps({"ok": True}) + "\n")
                return 0
            else:
                raise ValueError(f"unknown operation {op!r}")
            answer.write(json.dumps({"ok": True}) + "\n")
        except Exception as exc:                  # noqa: BLE001 - the party reports it
            answer.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:2000]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
