"""Paillier arithmetic on flat lists of gmpy2 ``mpz``: the hot loops, nothing else.

Everything here works on raw residues: ciphertexts in Z*_{n^2}, plaintexts as
signed fixed-point integers (see ``encoding.py``). Shapes, scales and bounds
are ``tensor.py``'s business; these functions are also what the worker
processes of ``parallel.py`` run, so they take plain numbers, not key objects.

The identities used (g = n + 1, [[m]] an encryption of m):

* online encryption, given an obfuscator s = r^n mod n^2 made ahead of time:
      [[m]] = (1 + m n) s = s + n ((m s) mod n)      (mod n^2)
  since m n s mod n^2 = n (m s mod n). For a short fixed-point m this is a
  small product, one reduction mod n and one product by n: cheaper than the
  one modular multiplication mod n^2 that the textbook formula costs.
* ciphertext + plaintext: the same formula with s = c (no new randomness).
* ciphertext + ciphertext: [[a]] [[b]] = [[a + b]]  (one multiplication mod n^2).
* ciphertext x plaintext: [[a]]^k = [[k a]]. For k < 0 we use the short
  positive exponent |k| and invert:  [[a]]^k = ([[a]]^{|k|})^{-1}, never the
  2048-bit exponent n - |k|. Inversions are batched with Montgomery's trick
  (one modular inverse plus three multiplications per element).
* dot products  prod_i [[d_i]]^{k_i} = [[sum_i k_i d_i]]  by Pippenger's bucket
  method: for each w-bit window of the exponents, put each base in the bucket
  of its digit, then sum_j j B_j by running products. About
  (bits / w) (N + 2^(w+1)) multiplications instead of N (bits + bits / 2).
* decryption with the CRT: see ``keys.py``.
"""

from __future__ import annotations

import bisect

import gmpy2
from gmpy2 import mpz

ONE = mpz(1)


# --------------------------------------------------------------- encryption
def encrypt_raw(ms, obfuscators, n, nsquare) -> list:
    """Ciphertexts of the signed integers ``ms`` with one precomputed obfuscator r^n each."""
    if len(ms) != len(obfuscators):
        raise ValueError(f"need one obfuscator per value: {len(ms)} values, {len(obfuscators)} obfuscators")
    return [(s + n * (m * s % n)) % nsquare for m, s in zip(ms, obfuscators)]


def add_plain_raw(cs, ms, n, nsquare) -> list:
    """[[a_i]] * (1 + m_i n) = [[a_i + m_i]], elementwise."""
    return [(c + n * (m * c % n)) % nsquare if m else c for c, m in zip(cs, ms)]


def add_raw(cs, ds, nsquare) -> list:
    """[[a_i]] [[b_i]] = [[a_i + b_i]], elementwise."""
    return [c * d % nsquare for c, d in zip(cs, ds)]


def product_raw(cs, nsquare):
    """prod_i [[a_i]] = [[sum_i a_i]]; the empty product is the (trivial) encryption of 0."""
    it = iter(cs)
    acc = next(it, ONE)
    for c in it:
        acc = acc * c % nsquare
    return acc


# ---------------------------------------------------------------- inversion
def batch_invert(xs, modulus) -> list:
    """Inverses of all ``xs`` mod ``modulus`` with one ``gmpy2.invert`` (Montgomery's trick).

    prefix_i = x_0 ... x_i; inv = prefix_last^{-1}; walking back,
    x_i^{-1} = inv * prefix_{i-1} and inv <- inv * x_i.
    """
    count = len(xs)
    if count == 0:
        return []
    prefix = [None] * count
    acc = ONE
    for i, x in enumerate(xs):
        acc = acc * x % modulus
        prefix[i] = acc
    try:
        inv = gmpy2.invert(acc, modulus)
    except ZeroDivisionError:
        inv = ONE - ONE
    if not inv:
        raise ValueError("a ciphertext is not invertible mod n^2: it is corrupted or was not made "
                         "with this public key")
    out = [None] * count
    for i in range(count - 1, 0, -1):
        out[i] = inv * prefix[i - 1] % modulus
        inv = inv * xs[i] % modulus
    out[0] = inv
    return out


def negate_raw(cs, nsquare) -> list:
    """[[a]]^{-1} = [[-a]], elementwise."""
    return batch_invert(cs, nsquare)


# ------------------------------------------------------ ciphertext x plaintext
def mul_raw(cs, ks, nsquare) -> list:
    """[[a_i]]^{k_i} = [[k_i a_i]] with short exponents |k_i| and batched inversion for k_i < 0."""
    out = [None] * len(cs)
    negative = []
    powmod = gmpy2.powmod
    for i, (c, k) in enumerate(zip(cs, ks)):
        if k > 0:
            out[i] = c if k == 1 else powmod(c, k, nsquare)
        elif k < 0:
            out[i] = c if k == -1 else powmod(c, -k, nsquare)
            negative.append(i)
        else:
            out[i] = ONE
    if negative:
        for i, inv in zip(negative, batch_invert([out[i] for i in negative], nsquare)):
            out[i] = inv
    return out


def mul_common_raw(cs, k: int, nsquare) -> list:
    """Every [[a_i]] times the same integer k: one C loop (gmpy2.powmod_base_list), then the sign."""
    if k == 0:
        return [ONE] * len(cs)
    mag = abs(k)
    out = list(cs) if mag == 1 else gmpy2.powmod_base_list(list(cs), mag, nsquare)
    return batch_invert(out, nsquare) if k < 0 else out


# ------------------------------------------------------------- dot products
def _window_plan(mags, bits: int) -> int:
    """The window width w minimising the bucket method's multiplication count for these exponents.

    Per full window: one multiplication per base with a non-zero digit (about
    N) and 2 (2^w - 1) to combine the buckets; the top window is charged for
    the bases that reach it and its largest digit only; w squarings between
    windows.
    """
    count = len(mags)
    ordered = sorted(mags)
    top_value = ordered[-1]
    best_w, best_cost = bits, None
    for w in range(1, min(bits, 16) + 1):
        windows = -(-bits // w)
        top_shift = (windows - 1) * w
        top_count = count - bisect.bisect_left(ordered, 1 << top_shift) if windows > 1 else count
        cost = ((windows - 1) * (count + 2 * ((1 << w) - 1) + w) + top_count + 2 * (top_value >> top_shift))
        if best_cost is None or cost < best_cost:
            best_w, best_cost = w, cost
    return best_w


def multiexp_raw(bases, mags, nsquare):
    """prod_i bases_i^{mags_i} mod n^2 for non-negative exponents, by Pippenger's bucket method."""
    pairs = [(g, m) for g, m in zip(bases, mags) if m]
    if not pairs:
        return ONE
    mags = [m for _, m in pairs]
    bits = max(mags).bit_length()
    w = _window_plan(mags, bits)
    mask = (1 << w) - 1
    windows = -(-bits // w)
    acc = None
    for t in range(windows - 1, -1, -1):
        if acc is not None:
            for _ in range(w):
                acc = acc * acc % nsquare
        shift = t * w
        buckets = [None] * (mask + 1)
        top = 0
        for g, m in pairs:
            d = (m >> shift) & mask
            if d:
                cur = buckets[d]
                buckets[d] = g if cur is None else cur * g % nsquare
                if d > top:
                    top = d
        # sum_j j * B_j (written additively) = sum_j (B_j + B_{j+1} + ... + B_top): running products.
        running = total = None
        for d in range(top, 0, -1):
            b = buckets[d]
            if b is not None:
                running = b if running is None else running * b % nsquare
            if running is not None:
                total = running if total is None else total * running % nsquare
        if total is not None:
            acc = total if acc is None else acc * total % nsquare
    return ONE if acc is None else acc


def multiexp_columns(bases, columns, nsquare) -> list:
    """For each column k (a list of ints, one per base): prod_i bases_i^{k_i} = [[sum_i k_i a_i]].

    Negative k_i use the inverse base with exponent |k_i|; the inverses of the
    bases that need one are computed once, in a batch, for all columns.
    """
    count = len(bases)
    for col in columns:
        if len(col) != count:
            raise ValueError(f"each column needs {count} exponents, got {len(col)}")
    needs_inverse = [i for i in range(count) if any(col[i] < 0 for col in columns)]
    inverse = dict(zip(needs_inverse, batch_invert([bases[i] for i in needs_inverse], nsquare)))
    out = []
    for col in columns:
        sel = [inverse[i] if k < 0 else bases[i] for i, k in enumerate(col)]
        out.append(multiexp_raw(sel, [abs(k) for k in col], nsquare))
    return out


# --------------------------------------------------------------- decryption
def decrypt_raw(cs, p, q, psquare, qsquare, p_minus_1, q_minus_1, hp, hq, p_inverse) -> list:
    """Plaintext residues in [0, n) by the CRT; the two exponentiations run as C loops."""
    cs = list(cs)
    if not cs:
        return []
    xp = gmpy2.powmod_base_list(cs, p_minus_1, psquare)
    xq = gmpy2.powmod_base_list(cs, q_minus_1, qsquare)
    out = []
    for a, b in zip(xp, xq):
        mp = (a - 1) // p * hp % p
        mq = (b - 1) // q * hq % q
        out.append(mp + (mq - mp) * p_inverse % q * p)
    return out


def decrypt_with(cs, sk) -> list:
    """``decrypt_raw`` with the constants of a ``keys.PrivateMath``."""
    return decrypt_raw(cs, sk.p, sk.q, sk.psquare, sk.qsquare, sk.p_minus_1, sk.q_minus_1, sk.hp, sk.hq,
                       sk.p_inverse)


def lift_raw(cs, shift: int, nsquare) -> list:
    """[[a_i]]^{2^shift} = [[a_i 2^shift]]: moves a tensor to more fractional bits."""
    if shift == 0:
        return list(cs)
    return gmpy2.powmod_base_list(list(cs), mpz(1) << shift, nsquare)


__all__ = [
    "add_plain_raw", "add_raw", "batch_invert", "decrypt_raw", "decrypt_with", "encrypt_raw", "lift_raw",
    "mul_common_raw", "mul_raw", "multiexp_columns", "multiexp_raw", "negate_raw", "product_raw",
]
