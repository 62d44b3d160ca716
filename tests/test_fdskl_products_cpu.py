"""The CPU round of issue 11 (s6): the 16-bit ring in int16, packing of many words, A's gradient operand layout.

Every change here must leave the words on the wire and the opened values as they were: these tests compare the
new paths with int64 references (mod 2**w), with the reference wire layout, and with the computation they replace.
"""

import numpy as np
import torch

from vfltorch.comm import launch
from vfltorch.comm.sharing import (_rowdot, _stream_from, _uniform, dealt_operand, dealt_share, fresh_seed,
                                   from_ring, pack_words, ring_words_from_bytes, unpack_words, word_bytes,
                                   words_from_bytes)

from conftest import reference_pack
H0, H1, DEALER = 0, 1, 2
EXTREMES = [0, 1, -1, 2 ** 15 - 1, -2 ** 15, 2 ** 14, 0x7FFF, -0x7FFF]




def test_sixteen_bit_masks_are_int16_words_from_two_bytes_of_the_stream_each():
    seed = fresh_seed()
    a = _uniform(_stream_from(seed), (300, 7), 16)
    assert a.dtype == torch.int16 and a.shape == (300, 7)
    # The same stream read as bytes: two per mask word (little-endian), nothing skipped.
    raw = _stream_from(seed).bytes(2 * 2100)
    assert np.array_equal(a.reshape(-1).numpy(), raw.view(np.int16))
    # Uniform mod 2**16: every high byte value occurs, and the mean is central.
    big = _uniform(_stream_from(fresh_seed()), (1 << 18,), 16).to(torch.int64) & 0xFFFF
    assert torch.unique(big >> 8).numel() == 256
    assert abs(float(big.to(torch.float64).mean()) / 2 ** 16 - 0.5) < 0.01
    assert _uniform(_stream_from(seed), (5,), 20).dtype == torch.int32      # other narrow rings: int32 words


def test_int16_products_wrap_exactly_mod_2_16():
    """The 16-bit ring computed in int16 (masks, e = x - a, row dots, the dealer's corrections) equals int64
    arithmetic mod 2**16, with words at the extremes and row dots that wrap many times."""
    g = torch.Generator().manual_seed(3)
    rows, k = 40, 512
    x = torch.randint(-2 ** 15, 2 ** 15, (rows, k), generator=g, dtype=torch.int32)
    y = torch.randint(-2 ** 15, 2 ** 15, (rows, k), generator=g, dtype=torch.int32)
    x[0, :len(EXTREMES)] = torch.tensor(EXTREMES, dtype=torch.int32)
    y[0, :len(EXTREMES)] = torch.tensor(EXTREMES[::-1], dtype=torch.int32)
    x[1], y[1] = -2 ** 15, -2 ** 15                                     # 512 * 2**30: wraps on every term
    a = _uniform(_stream_from(fresh_seed()), (rows, k), 16)
    c1 = _uniform(_stream_from(fresh_seed()), (rows,), 16)
    mod = lambda v: v.to(torch.int64) & 0xFFFF                           # noqa: E731
    e = dealt_operand(x.to(torch.int16), (a, None), 16)
    assert e.dtype == torch.int16
    assert torch.equal(mod(e), mod(x.to(torch.int64) - a.to(torch.int64)))
    z = dealt_share("rowdot", e, y, c1, 16)
    assert z.dtype == torch.int16
    ref = ((x.to(torch.int64) - a.to(torch.int64)) * y.to(torch.int64)).sum(-1) + c1.to(torch.int64)
    assert torch.equal(mod(z), mod(ref))
    # the dealer's correction and the opening: c0 + z = x . y mod 2**16, read signed
    c0 = from_ring(_rowdot(a, y.to(torch.int16)) - c1, 16)
    opened = from_ring(c0 + z.to(torch.int64), 16)
    assert torch.equal(opened, from_ring((x.to(torch.int64) * y.to(torch.int64)).sum(-1), 16))


def test_packing_beyond_the_numpy_threshold_keeps_the_wire_layout():
    """Pack / unpack (numpy at every size since issue 11's op-count round; 4,096 words was the numpy / torch
    threshold before): the same bytes around it and well beyond; int16 words of the 16-bit ring are their own wire
    bytes (no pass)."""
    small = 4096
    g = torch.Generator().manual_seed(2)
    for bits in (16, 20, 24):
        for n in (small - 1, small, small + 1, 3 * small + 7):
            x = torch.randint(-2 ** 62, 2 ** 62, (n,), generator=g, dtype=torch.int64)
            x[:4] = torch.tensor([-1, 0xFFFFF, -2 ** 31, 0x80000])
            for src in (x, x.to(torch.int32), x.to(torch.int16)):
                wire = pack_words(src, bits)
                assert wire.dtype == torch.uint8 and torch.equal(wire, reference_pack(src, bits)), (bits, n)
                back = unpack_words(wire, (n,), bits)
                assert back.dtype == torch.int32
                assert torch.equal(back.long(), src.long() & ((1 << bits) - 1))
                msg = torch.cat([torch.tensor([7], dtype=torch.uint8), word_bytes(src, bits)])  # odd offset
                assert torch.equal(words_from_bytes(msg[1:], (n,), bits), back)
                ring = ring_words_from_bytes(msg[1:], (n,), bits)
                assert torch.equal(ring.long() & ((1 << bits) - 1), back.long())
                if bits == 16:
                    assert ring.dtype == torch.int16


def test_gradient_operand_is_the_strided_product_it_replaced():
    """A's gradient operand through the 8-byte-word transpose equals the strided multiplication into (D, m, 2)
    that it replaced (the same float32 products), for one row, several rows and a subset of columns."""
    from vfltorch.kernels.shared import SQRT2, StarProducts, all_columns

    g = torch.Generator().manual_seed(4)
    for m, D, subset in ((1, 12, False), (7, 12, False), (7, 12, True), (5, 1, False)):
        p = StarProducts.__new__(StarProducts)
        p.m, p.D, p.pairs = m, D, None
        p.S = torch.randint(-2 ** 15, 2 ** 15, (m, D), generator=g, dtype=torch.int16)
        p.grad_cols = torch.tensor([0, 3, 4, 11]) if subset else all_columns(D)
        w = torch.randn(m, generator=g, dtype=torch.float64)
        before = p._cos_sin_S().clone()
        x = p._gradient_x(w)
        assert torch.equal(p._cos_sin_S(), before)                      # the cached [cos S, sin S] untouched
        cs = before.view(m, D, 2)[:, p.grad_cols]
        ref = torch.empty(cs.shape[1], m, 2)
        torch.mul(cs.transpose(0, 1), (SQRT2 * w.to(torch.float32)).view(1, m, 1), out=ref)
        assert torch.equal(x, ref.view(cs.shape[1], 2 * m))


def ring16_job(fed):
    """Z_2^16 products through both paths of the training iteration: mul_dealt (h1 receives int16 words) and
    the split form (e inside a message at an odd byte offset)."""
    from vfltorch.comm.sharing import deal_dealt, mul_dealt, open_shares, split_bytes, wire_bytes

    holders = (H0, H1)
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-100, 101, (5, 64), generator=g, dtype=torch.int32)
    x[0] = 127
    y = torch.randint(-4, 5, (5, 64), generator=g, dtype=torch.int32)
    y[0] = 4                                                            # row 0: 64 * 127 * 4 = 32512 < 2**15
    known = fed.rank in (H1, DEALER)
    dealt = deal_dealt(fed, [y, y] if known else None, holders=holders, dealer=DEALER, kind="rowdot",
                       shapes_x=[(5, 64)] * 2, shapes_y=[(5, 64)] * 2, bits=(16, 16))
    z = mul_dealt(fed, x.to(torch.int16) if fed.rank == H0 else None, y if known else None, holders=holders,
                  dealer=DEALER, kind="rowdot", shape_x=(5, 64), dealt=dealt[0] if fed.rank in holders else True,
                  bits=16)
    out = open_shares(fed, z, holders=holders, to=H0, shape=(5,), bits=16) if fed.rank in holders else None
    split = None
    lengths = [1, wire_bytes(320, 16)]
    if fed.rank == H0:
        e = dealt_operand(x.to(torch.int16), dealt[1], 16)
        fed.send(torch.cat([torch.tensor([1], dtype=torch.uint8), word_bytes(e, 16)]), H1)
        share = fed.recv(H1, (wire_bytes(5, 16),), torch.uint8, device="cpu")
        split = from_ring(dealt[1][1].long() + words_from_bytes(share, (5,), 16).long(), 16)
    elif fed.rank == H1:
        _, e = split_bytes(fed.recv(H0, (sum(lengths),), torch.uint8, device="cpu"), lengths)
        fed.send(word_bytes(dealt_share("rowdot", ring_words_from_bytes(e, (5, 64), 16), y, dealt[1], 16), 16), H0)
    return out, split, x, y


def test_sixteen_bit_products_open_exactly_over_gloo():
    res = launch(ring16_job, 3, (), timeout=60)
    out, split, x, y = res[H0]
    expect = (x.long() * y.long()).sum(-1)
    assert torch.equal(out, expect) and torch.equal(split, expect)
