"""Row alignment by private set intersection: RR22 (``psi_rr22.py``, SecretFlow's libpsi) or ECDH-PSI.

``align_rows(fed, ids, engine=...)`` is the one entry point; ``engine`` is ``rr22`` (OT extension, the
default when SecretFlow's ``spu`` is installed) or ``ecdh`` (below; the default otherwise, about 20x
slower at 10^5 IDs). Both give every party the same rows in the active party's order.

ECDH-PSI with X25519 on Curve25519.

Hash to the group: BLAKE2b-256 of (domain tag, ID as text) goes through libsodium's Elligator 2
map onto edwards25519 (``crypto_core_ed25519_from_uniform``, cofactor cleared, so the point lies
in the prime-order subgroup), and the point's Montgomery u-coordinate is taken with the
birational map of RFC 7748 section 4.1, u = (1 + y) / (1 - y) mod 2^255 - 19 (one field
inversion, gmpy2). The group operation is OpenSSL's X25519 through ``cryptography``: raising
to a secret scalar is ``X25519(k, u)``, which clamps k (a multiple of the cofactor 8, top bit
fixed), so X25519(b, X25519(a, u)) = X25519(a, X25519(b, u)): the exponentiations commute, as
the protocol needs. No group arithmetic is written here; the coordinate map is checked against
libsodium's ``crypto_sign_ed25519_pk_to_curve25519`` in tests/test_psi.py.

Why X25519 and not libsodium's ed25519 scalar multiplication used before: measured on this
machine, 58 us per X25519 (OpenSSL, from Python) against 152 us per
``crypto_scalarmult_ed25519_noclamp`` (PyNaCl's bundled libsodium), and the Edwards-to-
Montgomery map costs 5 us where libsodium's converter (which re-checks the subgroup) costs 55.

Each party's secret scalar is 32 bytes from ``secrets`` (OS entropy), fresh per alignment,
never logged. A point received from a peer is refused if its encoding is not canonical
(u >= p) or if it has small order (X25519's all-zero output); a point on the quadratic twist
is harmless (the twist of Curve25519 has a large prime-order subgroup and clamping removes
the small part), so honest and dishonest inputs cost the same and reveal nothing of k.

Protocol between the active party A (secret a) and each passive party P (secret b):

1. P sends ``H(y)^b`` for its IDs, in an order P shuffles with a secret permutation.
2. A sends ``H(x)^a`` for its IDs to every P; then, at the same time, A raises each P's points
   to ``a`` while each P raises A's points to ``b`` and returns ``H(x)^ab`` in A's order.
3. An ID of A is common with P iff ``H(x)^ab`` is among P's ``H(y)^ba``.

After every passive party, A keeps its rows common to all parties, in A's own row
order, and sends each passive party only the positions (in P's shuffled list) of
those final rows. What each learns is in docs/alignment.md. Every message goes
through ``fed.send_tensor``/``recv_tensor``/``send_json``/``recv_json``, so PSI runs
on whatever transport the ``Federation`` uses.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import torch

from .ids import PSIError, canonical_id  # noqa: F401 - the IDs' text and the alignment error, shared with rr22

try:  # PyNaCl's cffi binding of libsodium (PyNaCl does not wrap the ed25519 core functions)
    import nacl.bindings  # noqa: F401  (runs sodium_init)
    from nacl._sodium import ffi, lib
except ImportError:  # pragma: no cover - reported when PSI is used
    ffi = lib = None
try:
    import gmpy2
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
except ImportError:  # pragma: no cover - reported when PSI is used
    gmpy2 = X25519PrivateKey = X25519PublicKey = None

POINT = 32
CHUNK = 1 << 15            # points per message (1 MiB)
DOMAIN = b"vfltorch/psi/v2\x00"
FIELD = (1 << 255) - 19    # the prime of Curve25519 / edwards25519
_Y_MASK = (1 << 255) - 1   # an edwards25519 encoding is y (255 bits) and the sign of x in the top bit


def _need_libraries():
    if lib is None or X25519PrivateKey is None or gmpy2 is None:
        raise PSIError("private set intersection needs PyNaCl, cryptography and gmpy2 "
                       "(pip install pynacl cryptography gmpy2)")


def random_scalar() -> bytes:
    """A secret X25519 scalar: 32 bytes of OS entropy (``secrets``); X25519 clamps it."""
    return secrets.token_bytes(32)


def edwards_to_montgomery(encoded: bytes) -> bytes:
    """The Montgomery u-coordinate (32 bytes, little endian) of an edwards25519 point's encoding."""
    y = int.from_bytes(encoded, "little") & _Y_MASK
    if y in (1, FIELD - 1):   # the identity or the point of order 2: never an output of the hash below
        raise PSIError("an ID hashed to a point of small order")
    u = (1 + y) * gmpy2.invert(1 - y, FIELD) % FIELD
    return int(u).to_bytes(POINT, "little")


def hash_ids(ids) -> np.ndarray:
    """IDs (any values; compared by ``canonical_id``) as group points, an (n, 32) uint8 array. Never sent."""
    _need_libraries()
    n = len(ids)
    edwards = ffi.new("unsigned char[]", POINT)
    out = np.empty((n, POINT), dtype=np.uint8)
    for i, v in enumerate(ids):
        r = hashlib.blake2b(DOMAIN + canonical_id(v).encode(), digest_size=32).digest()
        lib.crypto_core_ed25519_from_uniform(edwards, r)
        out[i] = np.frombuffer(edwards_to_montgomery(bytes(ffi.buffer(edwards, POINT))), dtype=np.uint8)
    return out


def _non_canonical(points: np.ndarray) -> np.ndarray:
    """Rows whose little-endian value is not below p = 2^255 - 19 (top bit set, or in [p, 2^255))."""
    top = points[:, 31]
    at_least_p = (top == 0x7F) & (points[:, 1:31] == 0xFF).all(axis=1) & (points[:, 0] >= 0xED)
    return (top & 0x80).astype(bool) | at_least_p


def exponentiate(points: np.ndarray, scalar: bytes) -> np.ndarray:
    """Every point raised to ``scalar`` (X25519); a non-canonical or small-order point is refused."""
    _need_libraries()
    points = np.ascontiguousarray(points, dtype=np.uint8)
    if points.ndim != 2 or points.shape[1] != POINT or _non_canonical(points).any():
        raise PSIError("a peer sent a value that is not a valid group element")
    key = X25519PrivateKey.from_private_bytes(scalar)
    load = X25519PublicKey.from_public_bytes
    out = bytearray(len(points) * POINT)
    raw = points.tobytes()
    for i in range(len(points)):
        try:
            out[POINT * i:POINT * (i + 1)] = key.exchange(load(raw[POINT * i:POINT * (i + 1)]))
        except ValueError:   # small-order input: X25519's output would be all zero
            raise PSIError("a peer sent a value that is not a valid group element") from None
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(len(points), POINT).copy()


def _send_points(fed, points: np.ndarray, dst: int) -> None:
    for s in range(0, len(points), CHUNK):
        fed.send_tensor(torch.from_numpy(points[s:s + CHUNK].copy()), dst)


def _recv_points(fed, n: int, src: int) -> np.ndarray:
    parts, got = [], 0
    while got < n:
        t = fed.recv_tensor(src, device="cpu")
        a = t.numpy()
        if a.dtype != np.uint8 or a.ndim != 2 or a.shape[1] != POINT or a.shape[0] > n - got or a.shape[0] == 0:
            raise PSIError("a peer sent a malformed PSI message")
        parts.append(a)
        got += a.shape[0]
    return np.concatenate(parts) if parts else np.zeros((0, POINT), np.uint8)


def _keys(points: np.ndarray) -> list[bytes]:
    return [points[i].tobytes() for i in range(len(points))]


def _exchange_active(fed, peer: int, mine_a: np.ndarray) -> np.ndarray:
    """A's first round with one passive party: sizes, P's ``H(y)^b`` in, A's ``H(x)^a`` out."""
    n_peer = int(fed.recv_json(peer))
    fed.send_json(len(mine_a), peer)
    theirs_b = _recv_points(fed, n_peer, peer)
    _send_points(fed, mine_a, peer)     # P raises these to b while A raises theirs_b to a
    return theirs_b


def _match_active(fed, peer: int, theirs_b: np.ndarray, n_mine: int, scalar: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A's second round: which of A's rows are common with P, and where they sit in P's list."""
    theirs_ab = exponentiate(theirs_b, scalar)
    where = {k: i for i, k in enumerate(_keys(theirs_ab))}
    mine_ab = _recv_points(fed, n_mine, peer)
    pos = np.array([where.get(k, -1) for k in _keys(mine_ab)], dtype=np.int64)
    return pos >= 0, pos


def _pair_passive(fed, ids_points: np.ndarray, scalar: bytes) -> np.ndarray:
    """P's side: send the shuffled ``H(y)^b``, raise A's points to b; returns the secret shuffle."""
    active = fed.active
    perm = np.random.default_rng(secrets.randbits(128)).permutation(len(ids_points))
    fed.send_json(len(ids_points), active)
    n_active = int(fed.recv_json(active))
    _send_points(fed, exponentiate(ids_points[perm], scalar), active)
    theirs = _recv_points(fed, n_active, active)
    _send_points(fed, exponentiate(theirs, scalar), active)
    return perm


ENGINES = ("rr22", "ecdh")
METHODS = {"rr22": "rr22-psi (OT extension; SecretFlow spu libpsi)",
           "ecdh": "ecdh-psi (X25519, Elligator 2 hash)"}


def default_engine() -> str:
    """``rr22`` when SecretFlow's spu is installed (checked without importing it), else ``ecdh``."""
    from . import psi_rr22

    return "rr22" if psi_rr22.available() else "ecdh"


def fallback_note(engine: str | None) -> str | None:
    """What to tell the user when the default engine had to fall back to ECDH."""
    from . import psi_rr22

    if engine is None and not psi_rr22.available():
        return (f"SecretFlow's spu is not installed, so rows are aligned by ECDH-PSI (about 20x slower than "
                f"rr22 at 10^5 IDs): `make install` or `pip install --no-deps spu=={psi_rr22.SPU_VERSION}`")
    return None


def align_rows(fed, ids, *, where: str = "the file", engine: str | None = None) -> tuple[np.ndarray, dict]:
    """Rows of this party's ``ids`` common to every data party, in the active party's row order.

    Returns ``(rows, counts)``: ``rows`` indexes this party's table; ``counts`` maps each party
    (by rank, as str) to its row count, plus ``aligned`` and ``method``. Raises ``PSIError`` if
    nothing is common. Runs inside ``fed.phase("data/psi")``; every data party must call it, with
    the same ``engine`` (``ENGINES``; None: ``default_engine()``).
    """
    chosen = default_engine() if engine is None else engine
    if chosen not in ENGINES:
        raise PSIError(f"unknown PSI engine {chosen!r}: choose one of {', '.join(ENGINES)}")
    if chosen == "rr22":
        from . import psi_rr22

        try:
            rows, counts = psi_rr22.align_rows(fed, ids)
        except psi_rr22.PSIUnavailable as exc:
            raise PSIError(str(exc)) from None
    else:
        rows, counts = _align_rows_ecdh(fed, ids)
    counts["method"] = METHODS[chosen]
    note = fallback_note(engine)
    if note:
        counts["note"] = note
    if counts["aligned"] == 0:
        raise PSIError(f"the parties' files have no ID in common ({_describe(counts)}): check --id-column "
                       f"and the files")
    return rows, counts


def _align_rows_ecdh(fed, ids) -> tuple[np.ndarray, dict]:
    _need_libraries()
    scalar = random_scalar()
    points = hash_ids(ids)
    with fed.phase("data/psi"):
        if fed.is_active:
            mine_a = exponentiate(points, scalar)
            common = np.ones(len(ids), dtype=bool)
            positions, sizes = {}, {str(fed.rank): len(ids)}
            peers = [p for p in fed.parties if p != fed.rank]
            received = {peer: _exchange_active(fed, peer, mine_a) for peer in peers}  # every P busy at once
            for peer in peers:
                theirs_b = received.pop(peer)
                sizes[str(peer)] = len(theirs_b)
                hit, positions[peer] = _match_active(fed, peer, theirs_b, len(mine_a), scalar)
                common &= hit
            rows = np.flatnonzero(common)
            counts = {"rows": sizes, "aligned": int(len(rows))}
            for peer, pos in positions.items():   # a passive party is told the aligned count only
                fed.send_json(int(len(rows)), peer)
                fed.send_tensor(torch.from_numpy(pos[rows].copy()), peer)
        else:
            perm = _pair_passive(fed, points, scalar)
            counts = {"rows": {str(fed.rank): len(ids)}, "aligned": int(fed.recv_json(fed.active))}
            pos = fed.recv_tensor(fed.active, device="cpu").numpy()
            if pos.dtype != np.int64 or pos.ndim != 1 or len(pos) != counts["aligned"] or \
                    (len(pos) and (pos.min() < 0 or pos.max() >= len(perm) or len(np.unique(pos)) != len(pos))):
                raise PSIError("the active party sent a malformed row order")
            rows = perm[pos]
    del scalar
    return rows, counts


def _describe(counts: dict) -> str:
    return ", ".join(f"party {r}: {n} rows" for r, n in counts["rows"].items())
