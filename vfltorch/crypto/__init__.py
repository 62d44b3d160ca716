"""Paillier encryption on the CPU: fast, shaped like tensors, interoperable with python-paillier.

* keys - phe's key objects, 2048-bit default, small keys refused without the
  insecure/test flag (``keys.py``);
* fixed-point encoding of real tensors into Z_n with tracked scale and
  magnitude bound, overflow raised, never wrapped (``encoding.py``);
* ``EncryptedTensor`` - encrypt / decrypt, +, -, x plaintext, ``@`` with
  plaintext matrices ([[d]]^T X and X [[v]]), sum / mean (``tensor.py``) on
  gmpy2 kernels (``arith.py``);
* obfuscators r^n made ahead of need, DJN fixed-base by default, optionally
  by a background process (``obfuscators.py``);
* ``CryptoWorkers`` - the same operations over several processes (``parallel.py``);
* packing several values per ciphertext for add-and-scale protocols (``packing.py``);
* serialisation to uint8 tensors and ``send_encrypted`` / ``recv_encrypted``
  through ``vfltorch.comm`` (``transport.py``).

Typical use in a Hardy-style gradient round::

    pub, priv = generate_keypair()                          # key holder
    pool = ObfuscatorPool(pub).fill(len(d))                 # offline, ahead of the round
    enc_d = EncryptedTensor.encrypt(pub, d, pool=pool)      # [[d]]
    enc_g = enc_d @ X                                       # [[d^T X]]
    send_encrypted(fed, enc_g, dst=coordinator)             # re-randomised, metered
    g = recv_encrypted(fed, src, pub).decrypt(priv)         # at the key holder
"""

from .._lazy import lazy_exports

# submodule -> the names it exports (imported on first use: a key-size check needs neither torch nor gmpy2 kernels)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "encoding": "DEFAULT_FRAC_BITS DEFAULT_SCALAR_FRAC_BITS from_fixed to_fixed",
    "errors": "EncodingOverflowError KeyMismatchError KeyTooSmallError PackingOverflowError",
    "keys": "DEFAULT_KEY_BITS MIN_KEY_BITS PaillierPrivateKey PaillierPublicKey allow_insecure check_key "
            "generate_keypair key_fingerprint",
    "obfuscators": "ObfuscatorPool default_pool",
    "packing": "PackedEncryptedTensor PackingLayout",
    "parallel": "CryptoWorkers",
    "tensor": "MEAN_PRECISION_BITS EncryptedTensor decrypt encrypt",
    "transport": "deserialize recv_encrypted recv_public_key send_encrypted send_public_key serialize",
})
