"""Each coordinate step minimises its one-dimensional subproblem (checked against scipy's minimize_scalar)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from vfltorch.privacy.glm import Hinge, Logistic, Ridge


def g_dual(glm, alpha, y, z, s, zeta):
    """N times the change of the dual objective F when alpha_j moves by zeta (glm.py's g_j)."""
    a = torch.tensor([alpha + zeta], dtype=torch.float64)
    return float(glm.conjugate(a, torch.tensor([y], dtype=torch.float64))[0]) + z * zeta + 0.5 * s * zeta ** 2


def dual_cases(seed=0, count=60):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        y = float(rng.choice([-1.0, 1.0]))
        # alpha y anywhere in [0, 1] (and on the edges), margins of both signs, small and large s
        b = float(rng.choice([0.0, 1.0, rng.uniform(0, 1), rng.uniform(0, 1)]))
        yield b * y, y, float(rng.normal(0, 2)), float(10 ** rng.uniform(-2, 3))


def feasible_interval(alpha, y):
    """zeta such that (alpha + zeta) y lies in [0, 1]."""
    lo, hi = (-alpha, 1 - alpha) if y > 0 else (-1 - alpha, -alpha)
    return lo, hi


def test_ridge_step_is_the_exact_minimiser():
    glm = Ridge()
    for alpha, y, z, s in dual_cases(1):
        alpha = alpha * 3 + 0.5  # ridge has no box: anything goes
        zeta = float(glm.dual_step(*(torch.tensor(v, dtype=torch.float64) for v in (alpha, y, z, s))))
        ref = minimize_scalar(lambda t: g_dual(glm, alpha, y, z, s, t), bracket=(-10, 10), tol=1e-12)
        assert zeta == pytest.approx(ref.x, abs=1e-6)
        assert g_dual(glm, alpha, y, z, s, zeta) <= ref.fun + 1e-12


def test_hinge_step_is_the_exact_minimiser_on_the_box():
    glm = Hinge()
    for alpha, y, z, s in dual_cases(2):
        zeta = float(glm.dual_step(*(torch.tensor(v, dtype=torch.float64) for v in (alpha, y, z, s))))
        lo, hi = feasible_interval(alpha, y)
        ref = minimize_scalar(lambda t: g_dual(glm, alpha, y, z, s, t), bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-12})
        assert lo - 1e-12 <= zeta <= hi + 1e-12
        assert g_dual(glm, alpha, y, z, s, zeta) <= ref.fun + 1e-9
        assert zeta == pytest.approx(ref.x, abs=1e-5)


def test_logistic_newton_converges_to_the_minimiser_and_one_step_descends():
    many, one = Logistic(newton_steps=60), Logistic(newton_steps=1)
    for alpha, y, z, s in dual_cases(3):
        b = min(max(alpha * y, 0.05), 0.95)        # start inside (0, 1), where g is differentiable
        alpha = b * y
        lo, hi = feasible_interval(alpha, y)
        f = lambda t: g_dual(many, alpha, y, z, s, t)  # noqa: E731
        ref = minimize_scalar(f, bounds=(lo + 1e-15, hi - 1e-15), method="bounded", options={"xatol": 1e-13})
        args = tuple(torch.tensor(v, dtype=torch.float64) for v in (alpha, y, z, s))
        zeta = float(many.dual_step(*args))
        assert zeta == pytest.approx(ref.x, abs=1e-6)
        assert f(zeta) <= ref.fun + 1e-9
        step = float(one.dual_step(*args))
        assert 0 < (alpha + step) * y < 1            # alpha y stays strictly inside (0, 1)
        assert f(step) <= f(0.0) + 1e-12             # one Newton step never increases g


def test_logistic_step_from_the_boundary_stays_inside():
    glm = Logistic()
    alpha = torch.tensor([0.0, 0.0, 1.0, -1.0, 2.0], dtype=torch.float64)   # alpha = 0 at the start; noisy values
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    zeta = glm.dual_step(alpha, y, torch.tensor([0.3, -2.0, 5.0, 0.0, 1.0], dtype=torch.float64),
                         torch.full((5,), 3.0, dtype=torch.float64))
    b = (alpha + zeta) * y
    assert torch.all(b > 0) and torch.all(b < 1)


@pytest.mark.parametrize("glm", [Ridge(), Logistic(), Hinge()], ids=lambda g: g.name)
def test_float_numpy_and_torch_forms_agree(glm):
    cases = list(dual_cases(4, 30)) + [(0.0, 1.0, 0.5, 0.0), (-2.0, -1.0, 0.1, 1.0)]
    cols = [torch.tensor(c, dtype=torch.float64) for c in zip(*cases)]
    batched = glm.dual_step(*cols)
    for i, (alpha, y, z, s) in enumerate(cases):
        as_numpy = glm.dual_step(np.float64(alpha), np.float64(y), np.float64(z), np.float64(s))
        as_float = glm.dual_step_scalar(alpha, y, z, s)
        assert float(as_numpy) == pytest.approx(float(batched[i]), abs=1e-12)
        assert as_float == pytest.approx(float(batched[i]), abs=1e-12)


def h_primal(glm, theta_k, w, y, xk, lam, L, zeta):
    m = w + zeta * xk
    return float(glm.loss(m, y).sum()) / L + 0.5 * lam * (theta_k + zeta) ** 2


@pytest.mark.parametrize("glm", [Ridge(), Logistic(newton_steps=40), Hinge()], ids=lambda g: g.name)
def test_primal_step_minimises_the_batch_objective_along_a_coordinate(glm):
    rng = np.random.default_rng(5)
    for trial in range(15):
        b = int(rng.integers(1, 40))
        xk = torch.tensor(rng.normal(0, 0.3, b))
        if trial % 5 == 0:
            xk[: b // 2] = 0.0                         # zero entries: terms without slope
        w = torch.tensor(rng.normal(0, 1, b))
        y = torch.tensor(rng.choice([-1.0, 1.0], b)) if glm.name != "ridge" else torch.tensor(rng.normal(0, 1, b))
        theta_k, lam, L = float(rng.normal()), float(10 ** rng.uniform(-4, -1)), float(b + rng.integers(0, 5))
        zeta = float(glm.primal_step(torch.tensor(theta_k, dtype=torch.float64), w, y, xk, lam, L))
        f = lambda t: h_primal(glm, theta_k, w, y, xk, lam, L, t)  # noqa: E731
        ref = minimize_scalar(f, bracket=(-1, 1), tol=1e-12)
        for x0 in (ref.x, zeta):                       # polish: the hinge objective is only piecewise smooth
            r = minimize_scalar(f, bounds=(x0 - 1, x0 + 1), method="bounded", options={"xatol": 1e-12})
            ref = r if r.fun < ref.fun else ref
        assert f(zeta) <= ref.fun + 1e-9 * max(1.0, abs(ref.fun))
        assert math.isfinite(zeta)
