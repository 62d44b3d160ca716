"""Row alignment by ECDH-PSI (vfltorch/data/psi.py): correct intersection, and nothing outside it leaks."""

import hashlib

import numpy as np
import pytest

from vfltorch.comm import launch
from vfltorch.data import psi
from vfltorch.data.loaders import stable_id_hash


def test_exponentiation_commutes_and_refuses_bad_points():
    pts = psi.hash_ids(["a", "b", 7])
    a, b = psi.random_scalar(), psi.random_scalar()
    assert a != b
    ab = psi.exponentiate(psi.exponentiate(pts, a), b)
    ba = psi.exponentiate(psi.exponentiate(pts, b), a)
    assert (ab == ba).all() and len({r.tobytes() for r in ab}) == 3
    # the same ID (compared as text) hashes to the same point; a junk value is refused
    assert (psi.hash_ids(["7"]) == pts[2:3]).all() and (psi.hash_ids([np.int64(7), " 7 "]) == pts[2:3]).all()
    assert not (psi.hash_ids(["07"]) == pts[2:3]).all() and not (psi.hash_ids(["7.0"]) == pts[2:3]).all()
    assert not (psi.hash_ids(["A"]) == pts[0:1]).all()                  # case is kept
    with pytest.raises(psi.PSIError, match="floating-point"):    # a float ID has lost digits: never matched
        psi.hash_ids([np.float64(7.0)])
    with pytest.raises(psi.PSIError, match="not a valid group element"):
        psi.exponentiate(np.full((1, 32), 0xFF, np.uint8), a)          # not canonical (u >= p)
    for small in (0, 1, (1 << 255) - 20, (1 << 255) - 19):           # small order (0, 1, p - 1); p: not canonical
        with pytest.raises(psi.PSIError, match="not a valid group element"):
            psi.exponentiate(np.frombuffer(small.to_bytes(32, "little"), np.uint8)[None], a)


def test_edwards_to_montgomery_matches_libsodium():
    # The one coordinate map written in psi.py, checked against libsodium's converter on hashed points.
    from nacl.bindings import crypto_sign_ed25519_pk_to_curve25519
    from nacl._sodium import ffi, lib
    edwards = ffi.new("unsigned char[]", 32)
    for i in range(50):
        lib.crypto_core_ed25519_from_uniform(edwards, hashlib.blake2b(str(i).encode(), digest_size=32).digest())
        point = bytes(ffi.buffer(edwards, 32))
        assert psi.edwards_to_montgomery(point) == crypto_sign_ed25519_pk_to_curve25519(point)


def _align_job(fed, id_lists):
    captured = []
    draw = psi.random_scalar

    def keep():            # the party's own secret, for the attack below (the attacker knows its own key)
        k = draw()
        captured.append(k)
        return k

    psi.random_scalar = keep
    ids = id_lists[fed.parties.index(fed.rank)]
    rows, counts = psi.align_rows(fed, ids, engine="ecdh")
    sent = [(m.dst, m.tensor.numpy().tobytes()) for m in fed.transcript]
    return rows, counts, sent, captured[0]


def _universe():
    rng = np.random.default_rng(1)
    everyone = [f"user-{i:04d}@example.org" for i in range(300)]
    sets = []
    for share in (0.8, 0.7, 0.6):
        pick = [u for u in everyone if rng.random() < share]
        sets.append([pick[i] for i in rng.permutation(len(pick))])   # each file in its own order
    return everyone, sets


def _dictionary_attack(dictionary, received: list[bytes], own_scalar: bytes | None) -> set:
    """IDs of ``dictionary`` whose raw value, unkeyed hash or own-key encryption occurs in what was received."""
    blob = b"".join(received)
    found = set()
    pts = psi.hash_ids(dictionary)
    mine = psi.exponentiate(pts, own_scalar) if own_scalar else None
    for i, d in enumerate(dictionary):
        forms = [str(d).encode(), int(stable_id_hash([d])[0]).to_bytes(8, "little", signed=True),
                 hashlib.blake2b(str(d).encode(), digest_size=8).digest(), pts[i].tobytes()]
        if mine is not None:
            forms.append(mine[i].tobytes())
        if any(f in blob for f in forms):
            found.add(d)
    return found


def test_three_parties_align_on_the_plain_intersection_and_learn_nothing_else():
    everyone, sets = _universe()
    out = launch(_align_job, 3, args=(sets,), record_transcript=True)
    common = set(sets[0]) & set(sets[1]) & set(sets[2])
    expected = [u for u in sets[0] if u in common]           # the active party's row order
    assert 0 < len(expected) < min(map(len, sets))
    for q, (rows, counts, _, _) in enumerate(out):
        assert [sets[q][r] for r in rows] == expected
        assert counts["aligned"] == len(expected)
    assert out[0][1]["rows"] == {str(q): len(s) for q, s in enumerate(sets)}
    # Dictionary attack: each party pools everything it received, its own key and the whole universe of IDs.
    for q in range(3):
        received = [b for rows, counts, sent, _ in out for dst, b in sent if dst == q]
        assert received, "the attack needs the transcript"
        found = _dictionary_attack(everyone, received, out[q][3])
        assert not (found - common), f"party {q} recovered IDs outside the intersection"
        assert not found      # not even the common IDs appear in a form the party can test


def test_the_attack_recovers_ids_from_a_clear_hash_exchange():
    # The alignment vfltorch used before PSI sent stable_id_hash(ids) to the active party: a dictionary
    # attack on those messages recovers every ID of the other party, also outside the intersection.
    everyone, sets = _universe()
    clear = stable_id_hash(sets[1]).tobytes()
    found = _dictionary_attack(everyone, [clear], None)
    assert found == set(sets[1]) and found - set(sets[0])


@pytest.mark.slow
def test_empty_intersection_is_an_error_at_every_party():
    with pytest.raises(Exception) as info:
        launch(_align_job, 2, args=([["a", "b"], ["c", "d"]],))
    for rank in (0, 1):
        assert "no ID in common" in info.value.errors[rank]
