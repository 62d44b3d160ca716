"""Encrypted tensors on the wire: fixed-width big-endian bytes in a uint8 tensor.

An encrypted tensor travels as two ordinary tensors through ``vfltorch.comm``
(so the communication meter and the transcript see them like any message):

1. a header: UTF-8 JSON in a uint8 tensor (JSON, never pickle: unpickling a
   peer's bytes would let it run code), for example::

       {"format": "vfltorch.paillier/1", "kind": "tensor", "key": "<16 hex>",
        "width": 512, "count": 1000, "shape": [1000], "frac_bits": 40,
        "bound_bits": 41, "obfuscated": true}

   packed tensors (``kind: "packed"``) add ``slot_bits``, ``slots``,
   ``layout_frac_bits``, ``max_abs`` and ``base`` (a decimal string);
2. the payload: a ``(count, width)`` uint8 tensor, row i the ciphertext i as
   an unsigned big-endian integer of ``width = ceil(|n^2| / 8)`` bytes (512
   bytes for a 2048-bit key): the compact size of an element of Z_{n^2}.

The header carries the key's fingerprint (refused if the receiver's key
differs) and the tensor's magnitude bound as a bit count, rounded up to a
power of two. That bound is what lets the receiver keep computing without
risking silent overflow; it reveals the order of magnitude of the largest
encoded value. To reveal nothing data-dependent, encrypt with a public
``max_abs`` (the bound then derives from it), or pass ``bound_bits`` computed
from public quantities.

Ciphertexts that are results of operations are re-randomised before they
leave (``rerandomize=True``): otherwise a peer holding the inputs could test
guesses of the plaintext operands.
"""

from __future__ import annotations

import json

import torch
from gmpy2 import mpz
from phe.paillier import PaillierPublicKey

from .encoding import check_bound
from .errors import KeyMismatchError
from .keys import allow_insecure, check_key, public_math
from .packing import PackedEncryptedTensor, PackingLayout
from .tensor import EncryptedTensor

FORMAT = "vfltorch.paillier/1"


def _to_bytes(cs, width: int) -> torch.Tensor:
    blob = bytearray(b"".join(c.to_bytes(width, "big") for c in cs))
    if not blob:
        return torch.empty((0, width), dtype=torch.uint8)
    return torch.frombuffer(blob, dtype=torch.uint8).reshape(len(cs), width)


def _from_bytes(payload: torch.Tensor, width: int, count: int, nsquare) -> list:
    if payload.dtype != torch.uint8 or tuple(payload.shape) != (count, width):
        raise ValueError(f"payload must be a uint8 tensor of shape ({count}, {width}), got "
                         f"{payload.dtype} {tuple(payload.shape)}")
    blob = payload.contiguous().cpu().numpy().tobytes()
    cs = [mpz.from_bytes(blob[i * width:(i + 1) * width], "big") for i in range(count)]
    for c in cs:
        if not 0 < c < nsquare:
            raise ValueError("the payload holds a number outside Z_{n^2}: it is not a ciphertext of this key")
    return cs


def _header_tensor(header: dict) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(header, sort_keys=True).encode()), dtype=torch.uint8)


def serialize(tensor, *, bound_bits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(header, payload)`` uint8 tensors for an ``EncryptedTensor`` or ``PackedEncryptedTensor``.

    ``bound_bits`` (encrypted tensors only) overrides the transmitted bound
    with a public value; it must cover the tracked bound.
    """
    if isinstance(tensor, EncryptedTensor):
        pm = tensor._pm
        tracked = tensor.bound.bit_length()
        if bound_bits is None:
            bound_bits = tracked
        elif bound_bits < tracked:
            raise ValueError(f"bound_bits={bound_bits} is below the tensor's tracked bound (2^{tracked}); "
                             f"declaring less would let the receiver overflow silently")
        header = {"kind": "tensor", "frac_bits": tensor.frac_bits, "bound_bits": int(bound_bits)}
    elif isinstance(tensor, PackedEncryptedTensor):
        if bound_bits is not None:
            raise ValueError("packed tensors carry their exact public offset; bound_bits does not apply")
        pm = tensor._pm
        lay = tensor.layout
        header = {"kind": "packed", "frac_bits": tensor.frac_bits, "base": str(tensor.base),
                  "slot_bits": lay.slot_bits, "slots": lay.slots, "layout_frac_bits": lay.frac_bits,
                  "max_abs": lay.max_abs, "key_bits": lay.key_bits}
    else:
        raise TypeError(f"cannot serialise {type(tensor).__name__}: expected an EncryptedTensor or "
                        f"PackedEncryptedTensor")
    cs = tensor._cs
    header.update(format=FORMAT, key=pm.fingerprint, width=pm.width, count=len(cs), shape=list(tensor.shape),
                  obfuscated=tensor.obfuscated)
    return _header_tensor(header), _to_bytes(cs, pm.width)


def deserialize(header: torch.Tensor, payload: torch.Tensor, public_key: PaillierPublicKey):
    """Rebuild the tensor from ``serialize``'s output, checking it belongs to ``public_key``."""
    pm = public_math(public_key)
    try:
        meta = json.loads(bytes(header.contiguous().cpu().numpy()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError("the header is not a vfltorch Paillier header") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"unknown encrypted-tensor format {meta.get('format') if isinstance(meta, dict) else meta!r};"
                         f" expected {FORMAT}")
    if meta["key"] != pm.fingerprint:
        raise KeyMismatchError(f"the ciphertexts belong to key {meta['key']}, not to this key {pm.fingerprint}")
    if meta["width"] != pm.width:
        raise ValueError(f"ciphertext width {meta['width']} does not match this key ({pm.width} bytes)")
    cs = _from_bytes(payload, pm.width, int(meta["count"]), pm.nsquare)
    shape = tuple(int(s) for s in meta["shape"])
    obfuscated = bool(meta.get("obfuscated", False))
    if meta["kind"] == "tensor":
        bound = check_bound((1 << int(meta["bound_bits"])) - 1, pm, "the received tensor's bound")
        return EncryptedTensor(public_key, cs, shape, int(meta["frac_bits"]), bound, obfuscated=obfuscated, _pm=pm)
    if meta["kind"] == "packed":
        layout = PackingLayout(int(meta["slot_bits"]), int(meta["slots"]), int(meta["layout_frac_bits"]),
                               float(meta["max_abs"]), int(meta["key_bits"]))
        return PackedEncryptedTensor(public_key, cs, shape, layout, int(meta["frac_bits"]), int(meta["base"]),
                                     obfuscated=obfuscated, _pm=pm)
    raise ValueError(f"unknown encrypted-tensor kind {meta['kind']!r}")


def send_encrypted(fed, tensor, dst: int, *, rerandomize: bool = True, pool=None,
                   bound_bits: int | None = None) -> int:
    """Send an encrypted (or packed) tensor to party ``dst``; returns the bytes sent (header + payload).

    Results of operations are re-randomised first unless ``rerandomize=False``.
    """
    if rerandomize and not tensor.obfuscated:
        tensor = tensor.rerandomize(pool)
    header, payload = serialize(tensor, bound_bits=bound_bits)
    fed.send_tensor(header, dst)
    fed.send_tensor(payload, dst)
    return header.numel() + payload.numel()


def recv_encrypted(fed, src: int, public_key: PaillierPublicKey):
    """Receive what ``send_encrypted`` sent from party ``src``; ``public_key`` is the key it was made under."""
    header = fed.recv_tensor(src, device="cpu")
    payload = fed.recv_tensor(src, device="cpu")
    return deserialize(header, payload, public_key)


def send_public_key(fed, public_key: PaillierPublicKey, dst: int) -> None:
    """Send a public key (its modulus n, big-endian bytes) to party ``dst``."""
    n = int(public_key.n)
    fed.send_tensor(torch.frombuffer(bytearray(n.to_bytes((n.bit_length() + 7) // 8, "big")), dtype=torch.uint8),
                    dst)


def recv_public_key(fed, src: int, *, insecure: bool = False) -> PaillierPublicKey:
    """Receive a public key from party ``src``; small keys are refused unless ``insecure`` (tests)."""
    n = int.from_bytes(bytes(fed.recv_tensor(src, device="cpu").numpy()), "big")
    key = PaillierPublicKey(n)
    if insecure:
        allow_insecure(key)
    return check_key(key)


__all__ = ["FORMAT", "deserialize", "recv_encrypted", "recv_public_key", "send_encrypted", "send_public_key",
           "serialize"]
