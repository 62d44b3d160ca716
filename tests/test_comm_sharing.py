"""Secret-shared arithmetic (vfltorch.comm.sharing) over real gloo processes: two holders and a dealer."""

import numpy as np
import pytest
import torch

from vfltorch.comm import FixedPoint, MaskStream, RingGroup, launch
from vfltorch.comm.sharing import deal, mul_private, mul_shared, open_shares, open_value, share, truncate

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
