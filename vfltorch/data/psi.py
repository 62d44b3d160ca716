"""Row alignment by private set intersection (ECDH-PSI on the prime-order subgroup of edwards25519).

Each party hashes its IDs into the group with libsodium's Elligator 2 map
(``crypto_core_ed25519_from_uniform``, cofactor cleared) and raises them to a
secret scalar drawn from OS entropy (512 bits from ``secrets``, reduced by ``crypto_core_ed25519_scalar_reduce``).
Exponentiation is libsodium's ``crypto_scalarmult_ed25519_noclamp``, which rejects
points outside the prime-order subgroup. No curve arithmetic is written here.

Protocol between the active party A (secret a) and each passive party P (secret b):

1. P sends ``H(y)^b`` for its IDs, in an order P shuffles with a secret permutation.
2. A sends ``H(x)^a`` for its IDs; P raises each to ``b`` and returns ``H(x)^ab`` in the
   same order (chunk by chunk).
3. A raises P's points to ``a``: an ID of A is common with P iff ``H(x)^ab`` is among them.

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

try:  # PyNaCl's cffi binding of libsodium (PyNaCl does not wrap the ed25519 core functions)
    import nacl.bindings  # noqa: F401  (runs sodium_init)
    from nacl._sodium import ffi, lib
except ImportError:  # pragma: no cover - reported when PSI is used
    ffi = lib = None

POINT = 32
CHUNK = 1 << 15            # points per message (1 MiB)
DOMAIN = b"vfltorch/psi/v1\x00"


class PSIError(RuntimeError):
    pass


def _need_sodium():
    if lib is None:
        raise PSIError("private set intersection needs PyNaCl (pip install pynacl)")


def random_scalar() -> bytes:
    """A secret non-zero scalar mod the group order: 512 bits of OS entropy (``secrets``) reduced by libsodium."""
    _need_sodium()
    out = ffi.new("unsigned char[]", 32)
    while True:
        lib.crypto_core_ed25519_scalar_reduce(out, secrets.token_bytes(64))
        k = bytes(ffi.buffer(out, 32))
        if any(k):
            return k


def canonical_id(v) -> str:
    """The text an ID is compared by: integral floats as integers (a CSV column read as float, 7.0,
    matches another party's integer 7), everything else as ``str``."""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def hash_ids(ids) -> np.ndarray:
    """IDs (any values; compared by ``canonical_id``) as group points, an (n, 32) uint8 array. Never sent."""
    _need_sodium()
    n = len(ids)
    out = ffi.new("unsigned char[]", max(n, 1) * POINT)
    for i, v in enumerate(ids):
        r = hashlib.blake2b(DOMAIN + canonical_id(v).encode(), digest_size=32).digest()
        lib.crypto_core_ed25519_from_uniform(out + POINT * i, r)
    return np.frombuffer(ffi.buffer(out, n * POINT), dtype=np.uint8).reshape(n, POINT).copy()


def exponentiate(points: np.ndarray, scalar: bytes) -> np.ndarray:
    """Every point raised to ``scalar``; a point outside the prime-order subgroup is refused."""
    _need_sodium()
    points = np.ascontiguousarray(points, dtype=np.uint8)
    n = points.shape[0]
    src = ffi.from_buffer(points)
    out = ffi.new("unsigned char[]", max(n, 1) * POINT)
    k = ffi.new("unsigned char[]", scalar)
    for i in range(n):
        if lib.crypto_scalarmult_ed25519_noclamp(out + POINT * i, k, src + POINT * i) != 0:
            raise PSIError("a peer sent a value that is not a valid group element")
    return np.frombuffer(ffi.buffer(out, n * POINT), dtype=np.uint8).reshape(n, POINT).copy()


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


def _pair_active(fed, peer: int, mine_a: np.ndarray, scalar: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """A's side with one passive party: which of A's rows are common, and where they sit in P's list."""
    n_peer = int(fed.recv_json(peer))
    fed.send_json(len(mine_a), peer)
    theirs_b = _recv_points(fed, n_peer, peer)
    theirs_ab = exponentiate(theirs_b, scalar)
    where = {k: i for i, k in enumerate(_keys(theirs_ab))}
    mine_ab = np.empty_like(mine_a)
    for s in range(0, len(mine_a), CHUNK):   # one chunk out, its answer back: no blocking-send deadlock
        block = mine_a[s:s + CHUNK]
        fed.send_tensor(torch.from_numpy(block.copy()), peer)
        mine_ab[s:s + len(block)] = _recv_points(fed, len(block), peer)
    pos = np.array([where.get(k, -1) for k in _keys(mine_ab)], dtype=np.int64)
    return pos >= 0, pos, n_peer


def _pair_passive(fed, ids_points: np.ndarray, scalar: bytes) -> np.ndarray:
    """P's side: send the shuffled ``H(y)^b``, answer A's chunks; returns the secret shuffle."""
    active = fed.active
    perm = np.random.default_rng(secrets.randbits(128)).permutation(len(ids_points))
    fed.send_json(len(ids_points), active)
    n_active = int(fed.recv_json(active))
    _send_points(fed, exponentiate(ids_points[perm], scalar), active)
    done = 0
    while done < n_active:
        block = _recv_points(fed, min(CHUNK, n_active - done), active)
        fed.send_tensor(torch.from_numpy(exponentiate(block, scalar)), active)
        done += len(block)
    return perm


def align_rows(fed, ids, *, where: str = "the file") -> tuple[np.ndarray, dict]:
    """Rows of this party's ``ids`` common to every data party, in the active party's row order.

    Returns ``(rows, counts)``: ``rows`` indexes this party's table; ``counts`` maps each party
    (by rank, as str) to its row count, plus ``aligned``. Raises ``PSIError`` if nothing is common.
    Runs inside ``fed.phase("data/psi")``; every data party must call it.
    """
    _need_sodium()
    scalar = random_scalar()
    points = hash_ids(ids)
    with fed.phase("data/psi"):
        if fed.is_active:
            mine_a = exponentiate(points, scalar)
            common = np.ones(len(ids), dtype=bool)
            positions, sizes = {}, {str(fed.rank): len(ids)}
            for peer in fed.parties:
                if peer == fed.rank:
                    continue
                hit, pos, n_peer = _pair_active(fed, peer, mine_a, scalar)
                common &= hit
                positions[peer] = pos
                sizes[str(peer)] = n_peer
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
    if counts["aligned"] == 0:
        raise PSIError(f"the parties' files have no ID in common ({_describe(counts)}): check --id-column "
                       f"and the files")
    return rows, counts


def _describe(counts: dict) -> str:
    return ", ".join(f"party {r}: {n} rows" for r, n in counts["rows"].items())
