"""Issue 11's op-count round (s7): fewer torch calls per shared iteration, the same values.

Each path that moved from torch to numpy or Python integers (or lost a copy) is compared here with the torch
expression it replaced, at the values where the two could differ (zero rows, wrap-around, rounding, alignment).
The whole-run check (alpha's SHA-256 with fixed secrets, base against new) is outside the package.
"""

import math

import numpy as np
import pytest
import torch

from vfltorch.comm import launch
from vfltorch.comm.sharing import _from_ring_np, from_ring, rowdot_scales


def test_keeper_of_in_python_integers_is_the_tensor_splitmix64():
    from vfltorch.kernels.random_features import splitmix64, splitmix64_int

    for key in (0, 1, 2 ** 63 + 5, 2 ** 64 - 1, 0x4EE9 * 0x9E3779B97F4A7C15 % 2 ** 64):
        for t in [*range(40), 2 ** 31, 2 ** 62 + 3]:
            word = int(splitmix64(torch.tensor([t], dtype=torch.int64), key)[0])
            assert splitmix64_int(t, key) == word % 2 ** 64
            assert splitmix64_int(t, key) % 2 ** 62 == word % 2 ** 62         # keeper_of's draw, signed or not


def test_rowdot_scales_tail_in_numpy_is_torchs_reciprocal_times_room():
    """room / total in torch is reciprocal(total) * room (two roundings): the numpy tail must be that, not a
    division, and 1 on rows of zeros."""
    g = torch.Generator().manual_seed(3)
    differs = 0
    for bits, F in ((20, 4), (16, 4), (24, 6), (32, 10)):
        x = torch.randn(257, 3072, generator=g) * torch.rand(257, 1, generator=g) * 50
        x[5] = 0
        k = x.shape[-1]
        room = 2.0 ** (bits - 1 - F) * (1 - 2.0 ** -10) - k / 2 - 1
        total = x.abs().sum(-1, dtype=torch.float64)
        old = (room / total).masked_fill_(total == 0, 1.0)
        new = rowdot_scales(x, bits, F)
        assert new.dtype == torch.float64 and torch.equal(new, old)
        with np.errstate(divide="ignore"):
            differs += int(((room / total.numpy()) != old.numpy()).sum())
    assert differs > 0          # a plain division would round differently somewhere: the test can tell


def test_small_openings_in_numpy_read_the_ring_as_from_ring():
    edge = [0, 1, -1, 2 ** 15, -2 ** 15, 2 ** 19 - 1, -2 ** 19, 2 ** 23, 2 ** 31 - 1, -2 ** 31, 2 ** 40 + 7, -2 ** 62]
    x = torch.tensor(edge + list(range(-300, 300, 7)), dtype=torch.int64)
    for bits in (16, 20, 24, 32, 64):
        assert torch.equal(torch.from_numpy(_from_ring_np(x.numpy(), bits)), from_ring(x, bits))


def test_real_factors_in_numpy_are_torchs_float32_products():
    from vfltorch.kernels.shared import SQRT2, _factors32

    g = torch.Generator().manual_seed(4)
    for scale in (1e-6, 1.0, 3e4, 1e30):
        v = torch.randn(4099, generator=g, dtype=torch.float64) * scale
        ref = (SQRT2 * v.to(torch.float32)).numpy()
        assert np.array_equal(_factors32(v).view(np.int32), ref.view(np.int32))
    for bad in (math.inf, -math.inf, math.nan):
        v = torch.zeros(8, dtype=torch.float64)
        v[3] = bad
        with pytest.raises(OverflowError):
            _factors32(v)
    with pytest.raises(OverflowError):             # finite in float64, not in float32
        _factors32(torch.tensor([1e39], dtype=torch.float64))


WINDOW = [  # (dtype, shape) of the messages the dealer buffers, at odd byte offsets in the window
    (torch.uint8, (3,)), (torch.int64, (2,)), (torch.int32, (5,)), (torch.int16, (3, 1)), (torch.uint8, (1,)),
    (torch.int64, (2, 2)), (torch.int16, (0,)), (torch.int32, (1,)),
]


def window_job(fed):
    """The dealer (rank 1) sends typed pieces through a DealerWindow; the other rank reads them back."""
    from vfltorch.kernels.shared import DealerWindow

    window = DealerWindow(fed, 1)
    g = torch.Generator().manual_seed(5)
    sent = [torch.randint(-100, 100, shape, generator=g).to(dtype) for dtype, shape in WINDOW]
    if fed.rank == 1:
        for t in sent[:5]:
            window.send(t, 0)
        window.flush()
        for t in sent[5:]:
            window.send(t, 0)
        window.flush()
        window.drain()
        return None
    got = [window.recv(1, shape, dtype, device="cpu") for dtype, shape in WINDOW]
    ok = [g_.dtype == t.dtype and g_.shape == t.shape and torch.equal(g_, t) for g_, t in zip(got, sent)]
    got[1].add_(1)                          # a piece is the receiver's own: writing it changes no other piece
    return ok, torch.equal(got[2], sent[2]) and torch.equal(got[0], sent[0])


def test_dealer_window_pieces_are_exact_views_over_gloo():
    res = launch(window_job, 2, timeout=60)
    ok, untouched = res[0]
    assert all(ok) and untouched
