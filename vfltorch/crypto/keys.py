"""Paillier keys: phe's key objects, a size policy, and cached gmpy2 views of them.

The key objects *are* python-paillier's ``PaillierPublicKey`` and
``PaillierPrivateKey``, so a key made here works with phe and the other way
round. Recall the scheme (Paillier 1999, with phe's choice g = n + 1):

* public key: n = p q for primes p, q of equal length; ciphertexts live in
  Z*_{n^2}, plaintexts in Z_n.
* encryption of m with randomness r in Z*_n:  c = g^m r^n = (1 + m n) r^n  (mod n^2),
  because (1 + n)^m = 1 + m n (mod n^2) by the binomial theorem.
* decryption with the CRT (Paillier section 7, as phe does): with
  h_p = L_p(g^{p-1} mod p^2)^{-1} mod p and L_p(x) = (x - 1) / p,
  m_p = L_p(c^{p-1} mod p^2) h_p mod p, likewise m_q, then m = CRT(m_p, m_q).

Size policy: keys under ``MIN_KEY_BITS`` (1024) bits can be factored with
public tools and are refused everywhere a key enters this module, unless the
key was made with ``generate_keypair(..., insecure=True)`` or passed through
``allow_insecure`` (tests only). 2048 bits is the default.

``public_math`` / ``private_math`` return the key's numbers as gmpy2 ``mpz``
once per key (cached), so the arithmetic never converts Python ints on the
hot path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import gmpy2
from gmpy2 import mpz
from phe import paillier
from phe.paillier import PaillierPrivateKey, PaillierPublicKey

from .errors import KeyTooSmallError

MIN_KEY_BITS = 1024
DEFAULT_KEY_BITS = 2048
# Below this even the insecure path refuses: fixed-point values need room in Z_n.
_ABSOLUTE_MIN_BITS = 128
_INSECURE_ATTR = "_vfltorch_insecure"
_insecure_moduli: set[int] = set()


def generate_keypair(n_length: int = DEFAULT_KEY_BITS, *, insecure: bool = False
                     ) -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """A fresh phe key pair with an ``n_length``-bit modulus (default 2048).

    ``n_length`` under 1024 is refused unless ``insecure=True``; such keys are
    for tests and are marked so that the rest of this module accepts them.
    """
    check_key_size(n_length, insecure=insecure)
    public_key, private_key = paillier.generate_paillier_keypair(n_length=n_length)
    if n_length < MIN_KEY_BITS:
        allow_insecure(public_key)
    return public_key, private_key


def check_key_size(n_length: int, *, insecure: bool = False) -> None:
    """The size policy of ``generate_keypair``, checkable before any key is made (``vfl`` checks options with it)."""
    if isinstance(n_length, bool) or not isinstance(n_length, int):
        raise TypeError(f"n_length must be an int number of bits, got {n_length!r}")
    if n_length % 2:
        # phe draws two n_length/2-bit primes until n has exactly n_length bits:
        # an odd length never happens and the loop would not end.
        raise ValueError(f"n_length must be even (two primes of n_length/2 bits), got {n_length}")
    if n_length < _ABSOLUTE_MIN_BITS:
        raise ValueError(f"n_length must be at least {_ABSOLUTE_MIN_BITS} bits, got {n_length}")
    if n_length < MIN_KEY_BITS and not insecure:
        raise KeyTooSmallError(_too_small_message(n_length))


def allow_insecure(public_key: PaillierPublicKey) -> PaillierPublicKey:
    """Accept this (small, test-only) key in this module; returns the key.

    The mark travels with the key object when it is pickled to another
    process; a key rebuilt from its modulus must be marked again there.
    """
    _check_type(public_key)
    setattr(public_key, _INSECURE_ATTR, True)
    _insecure_moduli.add(int(public_key.n))
    return public_key


def is_allowed(public_key: PaillierPublicKey) -> bool:
    """True if the key is large enough, or was explicitly allowed as an insecure test key."""
    _check_type(public_key)
    return (public_key.n.bit_length() >= MIN_KEY_BITS or getattr(public_key, _INSECURE_ATTR, False)
            or int(public_key.n) in _insecure_moduli)


def check_key(public_key: PaillierPublicKey, *, insecure: bool = False) -> PaillierPublicKey:
    """Raise ``KeyTooSmallError`` unless the key meets the size policy (or ``insecure``)."""
    if not insecure and not is_allowed(public_key):
        raise KeyTooSmallError(_too_small_message(public_key.n.bit_length()))
    return public_key


def key_fingerprint(public_key: PaillierPublicKey) -> str:
    """16 hex digits of SHA-256(n): names a key in messages and serialised headers."""
    return public_math(public_key, insecure=True).fingerprint


def _check_type(public_key) -> None:
    if not isinstance(public_key, PaillierPublicKey):
        raise TypeError(f"expected a phe PaillierPublicKey, got {type(public_key).__name__}; "
                        f"make keys with vfltorch.crypto.generate_keypair")


def _too_small_message(bits: int) -> str:
    return (f"a {bits}-bit Paillier key is too small: keys under {MIN_KEY_BITS} bits can be factored. "
            f"Use generate_keypair({DEFAULT_KEY_BITS}) (the default). For tests only, pass "
            f"insecure=True to generate_keypair, or mark an existing key with "
            f"vfltorch.crypto.allow_insecure(public_key).")


@dataclass(frozen=True, eq=False)
class PublicMath:
    """A public key's numbers as mpz. ``max_int`` is phe's safe plaintext magnitude, floor(n/3) - 1."""

    key: PaillierPublicKey
    n: mpz
    nsquare: mpz
    max_int: mpz
    bits: int            # bit length of n
    width: int           # bytes of one serialised ciphertext (an element of Z_{n^2})
    fingerprint: str


@dataclass(frozen=True, eq=False)
class PrivateMath:
    """A private key's CRT constants as mpz (phe's names; p < q as phe orders them)."""

    public: PublicMath
    p: mpz
    q: mpz
    psquare: mpz
    qsquare: mpz
    p_minus_1: mpz
    q_minus_1: mpz
    hp: mpz
    hq: mpz
    p_inverse: mpz       # p^{-1} mod q


def public_math(public_key: PaillierPublicKey, *, insecure: bool = False) -> PublicMath:
    """Validate ``public_key`` against the size policy and return its cached mpz view."""
    _check_type(public_key)
    check_key(public_key, insecure=insecure)
    return _public_math(int(public_key.n), public_key)


@lru_cache(maxsize=64)
def _public_math_cached(n: int) -> tuple:
    n_ = mpz(n)
    nsq = n_ * n_
    digest = hashlib.sha256(int(n).to_bytes((n.bit_length() + 7) // 8, "big")).hexdigest()[:16]
    return n_, nsq, n_ // 3 - 1, n_.bit_length(), (nsq.bit_length() + 7) // 8, digest


def _public_math(n: int, key: PaillierPublicKey) -> PublicMath:
    n_, nsq, max_int, bits, width, digest = _public_math_cached(n)
    return PublicMath(key, n_, nsq, max_int, bits, width, digest)


def private_math(private_key: PaillierPrivateKey) -> PrivateMath:
    """The cached mpz CRT constants of ``private_key`` (its public key is checked too)."""
    if not isinstance(private_key, PaillierPrivateKey):
        raise TypeError(f"expected a phe PaillierPrivateKey, got {type(private_key).__name__}")
    pub = public_math(private_key.public_key)
    return _private_math(int(private_key.p), int(private_key.q), int(private_key.hp), int(private_key.hq),
                         int(private_key.p_inverse), pub)


def _private_math(p: int, q: int, hp: int, hq: int, p_inverse: int, pub: PublicMath) -> PrivateMath:
    parts = _private_math_cached(p, q, hp, hq, p_inverse)
    return PrivateMath(pub, *parts)


@lru_cache(maxsize=64)
def _private_math_cached(p: int, q: int, hp: int, hq: int, p_inverse: int) -> tuple:
    p_, q_ = mpz(p), mpz(q)
    return p_, q_, p_ * p_, q_ * q_, p_ - 1, q_ - 1, mpz(hp), mpz(hq), mpz(p_inverse)


def private_math_from_primes(p: int, q: int, public: PublicMath) -> PrivateMath:
    """Rebuild the CRT constants from p and q (worker processes receive only the primes)."""
    if p > q:
        p, q = q, p
    p_, q_ = mpz(p), mpz(q)
    if p_ * q_ != public.n:
        raise ValueError("the primes do not match the public key")
    psq, qsq = p_ * p_, q_ * q_
    g = public.n + 1
    # h(x) = L_x(g^{x-1} mod x^2)^{-1} mod x, Paillier's CRT constants (phe's h_function).
    hp = gmpy2.invert((gmpy2.powmod(g, p_ - 1, psq) - 1) // p_, p_)
    hq = gmpy2.invert((gmpy2.powmod(g, q_ - 1, qsq) - 1) // q_, q_)
    return PrivateMath(public, p_, q_, psq, qsq, p_ - 1, q_ - 1, hp, hq, gmpy2.invert(p_, q_))


__all__ = [
    "DEFAULT_KEY_BITS", "MIN_KEY_BITS", "PaillierPrivateKey", "PaillierPublicKey", "PrivateMath", "PublicMath",
    "allow_insecure", "check_key", "generate_keypair", "is_allowed", "key_fingerprint", "private_math",
    "private_math_from_primes", "public_math",
]
