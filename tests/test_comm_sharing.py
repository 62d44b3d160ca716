"""Secret-shared arithmetic (vfltorch.comm.sharing) over real gloo processes: two holders and a dealer."""

import numpy as np
import pytest
import torch

from vfltorch.comm import FixedPoint, MaskStream, RingGroup, launch
from vfltorch.comm.sharing import deal, mul_private, mul_shared, open_shares, open_value, share, truncate
from conftest import reference_pack

FP = FixedPoint(frac_bits=20)
H0, H1, DEALER = 0, 1, 2


def data(seed, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def arithmetic_job(fed):
    holders = (H0, H1)
    out = {}
    x, y = data(1, (30, 4)), data(2, (4, 5))
    u, v = data(3, (30, 4)), data(4, (30, 4))
    # x held by h0, y by h1: private matmul and elementwise product.
    z = mul_private(fed, x if fed.rank == H0 else None, y if fed.rank == H1 else None, holders=holders,
                    dealer=DEALER, kind="matmul", shape_x=x.shape, shape_y=y.shape, fp=FP)
    out["xy"] = open_value(fed, z, holders=holders, fp=FP, to=[H0, H1, DEALER], shape=(30, 5))
    z = mul_private(fed, u if fed.rank == H0 else None, v if fed.rank == H1 else None, holders=holders,
                    dealer=DEALER, kind="mul", shape_x=u.shape, shape_y=v.shape, fp=FP)
    out["uv"] = open_value(fed, z, holders=holders, fp=FP)
    # Both operands shared: u shared by its owner h0, v by the dealer (not a holder).
    su = share(fed, u if fed.rank == H0 else None, owner=H0, holders=holders, shape=u.shape, fp=FP)
    sv = share(fed, v if fed.rank == DEALER else None, owner=DEALER, holders=holders, shape=v.shape, fp=FP)
    out["u_share"] = su
    w = mul_shared(fed, su, sv, holders=holders, dealer=DEALER, kind="mul", shape_x=u.shape, shape_y=v.shape,
                   frac_bits=FP.frac_bits)
    out["uv_shared"] = open_value(fed, w, holders=holders, fp=FP)
    w = mul_shared(fed, su, None if su is None else sv.reshape(30, 4)[:, :4].T.contiguous(), holders=holders,
                   dealer=DEALER, kind="matmul", shape_x=(30, 4), shape_y=(4, 30), frac_bits=FP.frac_bits)
    out["uvT_shared"] = open_value(fed, w, holders=holders, fp=FP)
    # Opening only to h1: h0 gets nothing.
    out["open_to_h1"] = open_shares(fed, su, holders=holders, to=H1) if fed.rank in holders else None
    return out


def test_products_equal_plain_products():
    res = launch(arithmetic_job, 3, timeout=60)
    x, y, u, v = data(1, (30, 4)), data(2, (4, 5)), data(3, (30, 4)), data(4, (30, 4))
    tol = dict(rtol=0, atol=1e-4)
    for r in range(3):
        torch.testing.assert_close(res[r]["xy"], x @ y, **tol)
    for r in (H0, H1):
        torch.testing.assert_close(res[r]["uv"], u * v, **tol)
        torch.testing.assert_close(res[r]["uv_shared"], u * v, **tol)
        torch.testing.assert_close(res[r]["uvT_shared"], u @ v.T, **tol)
    assert res[H0]["open_to_h1"] is None
    torch.testing.assert_close(FP.decode(res[H1]["open_to_h1"]), u, rtol=0, atol=1e-6)
    assert res[DEALER]["uv"] is None and res[DEALER]["u_share"] is None


def transcript_job(fed, value):
    from vfltorch.comm import Transcript
    fed.transcript = Transcript()
    x = torch.full((4000,), float(value), dtype=torch.float64)
    y = torch.full((4000,), 0.5, dtype=torch.float64)
    mul_private(fed, x if fed.rank == H0 else None, y if fed.rank == H1 else None, holders=(H0, H1),
                dealer=DEALER, shape_x=x.shape, shape_y=y.shape, fp=FP)
    # A transcript holds what its party sent: h0's messages to h1 are everything h1 got from h0.
    return [m.tensor for m in fed.transcript if m.dst == H1]


def test_what_the_other_holder_receives_is_uniform_whatever_the_value():
    # h1 pools everything h0 sent it: e = x - a must look the same for x = 0 and x = 1000
    # (each bit a fair coin), and differ from run to run (OS-entropy triples).
    seen = {}
    for value in (0.0, 1000.0):
        res = launch(transcript_job, 3, args=(value,), timeout=60)
        (e,) = res[H0]
        bits = torch.stack([(e >> k) & 1 for k in range(64)]).double().mean(1)
        assert (bits - 0.5).abs().max() < 0.05, value
        seen[value] = e
    assert not torch.equal(seen[0.0], seen[1000.0])


def test_truncation_of_two_shares_is_off_by_at_most_one_unit():
    stream = MaskStream.private()
    ring = RingGroup()
    x = torch.randint(-2 ** 40, 2 ** 40, (10_000,), dtype=torch.int64)
    s0 = stream.draw(ring, x.shape)
    s1 = x - s0
    got = truncate(s0, 0, 16) + truncate(s1, 1, 16)
    err = (got - (x >> 16)).abs()
    # Wrong only when the shares wrap around 2**64 together (probability about |x| / 2**63).
    assert (err <= 1).double().mean() > 0.999


def test_deal_refuses_unknown_kind():
    from vfltorch.comm import Federation
    with pytest.raises(ValueError, match="'mul' or 'matmul'"):
        deal(Federation.local(), "add", (2,), (2,), holders=(0, 1), dealer=2)


def test_private_streams_differ_and_simulation_streams_repeat():
    ring = RingGroup()
    assert not torch.equal(MaskStream.private().draw(ring, (8,)), MaskStream.private().draw(ring, (8,)))
    assert torch.equal(MaskStream(5, 1).draw(ring, (8,)), MaskStream(5, 1).draw(ring, (8,)))
    assert not torch.equal(MaskStream(5, 1).draw(ring, (8,)), MaskStream(5, 2).draw(ring, (8,)))


# ------------------------------------------------------------------ cross_products and rotate_shares
ROWS, WIDTHS = 50, [3, 4, 2]
FP30 = FixedPoint(frac_bits=30)


def block(rank):
    # ||X||_F <= 1 over the three parties, as the PCA's normalisation makes it
    return data(10 + rank, (ROWS, WIDTHS[rank])) / 20


def cross_job(fed):
    from vfltorch.comm import Transcript
    from vfltorch.comm.sharing import cross_products, rotate_shares
    fed.transcript = Transcript()
    parties, dealer = [0, 1, 2], 3
    x = block(fed.rank) if fed.rank in parties else None
    shares = cross_products(fed, x, parties=parties, dealer=dealer, widths=WIDTHS, rows=ROWS, fp=FP30)
    sent_during_products = len(fed.transcript)
    opened = {}                                  # for the test only: each pair's product at the dealer
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        mine = shares[(i, j)] if shares is not None and (i, j) in shares else None
        opened[(i, j)] = open_shares(fed, mine, holders=(i, j), to=dealer, shape=(WIDTHS[i], WIDTHS[j]))
    # The pooled d x d matrix V = X^T X in two-holder shares (0 and 1), rotated by R known to both.
    d = sum(WIDTHS)
    R = torch.linalg.qr(data(99, (d, d)))[0]
    rotated = None
    off = [0, 3, 7, 9]
    if fed.rank in parties:
        V = torch.zeros(d, d, dtype=torch.int64)
        for (i, j), z in shares.items():
            V[off[i]:off[i + 1], off[j]:off[j + 1]] += z
            V[off[j]:off[j + 1], off[i]:off[i + 1]] += z.T
        me = fed.rank
        V[off[me]:off[me + 1], off[me]:off[me + 1]] += FixedPoint(60).encode(x.T @ x)
        # Party 2 hands its share to holder 1 (the PCA does this with a masked sum).
        if fed.rank == 2:
            fed.send(V, 1)
        elif fed.rank == 1:
            V = V + fed.recv(2, (d, d), torch.int64, device="cpu")
    if fed.rank in (0, 1):
        rotated = rotate_shares(fed, V, R, holders=(0, 1), dealer=dealer, frac_in=60)
    elif fed.rank == dealer:
        rotate_shares(fed, None, None, holders=(0, 1), dealer=dealer, frac_in=60, shape=(d, d))
    out = open_shares(fed, rotated, holders=(0, 1), to=dealer, shape=(d, d))
    return {"opened": opened, "rotated": out, "R": R,
            "messages": [(m.src, m.dst, tuple(m.tensor.shape)) for m in fed.transcript][:sent_during_products]}


def test_cross_products_open_each_party_once_and_rotate_shares_is_exact():
    res = launch(cross_job, 4, timeout=90)
    dealer = res[3]
    for (i, j), got in dealer["opened"].items():
        torch.testing.assert_close(FixedPoint(60).decode(got), block(i).T @ block(j), rtol=0, atol=1e-8)
    X = torch.cat([block(r) for r in range(3)], 1)
    R = dealer["R"]
    torch.testing.assert_close(FixedPoint(40).decode(dealer["rotated"]), R @ (X.T @ X) @ R.T, rtol=0, atol=1e-9)
    # Each party sent its n x f_i block once to each other party, and nothing to the dealer.
    for r in range(3):
        blocks = [(dst, shape) for src, dst, shape in res[r]["messages"] if shape == (ROWS, WIDTHS[r])]
        assert sorted(dst for dst, _ in blocks) == [p for p in range(3) if p != r]
        assert all(dst != 3 for src, dst, shape in res[r]["messages"])


def test_the_128_bit_helpers_agree_with_python_integers():
    from vfltorch.comm.sharing import _add128, _matmul128, _neg128, _truncate128
    rng = np.random.default_rng(3)
    d = 5
    words = rng.integers(0, 2 ** 64, size=(2, d, d), dtype=np.uint64)
    as_int = np.array([[int(h) << 64 | int(l) for h, l in zip(hr, lr)] for hr, lr in zip(*words)], dtype=object)
    L = rng.integers(-2 ** 46, 2 ** 46, size=(d, d), dtype=np.int64)

    def back(x):
        return np.array([[int(h) << 64 | int(l) for h, l in zip(hr, lr)] for hr, lr in zip(*x)], dtype=object)

    M = 1 << 128
    assert (back(_matmul128(L, tuple(words))) == L.astype(object).dot(as_int) % M).all()
    assert (back(_add128(tuple(words), tuple(words))) == 2 * as_int % M).all()
    assert (back(_neg128(tuple(words))) == -as_int % M).all()
    signed = np.where(as_int >= 1 << 127, as_int - M, as_int)
    assert (back(_truncate128(tuple(words), 0, 40)) == (signed >> 40) % M).all()
    assert (back(_truncate128(tuple(words), 1, 40)) == (-((-signed) >> 40)) % M).all()


def test_ring_matmul_through_float_limbs_equals_int64_matmul():
    from vfltorch.comm.sharing import ring_matmul

    g = torch.Generator().manual_seed(3)
    for m, n, k in [(64, 500, 33), (1, 3, 1), (5, 0, 4)]:
        a = torch.randint(-2 ** 63, 2 ** 63 - 1, (m, n), dtype=torch.int64, generator=g)
        b = torch.randint(-2 ** 63, 2 ** 63 - 1, (n, k), dtype=torch.int64, generator=g)
        assert torch.equal(ring_matmul(a, b), a @ b)
        assert torch.equal(ring_matmul(a.T.contiguous().T, b), a @ b)
    # extreme words: every limb 0xFFFF
    a = torch.full((2, 2000), -1, dtype=torch.int64)
    assert torch.equal(ring_matmul(a, a.T), a @ a.T)


# ------------------------------------------------------------------ narrow rings (issue 11: FDSKL at Q = 2)
def test_narrow_words_pack_to_their_width_and_open_signed():
    from vfltorch.comm.sharing import WIRE_BITS, from_ring, pack_words, unpack_words, wire_bytes

    g = torch.Generator().manual_seed(0)
    for bits in WIRE_BITS:
        for n in (1, 2, 7, 1000):
            x = torch.randint(-2 ** 62, 2 ** 62, (n,), generator=g, dtype=torch.int64)
            wire = pack_words(x, bits)
            assert wire.numel() * wire.element_size() == wire_bytes(n, bits) <= (n * bits + 7) // 8 + 1
            back = unpack_words(wire, (n,), bits)
            # The same element of Z_2^bits, and the signed representative in [-2**(bits-1), 2**(bits-1)).
            signed = from_ring(back, bits)
            assert torch.equal(signed, from_ring(x, bits))
            assert torch.equal((signed - x) % 2 ** min(bits, 62), torch.zeros_like(x))
            assert int(signed.min()) >= -2 ** (bits - 1) and int(signed.max()) < 2 ** (bits - 1)
    with pytest.raises(ValueError, match="ring width"):
        pack_words(torch.zeros(2, dtype=torch.int64), 18)


def test_rowdot_scales_keep_narrow_row_dots_inside_the_ring():
    """The no-wrap bound behind FDSKL's Z_2^20 / Z_2^16 products (kernels/shared.py, StarProducts._product):
    with x_enc = round(s_i x_i) and integers |y| <= 2**F, |sum_k x_enc y| < 2**(w - 1) for every row, here
    with the worst y (|y| = 2**F, signs matching x_enc) and rows whose rounding errors all point outwards."""
    from vfltorch.comm.sharing import rowdot_scales

    g = torch.Generator().manual_seed(1)
    for bits, k in ((16, 64), (16, 512), (20, 2048), (24, 2048), (32, 2048)):
        F = max(2, round((bits - 0.5 - np.log2(k)) / 2))
        rows = [torch.randn(50, k, generator=g),                               # typical
                torch.randn(50, k, generator=g) ** 5,                          # heavy-tailed
                torch.full((1, k), 1.0), torch.zeros(1, k)]
        spike = torch.full((1, k), 1e-6)
        spike[0, 0] = 1.0                                                       # one large term, the rest tiny
        rows.append(spike)
        for x in rows:
            x = x.float()
            s = rowdot_scales(x, bits, F)
            xe = torch.round(x * s.unsqueeze(-1).to(x.dtype)).to(torch.int64)
            worst = (xe.abs() * 2 ** F).sum(-1)                                 # y = 2**F sign(x_enc)
            assert int(worst.max()) < 2 ** (bits - 1), (bits, k)
            # and the scales use the ring: the worst case reaches at least a quarter of it (non-zero rows)
            nz = x.abs().sum(-1) > 0
            if bool(nz.any()):
                assert int(worst[nz].min()) > 2 ** (bits - 3), (bits, k)
    with pytest.raises(OverflowError):
        rowdot_scales(torch.ones(2, 4096), 16, 6)


def narrow_job(fed, bits):
    from vfltorch.comm.sharing import deal_dealt, mul_dealt

    holders = (H0, H1)
    x = torch.randint(-2 ** 9, 2 ** 9, (6, 40), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    ys = [torch.randint(-8, 9, (6, 40), generator=torch.Generator().manual_seed(6 + i), dtype=torch.int32)
          for i in range(2)]
    known = fed.rank in (H1, DEALER)
    dealt = deal_dealt(fed, ys if known else None, holders=holders, dealer=DEALER, kind="rowdot",
                       shapes_x=[(6, 40)] * 2, shapes_y=[(6, 40)] * 2, bits=bits)
    out = []
    for i in range(2):
        z = mul_dealt(fed, x if fed.rank == H0 else None, ys[i] if known else None, holders=holders, dealer=DEALER,
                      kind="rowdot", shape_x=(6, 40), dealt=dealt[i] if fed.rank in holders else True, bits=bits[i])
        out.append(open_shares(fed, z, holders=holders, to=H0, shape=(6,), bits=bits[i]) if fed.rank in holders
                   else None)
    # The split form (FDSKL's pipelined iteration): both products' e in one message h_0 -> h_1, both of h_1's
    # shares in one message back, each part packed to its width (word_bytes), cut apart by known lengths.
    from vfltorch.comm.sharing import (dealt_operand, dealt_share, from_ring, split_bytes, wire_bytes, word_bytes,
                                       words_from_bytes)
    dealt = deal_dealt(fed, ys if known else None, holders=holders, dealer=DEALER, kind="rowdot",
                       shapes_x=[(6, 40)] * 2, shapes_y=[(6, 40)] * 2, bits=bits)
    e_len = [wire_bytes(240, b) for b in bits]
    z_len = [wire_bytes(6, b) for b in bits]
    split = None
    if fed.rank == H0:
        fed.send(torch.cat([word_bytes(dealt_operand(x, dealt[i], bits[i]), bits[i]) for i in range(2)]), H1)
        parts = split_bytes(fed.recv(H1, (sum(z_len),), torch.uint8, device="cpu"), z_len)
        split = [from_ring(dealt[i][1].long() + words_from_bytes(parts[i], (6,), bits[i]).long(), bits[i])
                 for i in range(2)]
    elif fed.rank == H1:
        es = split_bytes(fed.recv(H0, (sum(e_len),), torch.uint8, device="cpu"), e_len)
        fed.send(torch.cat([word_bytes(dealt_share("rowdot", words_from_bytes(es[i], (6, 40), bits[i]), ys[i],
                                                   dealt[i], bits[i]), bits[i]) for i in range(2)]), H0)
    return out, x, ys, split


def test_narrow_dealt_products_open_exactly():
    """Z_2^20 and Z_2^16 products as FDSKL's training runs them (one dealing, two products): exact while the
    row dots stay inside the ring (|value| <= 40 * 2**9 * 8 < 2**15)."""
    res = launch(narrow_job, 3, ((20, 16),), timeout=60)
    out, x, ys, split = res[H0]
    for i in range(2):
        assert torch.equal(out[i], (x.long() * ys[i].long()).sum(-1))
        assert torch.equal(split[i], out[i])
    assert res[H1][0] == [None, None]




def test_packing_in_place_is_bit_for_bit_the_wire_layout():
    """pack_words / unpack_words / words_from_bytes write and read the same bytes as the reference layout, for
    extreme words, odd counts and a message slice at an odd byte (the CPU round of issue 11 rewrote them)."""
    from vfltorch.comm.sharing import pack_words, unpack_words, word_bytes, words_from_bytes

    g = torch.Generator().manual_seed(1)
    edge = torch.tensor([0, 1, -1, 2 ** 31 - 1, -2 ** 31, 0xFFFFF, 0x80000, 0x7FFFF, 0xFFFF, 0x10000], dtype=torch.int64)
    for bits in (16, 20, 24):
        for n in (0, 1, 2, 3, 9, 10, 1001, 4096):
            x = torch.randint(-2 ** 62, 2 ** 62, (n,), generator=g, dtype=torch.int64)
            x[:min(n, edge.numel())] = edge[:min(n, edge.numel())]
            for src in (x, x.to(torch.int32)):
                wire = pack_words(src, bits)
                assert wire.dtype == torch.uint8 and torch.equal(wire, reference_pack(src, bits))
                back = unpack_words(wire, (n,), bits)
                assert back.dtype == torch.int32
                assert torch.equal(back.long(), x & ((1 << bits) - 1))          # the unsigned representative
                msg = torch.cat([torch.tensor([7], dtype=torch.uint8), word_bytes(src, bits)])  # odd offset
                assert torch.equal(words_from_bytes(msg[1:], (n,), bits), back)
