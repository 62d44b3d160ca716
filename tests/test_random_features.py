"""Random Fourier features and fixed-point phases: exact slices, the right distributions, kernel convergence."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from vfltorch.comm import MaskStream
from vfltorch.kernels import Circle, FourierSampler, feature_map
from vfltorch.kernels.random_features import counter_words, splitmix64


def reference_splitmix64(state: int) -> int:
    """SplitMix64 in plain Python integers (Steele, Lea & Flood), the reference for the torch version."""
    mask = 2 ** 64 - 1
    z = (state + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_splitmix64_matches_the_reference():
    counters = torch.tensor([0, 1, 2, 12345, 2 ** 40 + 7, 2 ** 62], dtype=torch.int64)
    for key in (0, 42, 2 ** 63 + 5):
        got = splitmix64(counters, key)
        for c, g in zip(counters.tolist(), got.tolist()):
            # torch's state is key + (c + 1) * golden; the reference adds one golden step itself.
            state = (key + c * 0x9E3779B97F4A7C15) % 2 ** 64
            assert g % 2 ** 64 == reference_splitmix64(state), (key, c)


@pytest.mark.parametrize("kernel", ["rbf", "laplace"])
def test_every_column_partition_gives_bit_identical_slices(kernel):
    d, D = 37, 96
    sampler = FourierSampler(kernel, sigma=1.7, seed=11)
    full = sampler.omega(range(d), range(D))
    rng = np.random.default_rng(0)
    for parties in (1, 2, 3, 5, 37):
        perm = rng.permutation(d)
        for cols in np.array_split(perm, parties):
            part = sampler.omega(cols, range(D))
            assert torch.equal(part, full[torch.as_tensor(cols)])
    # Feature blocks drawn one at a time are the columns of the whole draw too.
    blocks = torch.cat([sampler.omega(range(d), range(t * 32, (t + 1) * 32)) for t in range(3)], dim=1)
    assert torch.equal(blocks, full)
    # Another seed, another draw.
    assert not torch.equal(FourierSampler(kernel, 1.7, seed=12).omega(range(d), range(D)), full)


def test_directions_have_the_kernels_spectral_distribution():
    sigma = 2.5
    w = FourierSampler("rbf", sigma, seed=3).omega(range(200), range(500)).reshape(-1).numpy()
    assert kstest(w * sigma, "norm").pvalue > 1e-3
    w = FourierSampler("laplace", sigma, seed=3).omega(range(200), range(500)).reshape(-1).numpy()
    assert kstest(w * sigma, "cauchy").pvalue > 1e-3


@pytest.mark.parametrize("kernel", ["rbf", "laplace"])
def test_random_feature_kernel_converges_to_the_exact_kernel(kernel):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 8, generator=g, dtype=torch.float64)
    sampler = FourierSampler(kernel, sigma=0.8, seed=5)
    exact = sampler.kernel_matrix(X, X)
    errors = []
    for D in (100, 1_000, 10_000, 40_000):
        W = sampler.omega(range(8), range(D))
        b = torch.rand(D, generator=g, dtype=torch.float64) * 2 * math.pi
        phi = feature_map(X, W, b)
        approx = phi @ phi.T / D
        errors.append(float((approx - exact).abs().max()))
    # Monte Carlo: the error falls like D^-1/2 (x20 features -> about /4.5; allow slack).
    assert errors[-1] < 0.035, errors
    assert errors[0] > 2.5 * errors[2] and errors[1] > 2.5 * errors[3], errors


def test_circle_encoding_adds_angles_mod_two_pi_exactly():
    g = torch.Generator().manual_seed(1)
    for bits, tol in ((16, 2 * math.pi / 2 ** 16), (32, 2 * math.pi / 2 ** 32), (64, 1e-15)):
        circle = Circle(bits)
        a = torch.randn(10_000, generator=g, dtype=torch.float64) * 50
        b = torch.randn(10_000, generator=g, dtype=torch.float64) * 50
        ka, kb = circle.encode(a), circle.encode(b)
        assert ka.dtype == {16: torch.int16, 32: torch.int32, 64: torch.int64}[bits]
        wrapped = lambda x: torch.remainder(x + math.pi, 2 * math.pi) - math.pi  # noqa: E731
        # decode(encode(theta)) is theta mod 2 pi, to the grid (and float64) precision.
        assert float(wrapped(circle.decode(ka) - a).abs().max()) <= tol + 1e-13
        # Integer addition is angle addition mod 2 pi.
        assert float(wrapped(circle.decode(circle.add(ka, kb)) - (a + b)).abs().max()) <= 2 * tol + 1e-13
        # Masks cancel exactly: (x + m) - m == x, bit for bit, for uniform words m.
        m = MaskStream(7, 0).draw(circle, ka.shape)
        assert torch.equal(circle.sub(circle.add(ka, m), m), ka)
        # Angles far beyond the int64 range of grid units still reduce correctly.
        huge = torch.tensor([1e10, -1e10, 1e12 + 0.5], dtype=torch.float64)
        assert float(wrapped(circle.decode(circle.encode(huge)) - huge).abs().max()) < max(1e-3, tol)


def test_masks_are_uniform_words():
    for bits in (16, 32, 64):
        circle = Circle(bits)
        words = MaskStream(3, 1).draw(circle, (100_000,)).to(torch.int64)
        bit_means = torch.stack([(words >> k) & 1 for k in range(bits)]).double().mean(1)
        assert (bit_means - 0.5).abs().max() < 0.01
        angles = circle.decode(MaskStream(3, 1).draw(circle, (100_000,)))
        assert kstest(angles.numpy() / (2 * math.pi) + 0.5, "uniform").pvalue > 1e-3
    # Streams are private per (seed, rank): different ranks or seeds, different masks.
    c = Circle(32)
    a, b, a2 = MaskStream(3, 1).draw(c, (64,)), MaskStream(3, 2).draw(c, (64,)), MaskStream(4, 1).draw(c, (64,))
    assert not torch.equal(a, b) and not torch.equal(a, a2)


def test_phase_words_are_uniform_and_depend_only_on_the_key_and_index():
    for bits in (16, 32, 64):
        words = counter_words(99, torch.arange(200_000), bits)
        assert words.dtype == Circle(bits).dtype
        assert torch.equal(words[1000:1010], counter_words(99, torch.arange(1000, 1010), bits))
        angles = Circle(bits).decode(words)
        # 16-bit angles sit on a grid of 65536 points: compare with the uniform grid distribution.
        assert kstest(angles.numpy() / (2 * math.pi) + 0.5, "uniform").pvalue > 1e-3 or bits == 16
        counts = torch.bincount((angles / (2 * math.pi) * 16 + 8).floor().long().clamp(0, 15), minlength=16)
        assert (counts.double() / len(words) - 1 / 16).abs().max() < 0.005


def test_narrow_circle_encoding_through_int32_keeps_the_int64_words():
    """Circle.encode below 64 bits goes through int32 when the grid units fit (the CPU round of issue 11): the
    same words as the int64 route, on both sides of 2**31 units, for float32 and float64 angles."""
    g = torch.Generator().manual_seed(2)
    for bits in (16, 32):
        circle = Circle(bits)
        unit = circle.scale / (2 * math.pi)
        for dtype in (torch.float32, torch.float64):
            for spread in (1.0, 50.0, 1e4, 2.0 ** 31 / unit * 0.999, 2.0 ** 31 / unit * 1.001, 1e9):
                theta = (torch.rand(5000, generator=g, dtype=torch.float64) * 2 - 1).mul(spread).to(dtype)
                theta[:2] = torch.tensor([spread, -spread], dtype=torch.float64).to(dtype)
                k = torch.round(theta * (circle.scale / (2 * math.pi)))
                if float(k.abs().max()) >= 2.0 ** 62:
                    k = torch.remainder(k, circle.scale)
                assert torch.equal(circle.encode(theta), k.to(torch.int64).to(circle.dtype)), (bits, dtype, spread)
        assert torch.equal(circle.encode(torch.tensor([2.0 ** 31 / unit, -2.0 ** 31 / unit, (2.0 ** 31 - 1) / unit],
                                                      dtype=torch.float64)),
                           torch.tensor([2 ** 31, -2 ** 31, 2 ** 31 - 1]).to(circle.dtype))
