"""The losses of FDSKL's Table 1: values at known points, derivatives against autograd."""

import math

import pytest
import torch

from vfltorch.kernels import LOSSES, get_loss


def points():
    g = torch.Generator().manual_seed(0)
    f = torch.cat([torch.randn(500, generator=g, dtype=torch.float64) * 3,
                   torch.tensor([0.0, 0.5, 1.0, -1.0, 2.0, -0.3, 40.0, -40.0], dtype=torch.float64)])
    y = torch.where(torch.rand(f.shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    y[-8:] = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    return f, y


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_derivative_matches_autograd(name):
    loss = LOSSES[name]
    f, y = points()
    f = f.clone().requires_grad_(True)
    value = loss.value(f, y)
    (grad,) = torch.autograd.grad(value.sum(), f)
    torch.testing.assert_close(loss.derivative(f.detach(), y), grad, rtol=1e-12, atol=1e-12)
    if name == "square":  # the regression form: real-valued targets
        t = torch.linspace(-5, 5, 50, dtype=torch.float64)
        g = torch.linspace(-2, 3, 50, dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(loss.value(g, t).sum(), g)
        torch.testing.assert_close(loss.derivative(g.detach(), t), grad)


def test_values_at_known_points():
    y = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    f = torch.tensor([-1.0, 0.0, 0.5, 2.0, 0.5], dtype=torch.float64)   # margins z = y f: -1, 0, 0.5, 2, -0.5
    sq = LOSSES["square"].value(f, y)
    torch.testing.assert_close(sq, (1 - y * f) ** 2)
    lg = LOSSES["logistic"].value(f, y)
    torch.testing.assert_close(lg, torch.log1p(torch.exp(-y * f)))
    sh = LOSSES["smooth_hinge"].value(f, y)
    torch.testing.assert_close(sh, torch.tensor([1.5, 0.5, 0.125, 0.0, 1.0], dtype=torch.float64))
    # No overflow at large margins.
    big = torch.tensor([800.0, -800.0], dtype=torch.float64)
    assert torch.isfinite(LOSSES["logistic"].value(big, torch.ones(2, dtype=torch.float64))).all()
    assert math.isclose(float(LOSSES["logistic"].value(big, torch.ones(2, dtype=torch.float64))[1]), 800.0)


def test_curvature_bounds_the_second_derivative():
    f, y = points()
    for loss in LOSSES.values():
        h = 1e-5
        second = (loss.derivative(f + h, y) - loss.derivative(f - h, y)) / (2 * h)
        assert float(second.max()) <= loss.curvature + 1e-6, loss.name


def test_loss_must_fit_the_task():
    assert get_loss("square", "regression").name == "square"
    with pytest.raises(ValueError, match="not regression: use square"):
        get_loss("logistic", "regression")
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        get_loss("hinge")
