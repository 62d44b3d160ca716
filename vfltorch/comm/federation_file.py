"""The federation file: who takes part, where to reach them, which certificate each must present.

Every organisation holds the same file (JSON, or TOML; never pickle)::

    {
      "federation": "credit-scoring-2026",
      "max_message_bytes": 1073741824,
      "parties": [
        {"name": "bank", "rank": 0, "role": "active", "address": "10.0.0.1:29400",
         "fingerprint": "sha256:3f...", "certificate": "bank.crt"},
        {"name": "shop", "rank": 1, "role": "passive", "address": "10.0.0.2:29400",
         "fingerprint": "sha256:9a...", "certificate": "shop.crt"}
      ]
    }

``certificate`` is the PEM text itself or a path relative to the file; its
SHA-256 fingerprint must equal ``fingerprint`` (a copied file that does not
match its pin is refused). ``address`` is where the party listens and what the
others dial: a concrete host or IP, never a wildcard. An optional ``listen``
(HOST:PORT) gives a different local bind address (behind NAT or a port
forward), also never a wildcard.
Roles: exactly one ``active`` data party, any number of ``passive`` ones and
at most one ``coordinator``, which must take the last rank.

Static addresses only: nothing here is negotiated with a rendezvous service,
so there is no store an outsider could write to.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .identity import fingerprint_pem
from .roles import Roles

ROLES = ("active", "passive", "coordinator")
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


class FederationFileError(ValueError):
    """The federation file is malformed or inconsistent; the message says what to fix."""


@dataclass(frozen=True)
class PartyEntry:
    name: str
    rank: int
    role: str
    host: str
    port: int
    fingerprint: str
    certificate: str     # PEM
    listen_host: str
    listen_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class FederationSpec:
    federation: str
    parties: tuple[PartyEntry, ...]
    max_message_bytes: int
    digest: str          # SHA-256 of the canonical content: every party must hold the same file

    @property
    def roles(self) -> Roles:
        coord = [p.rank for p in self.parties if p.role == "coordinator"]
        active = [p.rank for p in self.parties if p.role == "active"][0]
        labels = tuple(p.name for p in sorted(self.parties, key=lambda p: p.rank))
        return Roles(world_size=len(self.parties), active=active, coordinator=coord[0] if coord else None,
                     labels=labels)

    def party(self, name_or_rank) -> PartyEntry:
        for p in self.parties:
            if p.name == str(name_or_rank) or str(p.rank) == str(name_or_rank):
                return p
        names = ", ".join(p.name for p in self.parties)
        raise FederationFileError(f"no party {name_or_rank!r} in federation {self.federation!r} (parties: {names})")

    def rank_of_fingerprint(self, fp: str) -> int | None:
        for p in self.parties:
            if p.fingerprint == fp:
                return p.rank
        return None


def _split_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FederationFileError(f"{what} {text!r} is not HOST:PORT with a port in 1..65535")
    check_not_wildcard(host, what)
    return host, int(port)


def check_not_wildcard(host: str, what: str = "address") -> None:
    """Listeners bind the interface asked for: refuse 0.0.0.0, ::, '' and '*'."""
    if host in ("", "*"):
        raise FederationFileError(f"{what} has no host: name the interface to listen on, never a wildcard")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return  # a host name: resolved when binding
    if ip.is_unspecified:
        raise FederationFileError(f"{what} {host!r} is a wildcard (all interfaces): give the address "
                                  f"of the one interface the other organisations reach")


def load(path) -> FederationSpec:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise FederationFileError(f"cannot read the federation file {path}: {exc}") from None
    if path.suffix.lower() == ".toml":
        import tomllib
        try:
            doc = tomllib.loads(raw.decode())
        except tomllib.TOMLDecodeError as exc:
            raise FederationFileError(f"{path}: invalid TOML: {exc}") from None
    else:
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise FederationFileError(f"{path}: invalid JSON: {exc}") from None
    return parse(doc, base=path.parent)


def parse(doc: dict, base: Path | None = None) -> FederationSpec:
    if not isinstance(doc, dict) or not isinstance(doc.get("parties"), list) or not doc["parties"]:
        raise FederationFileError("the federation file needs a non-empty 'parties' list")
    name = str(doc.get("federation", "federation"))
    max_bytes = doc.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    if not isinstance(max_bytes, int) or max_bytes < 1024:
        raise FederationFileError(f"max_message_bytes must be an integer of at least 1024, got {max_bytes!r}")
    entries = []
    for i, p in enumerate(doc["parties"]):
        if not isinstance(p, dict):
            raise FederationFileError(f"parties[{i}] is not an object")
        missing = [k for k in ("name", "rank", "role", "address", "fingerprint", "certificate") if k not in p]
        if missing:
            raise FederationFileError(f"parties[{i}] lacks {', '.join(missing)}")
        if p["role"] not in ROLES:
            raise FederationFileError(f"party {p['name']!r}: role must be one of {ROLES}, got {p['role']!r}")
        if not isinstance(p["rank"], int):
            raise FederationFileError(f"party {p['name']!r}: rank must be an integer")
        host, port = _split_address(p["address"], f"party {p['name']!r} address")
        listen_host, listen_port = host, port
        if "listen" in p:
            listen_host, listen_port = _split_address(p["listen"], f"party {p['name']!r} listen address")
        cert = str(p["certificate"])
        if "-----BEGIN CERTIFICATE-----" not in cert:
            cpath = Path(cert) if base is None or os.path.isabs(cert) else base / cert
            try:
                cert = cpath.read_text()
            except OSError as exc:
                raise FederationFileError(f"party {p['name']!r}: cannot read certificate {cpath}: {exc}") from None
        try:
            fp = fingerprint_pem(cert)
        except ValueError as exc:
            raise FederationFileError(f"party {p['name']!r}: bad certificate: {exc}") from None
        pinned = str(p["fingerprint"]).lower()
        if not pinned.startswith("sha256:"):
            pinned = "sha256:" + pinned.replace(":", "")
        if fp != pinned:
            raise FederationFileError(f"party {p['name']!r}: its certificate's fingerprint {fp} differs from the "
                                      f"pinned {pinned}: the certificate file is not the one agreed on")
        entries.append(PartyEntry(str(p["name"]), p["rank"], p["role"], host, port, fp, cert, listen_host,
                                  listen_port))
    entries.sort(key=lambda e: e.rank)
    if [e.rank for e in entries] != list(range(len(entries))):
        raise FederationFileError(f"ranks must be 0..{len(entries) - 1}, each once; got {[e.rank for e in entries]}")
    for key in ("name", "fingerprint"):
        vals = [getattr(e, key) for e in entries]
        if len(set(vals)) != len(vals):
            raise FederationFileError(f"two parties share a {key}: each organisation needs its own")
    addrs = [(e.host, e.port) for e in entries]
    if len(set(addrs)) != len(addrs):
        raise FederationFileError("two parties share an address")
    roles = [e.role for e in entries]
    if roles.count("active") != 1:
        raise FederationFileError(f"exactly one party must be 'active' (the label holder), got {roles.count('active')}")
    if roles.count("coordinator") > 1 or ("coordinator" in roles and roles[-1] != "coordinator"):
        raise FederationFileError("at most one coordinator, and it must take the last rank")
    canon = json.dumps({"federation": name, "max_message_bytes": max_bytes,
                        "parties": [[e.name, e.rank, e.role, e.host, e.port, e.fingerprint] for e in entries]},
                       sort_keys=True)
    return FederationSpec(name, tuple(entries), max_bytes, hashlib.sha256(canon.encode()).hexdigest())


def write(path, parties: list[dict], *, federation: str = "federation",
          max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> FederationSpec:
    """Write a federation file (JSON) from party dicts; returns it parsed (and so validated)."""
    doc = {"federation": federation, "max_message_bytes": max_message_bytes, "parties": parties}
    spec = parse(doc, base=Path(path).parent)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
    return spec
