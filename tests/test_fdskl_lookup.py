"""FDSKL's feature path through the 16-bit cosine table: the same values as decode + cos, element for element.

``Circle.scaled_cos`` looks sqrt(2) cos(decode(k)) up in a 65,536-entry table for 16-bit angles;
``FederatedFeatureMap.features`` uses it at the active party (paper protocol) and, alone (Q = 1),
encodes the phases straight into table indices (``Circle.encode_index``). Every test compares with
the computed path, ``circle.decode(phases).cos_().mul_(sqrt 2)``, with ``torch.equal``.
"""

import math

import pytest
import torch

from vfltorch.comm import Federation, MaskStream, launch
from vfltorch.kernels import Circle, FourierSampler
from vfltorch.kernels.protocol import SQRT2, FederatedFeatureMap


def computed(circle, k, dtype):
    """The path the table replaces: decode, cos, times sqrt 2."""
    return circle.decode(k, dtype).cos_().mul_(SQRT2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_table_equals_decode_cos_on_every_16_bit_angle(dtype):
    circle = Circle(16)
    assert circle.has_table()
    # Every word once, shuffled and shaped like a batch of phases: the computed path on the same words.
    words = torch.arange(2 ** 16, dtype=torch.int32).to(torch.int16)
    words = words[torch.randperm(2 ** 16, generator=torch.Generator().manual_seed(0))].reshape(256, 256)
    want = computed(circle, words, dtype)
    got = circle.scaled_cos(words, dtype, SQRT2)
    assert got.dtype == dtype and got.shape == words.shape
    assert torch.equal(got, want)
    # Handed over in float64: the same values, cast.
    assert torch.equal(circle.scaled_cos(words, dtype, SQRT2, torch.float64), want.to(torch.float64))
    # The table is indexed by k mod 2**16 and built once per key.
    table = circle.cos_table(dtype, "cpu", SQRT2)
    assert table.shape == (2 ** 16,) and table is circle.cos_table(dtype, "cpu", SQRT2)
    assert float(table[0]) == pytest.approx(SQRT2) and float(table[2 ** 15]) == pytest.approx(-SQRT2)
    # A strided (non-contiguous) view of the words looks up the same.
    assert torch.equal(circle.scaled_cos(words.T, dtype, SQRT2), want.T)


def test_wider_angles_are_computed_not_tabled():
    g = torch.Generator().manual_seed(1)
    for bits in (32, 64):
        circle = Circle(bits)
        assert not circle.has_table()
        with pytest.raises(ValueError, match="no cosine table"):
            circle.cos_table(torch.float64, "cpu")
        k = circle.encode(torch.randn(64, 48, generator=g, dtype=torch.float64) * 30)
        assert torch.equal(circle.scaled_cos(k, torch.float32, SQRT2), computed(circle, k, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encode_index_equals_encode_then_add(dtype):
    circle = Circle(16)
    unit = circle.scale / (2 * math.pi)
    g = torch.Generator().manual_seed(2)
    offset = MaskStream(5, 0).draw(circle, (40,))
    # Spreads on both sides of the int32 route's limit (2**30 grid units) and beyond int32.
    for spread in (1.0, 80.0, 2.0 ** 30 / unit * 0.999, 2.0 ** 30 / unit * 1.001, 1e7):
        theta = ((torch.rand(300, 40, generator=g, dtype=torch.float64) * 2 - 1) * spread).to(dtype)
        want = circle.table_index(circle.add(circle.encode(theta), offset))
        got = circle.encode_index(theta, offset)
        assert got.dtype == torch.int32 and int(got.min()) >= 0 and int(got.max()) < 2 ** 16
        assert torch.equal(got, want), (dtype, spread)
        assert torch.equal(circle.encode_index(theta), circle.table_index(circle.encode(theta)))


def _feature_map(fed, columns, block, n_blocks, max_elements=2 ** 22, dtype=torch.float32, mask_seed=None):
    masks = MaskStream.private(fed.rank) if mask_seed is None else MaskStream(mask_seed, fed.rank)
    fmap = FederatedFeatureMap(fed, FourierSampler("rbf", sigma=0.7, seed=4), columns, block, seed=4,
                               phase_key=9, masks=masks, circle=Circle(16), dtype=dtype,
                               max_elements=max_elements)
    for _ in range(n_blocks):
        fmap.add_block()
    return fmap


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_centralised_features_equal_the_computed_path(dtype):
    """Q = 1: features straight from table indices equal decode + cos of the phases (masked-sum path)."""
    X = torch.rand(300, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
    fmap = _feature_map(Federation.local(), range(9), 8, 6, dtype=dtype)
    chunked = _feature_map(Federation.local(), range(9), 8, 6, dtype=dtype, max_elements=500)
    for blocks in (range(6), [2, 3, 4], [4, 1, 5], [3]):
        want = computed(fmap.circle, fmap.phases(X, blocks), dtype)
        assert torch.equal(fmap.features(X, blocks), want), list(blocks)
        # Row chunks of at most 500 values, as phases() takes them (a chunk's X W may round differently).
        assert torch.equal(chunked.features(X, blocks), computed(chunked.circle, chunked.phases(X, blocks), dtype))
        assert torch.equal(fmap.features(X, blocks, dtype=torch.float64), want.to(torch.float64))
    # Prediction (star phases, table) equals phi @ alpha from the computed features.
    alpha = torch.randn(fmap.n_features, generator=torch.Generator().manual_seed(5), dtype=dtype)
    phi = computed(fmap.circle, fmap.phases(X, range(6)), dtype)
    torch.testing.assert_close(fmap.decision_values(X, alpha), phi @ alpha, rtol=1e-5, atol=1e-5)


def _paper_job(fed, n_blocks):
    """Two parties, the paper protocol's masked sums: the active party's features against its phases."""
    X = torch.rand(200, 10, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(torch.float32)
    cols = range(0, 6) if fed.rank == 0 else range(6, 10)
    fmap = _feature_map(fed, cols, 8, n_blocks)
    blocks = [0, 2, 1, 3]
    phi = fmap.features(X[:, list(cols)], blocks)
    theta = fmap.phases(X[:, list(cols)], blocks)                  # the same masked sums again
    if theta is None:
        return None
    return {"phi": phi, "computed": computed(fmap.circle, theta, torch.float32), "X": X}


def test_paper_protocol_features_through_launch_equal_the_computed_path_and_the_centralised_twin():
    out = launch(_paper_job, 2, args=(4,))
    assert out[1] is None
    got = out[0]
    assert torch.equal(got["phi"], got["computed"])
    # Lemma 1 on the 16-bit grid: each of the two parts is rounded once, so phases differ by at most
    # 2 * pi / 2**16 and features by sqrt(2) times that from the centralised map's (the same features).
    alone = _feature_map(Federation.local(), range(10), 8, 4).features(got["X"], [0, 2, 1, 3])
    assert float((got["phi"] - alone).abs().max()) <= SQRT2 * 2 * math.pi / 2 ** 16 + 1e-6
