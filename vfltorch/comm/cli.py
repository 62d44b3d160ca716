"""``vfl keygen``: an organisation's long-term identity for the federation file.

    vfl keygen --name bank --out keys/bank.pem --address 10.0.0.1:29400 --rank 0 --role active

writes ``keys/bank.pem`` (private key + certificate, mode 0600: keep it) and
``keys/bank.crt`` (the certificate: send it to the other organisations) and
prints this party's entry for the federation file, fingerprint included.
"""

from __future__ import annotations

import json

from ..cli import Command
from .identity import generate


def _keygen(_fed, _data, args, _log):
    try:
        ident = generate(args.name, args.out, overwrite=args.force)
    except FileExistsError as exc:
        print(f"vfl: error: {exc}")
        return 2
    entry = {"name": args.name, "rank": args.rank, "role": args.role, "address": args.address,
             "fingerprint": ident.fingerprint, "certificate": ident.path.with_suffix(".crt").name}
    print(f"private key + certificate: {ident.path} (keep it; mode 0600)")
    print(f"certificate (public):      {ident.path.with_suffix('.crt')}")
    print(f"fingerprint:               {ident.fingerprint}")
    print("entry for the federation file (fill in rank, role and address; check the fingerprint by phone):")
    print(json.dumps(entry, indent=2))
    return 0


def _keygen_args(p):
    p.add_argument("--name", required=True, help="this organisation's party name in the federation file")
    p.add_argument("--out", required=True, metavar="PATH", help="key file to write (NAME.pem); NAME.crt next to it")
    p.add_argument("--address", default="HOST:PORT", help="where this party listens (for the printed entry)")
    p.add_argument("--rank", type=int, default=None, help="rank for the printed entry")
    p.add_argument("--role", choices=["active", "passive", "coordinator"], default=None,
                   help="role for the printed entry")
    p.add_argument("--force", action="store_true", help="overwrite an existing identity")


COMMANDS = [Command("keygen", "write this organisation's TLS identity (key + self-signed certificate)",
                    _keygen, _keygen_args, needs_data=False)]
