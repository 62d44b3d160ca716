"""Serialisation to fixed-width bytes and a real two-process exchange through vfltorch.comm."""

import json

import pytest
import torch

from vfltorch.comm import launch
from vfltorch.crypto import (EncryptedTensor, KeyMismatchError, PackedEncryptedTensor, PackingLayout,
                             deserialize, generate_keypair, recv_encrypted, recv_public_key, send_encrypted,
                             send_public_key, serialize)


@pytest.fixture(scope="module")
def keys():
    return generate_keypair(512, insecure=True)


def test_round_trip_and_layout(keys):
    pub, priv = keys
    e = EncryptedTensor.encrypt(pub, torch.tensor([[1.5, -2.0], [0.0, 1e-3]]), 24, max_abs=4.0)
    header, payload = serialize(e)
    assert header.dtype == payload.dtype == torch.uint8
    assert payload.shape == (4, 128)                    # 4 ciphertexts of |n^2| = 1024 bits
    row0 = int.from_bytes(bytes(payload[0].numpy()), "big")
    assert row0 == int(e.ciphertexts[0])                # fixed-width big-endian
    meta = json.loads(bytes(header.numpy()).decode())
    assert meta["shape"] == [2, 2] and meta["frac_bits"] == 24 and meta["bound_bits"] == 27
    back = deserialize(header, payload, pub)
    assert back.ciphertexts == e.ciphertexts and back.shape == e.shape and back.bound >= e.bound
    assert torch.equal(back.decrypt(priv), e.decrypt(priv))


def test_bound_bits_can_only_be_raised(keys):
    pub, _ = keys
    e = EncryptedTensor.encrypt(pub, torch.tensor([3.0]), 8)
    header, _ = serialize(e, bound_bits=100)
    assert json.loads(bytes(header.numpy()).decode())["bound_bits"] == 100
    with pytest.raises(ValueError, match="bound_bits"):
        serialize(e, bound_bits=2)


def test_foreign_or_corrupt_payloads_are_refused(keys):
    pub, _ = keys
    other, _ = generate_keypair(512, insecure=True)
    header, payload = serialize(EncryptedTensor.encrypt(pub, torch.ones(2)))
    with pytest.raises(KeyMismatchError):
        deserialize(header, payload, other)
    bad = payload.clone()
    bad[0] = 255                                        # >= n^2
    with pytest.raises(ValueError, match="not a ciphertext"):
        deserialize(header, bad, pub)
    with pytest.raises(ValueError, match="shape"):
        deserialize(header, payload[:1], pub)
    with pytest.raises(ValueError, match="header"):
        deserialize(torch.tensor([1, 2, 3], dtype=torch.uint8), payload, pub)


def _two_party_exchange(fed, priv, x):
    """Party 0 owns the key; party 1 only ever sees the public key and ciphertexts."""
    if fed.rank == 0:
        pub = priv.public_key
        send_public_key(fed, pub, 1)
        enc = EncryptedTensor.encrypt(pub, x, 32)
        with fed.phase("residuals"):
            raw = send_encrypted(fed, enc, 1)
        packed = PackedEncryptedTensor.encrypt(pub, x, PackingLayout.plan(pub, max_abs=10.0, frac_bits=16,
                                                                           max_terms=2))
        with fed.phase("packed"):
            send_encrypted(fed, packed, 1)
        with fed.phase("gradient"):
            grad = recv_encrypted(fed, 1, pub)
            summed = recv_encrypted(fed, 1, pub)
        return {"raw": raw, "meter": fed.meter.as_dict(), "grad": grad.decrypt(priv).tolist(),
                "grad_shape": list(grad.shape), "summed": summed.decrypt(priv).tolist(),
                "obfuscated": grad.obfuscated}
    pub = recv_public_key(fed, 0, insecure=True)
    with fed.phase("residuals"):
        enc = recv_encrypted(fed, 0, pub)
    with fed.phase("packed"):
        packed = recv_encrypted(fed, 0, pub)
    X = torch.arange(12, dtype=torch.float64).reshape(4, 3) / 4
    with fed.phase("gradient"):
        grad = enc @ X                                  # not obfuscated: send_encrypted re-randomises it
        send_encrypted(fed, grad, 0)
        send_encrypted(fed, packed + packed, 0)
    return {"meter": fed.meter.as_dict(), "shape": list(enc.shape), "grad_was_obfuscated": grad.obfuscated}


def test_send_and_receive_between_two_processes(keys):
    pub, priv = keys
    x = torch.tensor([0.5, -1.0, 2.25, -3.5], dtype=torch.float64)
    owner, helper = launch(_two_party_exchange, parties=2, args=(priv, x), timeout=60)
    X = torch.arange(12, dtype=torch.float64).reshape(4, 3) / 4
    assert owner["grad_shape"] == [3]
    assert owner["grad"] == pytest.approx((x @ X).tolist(), abs=1e-9)
    assert owner["summed"] == (2 * x).tolist()
    assert owner["obfuscated"] and not helper["grad_was_obfuscated"]
    assert helper["shape"] == [4]
    # the meter counts the ciphertext bytes (4 x 128) plus the headers, on both sides
    sent = owner["meter"]["residuals"]["bytes_sent"]
    assert sent >= 4 * 128 and sent >= owner["raw"]
    assert helper["meter"]["residuals"]["bytes_received"] == sent
    assert helper["meter"]["gradient"]["bytes_sent"] == owner["meter"]["gradient"]["bytes_received"] >= 4 * 128
