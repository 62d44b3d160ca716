"""The one mask stream (``vfltorch.comm.MaskStream``): AES-128's counter-mode keystream, a cryptographic generator."""

import pickle

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from vfltorch.comm import MaskStream, RingGroup
from vfltorch.comm import masking
from vfltorch.comm.masking import PhaseGroup
from vfltorch.kernels.circle import Circle


def _ecb_counter_blocks(key: bytes, blocks: int) -> bytes:
    """AES_key(0), AES_key(1), ...: the keystream written from its definition (big-endian 128-bit counters)."""
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return ecb.update(b"".join(i.to_bytes(16, "big") for i in range(blocks))) + ecb.finalize()


def test_the_stream_is_the_aes_ctr_keystream_of_its_key():
    entropy = 0x0123456789ABCDEF_FEDCBA9876543210
    got = MaskStream.from_entropy(entropy).bytes(16 * 5)
    assert bytes(got) == _ecb_counter_blocks(entropy.to_bytes(16, "little"), 5)


def test_draws_continue_the_stream_across_calls_and_chunks(monkeypatch):
    whole = MaskStream.from_entropy(7).bytes(1000)
    s = MaskStream.from_entropy(7)
    parts = [s.bytes(n) for n in (1, 15, 16, 17, 451, 500)]
    assert np.array_equal(np.concatenate(parts), whole)
    monkeypatch.setattr(masking, "_CHUNK", 48)              # a draw made in several chunks: the same bytes
    assert np.array_equal(MaskStream.from_entropy(7).bytes(1000), whole)
    words = MaskStream.from_entropy(7).words(125)
    assert words.dtype == np.uint64 and np.array_equal(words.view(np.uint8), whole)


def test_keys_give_different_streams_and_the_simulation_stream_is_reproducible():
    assert not np.array_equal(MaskStream.from_entropy(1).words(4), MaskStream.from_entropy(2).words(4))
    assert not np.array_equal(MaskStream.private().words(4), MaskStream.private().words(4))
    assert np.array_equal(MaskStream(5, 1).words(8), MaskStream(5, 1).words(8))
    assert not np.array_equal(MaskStream(5, 1).words(8), MaskStream(5, 2).words(8))     # a stream per party
    assert not np.array_equal(MaskStream(5, 1).words(8), MaskStream(6, 1).words(8))


def test_groups_draw_uniform_elements():
    s = MaskStream.private()
    ring = s.draw(RingGroup(), (3, 4))
    assert ring.dtype == torch.int64 and ring.shape == (3, 4)
    angles = s.draw(Circle(16), (1 << 16,)).to(torch.int64) & 0xFFFF
    assert angles.dtype == torch.int64 and torch.unique(angles >> 8).numel() == 256
    assert abs(float(angles.to(torch.float64).mean()) / 2 ** 16 - 0.5) < 0.01
    phases = s.draw(PhaseGroup(), (1 << 14,))
    assert phases.dtype == torch.float64 and float(phases.min()) >= 0 and float(phases.max()) < 2 * np.pi
    assert abs(float(phases.mean()) / np.pi - 1) < 0.03
    # every bit of the 64-bit words is a fair coin
    bits = np.unpackbits(s.words(4096).view(np.uint8)).reshape(-1, 64).mean(0)
    assert np.all(np.abs(bits - 0.5) < 0.05)


def test_a_stream_is_never_pickled():
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(MaskStream.private())


def test_row_masks_are_the_keystream_at_each_rows_counter_in_any_order():
    """``RowMasks`` (the sealed FDSKL protocol's per-row masks): row i is AES_key(counter) for the row's own counter
    blocks, the same words however the rows are asked for (consecutive: one CTR stream; scattered: one ECB call of
    the counters), and an odd width keeps whole blocks per row."""
    from vfltorch.comm import RowMasks, derived_key

    key = derived_key(torch.tensor([3, 4]), b"test")
    assert key != derived_key(torch.tensor([3, 4]), b"other") and len(key) == 16
    for width in (6, 5):
        rows = RowMasks(key, width)
        blocks = -(-8 * width // 16)
        ref = np.frombuffer(_ecb_counter_blocks(key, 12 * blocks), dtype=np.uint8).reshape(12, 16 * blocks)
        ref = torch.from_numpy(ref[:, :8 * width].copy().view(np.int64))
        assert torch.equal(rows.rows(range(12)), ref)
        assert torch.equal(rows.rows([7, 2, 11, 3]), ref[[7, 2, 11, 3]])
        assert torch.equal(rows.rows(torch.tensor([4, 5, 6])), ref[4:7])
        assert torch.equal(rows.rows([9, 9]), ref[[9, 9]])
        assert rows.rows([]).shape == (0, width)
    many = RowMasks(key, 1536).rows(range(200)).view(torch.uint8).double()
    assert abs(float(many.mean()) - 127.5) < 0.5            # bytes uniform on 0..255: mean 127.5, its sd 0.05 here
    with pytest.raises(ValueError):
        RowMasks(key, 4).rows([-1])
    with pytest.raises(TypeError):
        pickle.dumps(RowMasks(key, 4))
