"""Errors of the crypto module, each naming what to change.

They subclass the built-in exception a caller would already catch
(``ValueError`` for bad keys, ``OverflowError`` for range problems), so code
written against phe's exceptions keeps working.
"""

from __future__ import annotations


class KeyTooSmallError(ValueError):
    """A Paillier key under the secure minimum was used without the insecure/test flag."""


class KeyMismatchError(ValueError):
    """Ciphertexts, keys or layouts that belong to different Paillier keys were combined."""


class EncodingOverflowError(OverflowError):
    """A fixed-point value, or a value an operation could produce, leaves the safe plaintext range.

    Raised *before* the operation runs when the tracked magnitude bound says the
    result might not fit, and at decryption when a plaintext lands in the
    overflow band (it wrapped around the ring). Never silent.
    """


class PackingOverflowError(OverflowError):
    """A packed slot could overflow into its neighbour: the layout has too little headroom."""
