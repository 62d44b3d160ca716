"""The CPU rounds of issue 11: the 16-bit ring in int16, packing of many words, A's operands (layout and scales).

These tests compare the narrow-ring paths with int64 references (mod 2**w) and the reference wire layout; A's
operands (laid out like S, scaled from the 1-norm of its factors: s8) with their definition and the no-wrap bound.
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


def _products(m, D, g, cols=None, bits=(20, 16)):
    from vfltorch.kernels.shared import StarProducts, all_columns, y_frac_bits

    p = StarProducts.__new__(StarProducts)
    p.m, p.D, p.pairs, p.classes = m, D, None, None
    p.S = torch.randint(-2 ** 15, 2 ** 15, (m, D), generator=g, dtype=torch.int16)
    p.grad_cols = all_columns(D) if cols is None else torch.as_tensor(cols)
    p.bits = list(bits)
    p.fbits = [y_frac_bits(2 * D, bits[0]), y_frac_bits(2 * m, bits[1])]
    return p


def test_gradient_operand_is_laid_out_like_S_and_scaled_once():
    """A's gradient operand (since issue 11's s8 round): rows x [cos S, sin S] pairs of the columns grad_cols, each
    row times s sqrt2 w_i in float32 (no transposed copy), and one scale s for every column sum."""
    from vfltorch.kernels.shared import SQRT2

    g = torch.Generator().manual_seed(4)
    for m, D, cols in ((1, 12, None), (7, 12, None), (7, 12, [0, 3, 4, 11]), (5, 1, None)):
        p = _products(m, D, g, cols)
        w = torch.randn(m, generator=g, dtype=torch.float64)
        before = p._cos_sin_S().clone()
        x, s = p._gradient_x(w)
        assert torch.equal(p._cos_sin_S(), before)                      # the cached [cos S, sin S] untouched
        G = len(p.grad_cols)
        assert x.shape == (m, 2 * G) and s.shape == (G,) and bool((s == s[0]).all())
        ws = ((SQRT2 * w.to(torch.float32)).numpy().astype(np.float64) * float(s[0])).astype(np.float32)
        ref = before.view(m, D, 2)[:, p.grad_cols] * torch.from_numpy(ws).view(m, 1, 1)
        assert torch.equal(x, ref.reshape(m, 2 * G))


def test_scales_from_the_coefficient_bound_keep_both_products_inside_their_rings():
    """The no-wrap bound of A's operands scaled from sqrt2 times the 1-norm of its factors (``_scales``): with
    x_enc = round(x) and the worst keeper operand (|y| = 2**F, signs matching x_enc), every opened f (a row of
    2D products in Z_2^20) and every gradient sum (a column of 2m in Z_2^16) stays below 2**(w - 1), for typical,
    heavy-tailed, spiked and zero factors and angles at the extremes of |cos| + |sin|; the scales still use at
    least a third of the ring."""
    g = torch.Generator().manual_seed(8)
    for m, D in ((175, 1536), (32, 1024), (256, 64), (3, 5)):
        p = _products(m, D, g)
        for trial in range(5):
            if trial == 1:
                p.S.fill_(2 ** 13)                                      # every angle at pi / 4: |cos| + |sin| = sqrt2
                p.pairs = None
            v = torch.randn(D, generator=g, dtype=torch.float64)
            w = torch.randn(m, generator=g, dtype=torch.float64)
            if trial == 2:
                v, w = v ** 5, w ** 5                                   # heavy-tailed
            if trial == 3:
                v, w = torch.full((D,), 1e-6, dtype=torch.float64), torch.full((m,), 1e-9, dtype=torch.float64)
                v[0], w[0] = 3.0, 1e3                                   # one large factor, the rest tiny
            for k, (x, s) in enumerate((p._forward_x(v), p._gradient_x(w))):
                F, bits = p.fbits[k], p.bits[k]
                xe = p._encode(k, x.clone()).to(torch.int64).abs() * 2 ** F
                worst = xe.sum(-1) if k == 0 else xe.view(m, -1, 2).sum((0, 2))
                assert int(worst.max()) < 2 ** (bits - 1), (m, D, trial, k)
                assert int(worst.max()) > 2 ** (bits - 1) / 3, (m, D, trial, k)
        zero_x, zero_s = p._forward_x(torch.zeros(D, dtype=torch.float64))
        assert float(zero_s) == 1.0 and not bool(zero_x.any())


def test_column_dots_of_pairs_open_exactly_in_narrow_rings():
    """The gradient's product kind "coldot" (z_j = sum_i x_i,2j y_i,2j + x_i,2j+1 y_i,2j+1): e = x - a, the
    keeper's share and the dealer's correction open to the exact column sums mod 2**w (int16 words for 16 bits,
    int32 for 20), with terms that wrap on every product."""
    from vfltorch.comm.sharing import _coldot

    g = torch.Generator().manual_seed(12)
    rows, G = 33, 70
    for bits, dtype in ((16, torch.int16), (20, torch.int32)):
        x = torch.randint(-2 ** 15, 2 ** 15, (rows, 2 * G), generator=g, dtype=torch.int32)
        y = torch.randint(-2 ** 15, 2 ** 15, (rows, 2 * G), generator=g, dtype=torch.int32)
        x[0], y[0] = -2 ** 15, -2 ** 15
        a = _uniform(_stream_from(fresh_seed()), (rows, 2 * G), bits)
        c1 = _uniform(_stream_from(fresh_seed()), (G,), bits)
        mask = (1 << bits) - 1
        e = dealt_operand(x.to(dtype), (a, None), bits)
        z = dealt_share("coldot", e, y.to(dtype), c1, bits)
        assert z.dtype == dtype and z.shape == (G,)
        c0 = _coldot(a, y.to(dtype)) - c1
        exact = (x.to(torch.int64) * y.to(torch.int64)).view(rows, G, 2).sum((0, 2))
        assert torch.equal((c0.to(torch.int64) + z.to(torch.int64)) & mask, exact & mask)


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


def test_narrow_tables_are_the_rounded_cosines_in_the_narrowest_type():
    """The keeper's and dealer's [cos, sin] tables below FRAC_BITS: round(table / 2**(16 - F)) (ties up), int8 up
    to 6 bits (a 128 KB table), int16 up to 14, int32 above; a gather of them equals a gather of the int64 rows."""
    from vfltorch.kernels.shared import cos_sin, cosine_table, narrow_table, pair_table

    table = pair_table(cosine_table().to(torch.int64))
    beta = torch.randint(-2 ** 15, 2 ** 15, (9, 33), generator=torch.Generator().manual_seed(2), dtype=torch.int16)
    for bits, dtype in ((2, torch.int8), (4, torch.int8), (6, torch.int8), (7, torch.int16), (14, torch.int16),
                        (15, torch.int32), (16, torch.int32)):
        nt = narrow_table(table, bits)
        shift = 16 - bits
        ref = table if shift == 0 else (table + (1 << (shift - 1))) >> shift
        assert nt.dtype == dtype and torch.equal(nt.to(torch.int64), ref), bits
        assert int(ref.abs().max()) <= 2 ** bits
        got = cos_sin(nt, beta)
        assert got.dtype == dtype and torch.equal(got.to(torch.int64), cos_sin(ref, beta)), bits


def test_two_width_table_reads_both_roundings_exactly():
    """One gather for a round whose products want neighbouring widths (f at F, a gradient over B = 256 rows at
    F - 1, or over 32 rows at F + 1): ``two_widths`` of the ``two_width_table`` entries are exactly the gathers of
    the two ``narrow_table`` s, at every angle; more than 5 bits would not fit int8 and is refused."""
    import pytest

    from vfltorch.kernels.shared import cos_sin, cosine_table, narrow_table, pair_table, two_width_table, two_widths

    table = pair_table(cosine_table().to(torch.int64))
    every = torch.arange(2 ** 16, dtype=torch.int32).to(torch.int16).view(256, 256)
    for bits in (2, 3, 4, 5):
        v = two_width_table(table, bits)
        assert v.dtype == torch.int8
        hi, lo = two_widths(cos_sin(v, every))
        assert torch.equal(hi, cos_sin(narrow_table(table, bits), every)), bits
        assert torch.equal(lo, cos_sin(narrow_table(table, bits - 1), every)), bits
    with pytest.raises(ValueError, match="int8"):
        two_width_table(table, 6)


def test_masked_operands_are_the_rounded_operands_minus_the_dealt_masks():
    """A's e of each product (``_masked_operand``): f's through addcmul's bias 1.5 * 2**23 (round(x) in the low bits
    of the float; 0x4B400000 = 0 mod 2**20) equals round(x) - a mod 2**20, but for ties of the float32 product,
    where addcmul may round the exact product (one rounding, one unit apart); the gradient's (Z_2^16, int16) is
    round(x) - a exactly. The masks themselves are untouched."""
    g = torch.Generator().manual_seed(21)
    for m, D in ((175, 1024), (3, 5)):
        p = _products(m, D, g)
        a_f = _uniform(_stream_from(fresh_seed()), (m, 2 * D), 20)
        a_g = _uniform(_stream_from(fresh_seed()), (m, 2 * D), 16)
        p.dealt = [(a_f.clone(), None), (a_g.clone(), None)]
        v = torch.randn(D, generator=g, dtype=torch.float64)
        w = torch.randn(m, generator=g, dtype=torch.float64)
        e_f, s_f = p._masked_operand(0, v)
        x, s = p._forward_x(v)
        assert torch.equal(s_f, s) and e_f.dtype == torch.int32
        diff = ((e_f.to(torch.int64) - (x.round().to(torch.int64) - a_f.to(torch.int64))) + 2 ** 19) % 2 ** 20 - 2 ** 19
        near_tie = ((x - x.floor()) - 0.5).abs() < 2.0 ** -8
        assert int(diff.abs().max()) <= 1 and not bool((diff != 0)[~near_tie].any())
        e_g, s_g = p._masked_operand(1, w)
        x, s = p._gradient_x(w)
        assert torch.equal(s_g, s) and e_g.dtype == torch.int16
        assert torch.equal(e_g, x.round().to(torch.int16) - a_g)
        assert torch.equal(p.dealt[0][0], a_f) and torch.equal(p.dealt[1][0], a_g)


def test_narrow_known_operands_widen_inside_the_products():
    """The keeper's and dealer's cosines stay int8 (``_as_ring_operand``): a row or column dot over a discarded
    first operand (``_over_first``: the dealer's fresh a, the keeper's received e) widens them inside numpy's
    multiplication and gives the products of the operand cast to the ring's type, mod 2**w, wrapping terms
    included; the first operand is overwritten, the narrow one is not."""
    from vfltorch.comm.sharing import _as_ring_operand, _coldot, _over_first

    g = torch.Generator().manual_seed(30)
    rows, k = 17, 64
    for bits, dtype in ((20, torch.int32), (16, torch.int16)):
        y8 = torch.randint(-16, 17, (rows, k), generator=g, dtype=torch.int8)
        y8[0] = -16
        assert _as_ring_operand(y8, bits) is y8
        e = _uniform(_stream_from(fresh_seed()), (rows, k), bits)
        e[0] = torch.iinfo(dtype).min                                   # wraps on every term
        c1 = _uniform(_stream_from(fresh_seed()), (rows,), bits)
        mask = (1 << bits) - 1
        ref = dealt_share("rowdot", e.clone(), y8.to(dtype), c1, bits)
        got = dealt_share("rowdot", e.clone(), y8, c1, bits, into_e=True)
        assert got.dtype == dtype and torch.equal(got.to(torch.int64) & mask, ref.to(torch.int64) & mask)
        before = y8.clone()
        a = e.clone()
        cols = _over_first("coldot", a, y8)
        assert torch.equal(cols.to(torch.int64) & mask, _coldot(e, y8.to(dtype)).to(torch.int64) & mask)
        assert torch.equal(y8, before) and not torch.equal(a, e)
