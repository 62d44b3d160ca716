"""The three generalised linear models of DP-SCD and their one-dimensional coordinate steps.

Primal problem (the paper's eq. 1), rows x_i with ||x_i|| <= 1:

    P(theta) = (1/N) sum_i l_i(x_i^T theta) + (lambda/2) ||theta||^2

Dual problem (SDCA form; the paper's eq. 2), one variable alpha_i per example:

    min_alpha  F(alpha) = (1/N) sum_i l_i*(-alpha_i) + (1/(2 lambda N^2)) ||X^T alpha||^2,

with the shared vector v = X^T alpha (the sum of alpha_i x_i) and the primal
model theta(alpha) = v / (lambda N). The dual objective we report is
D(alpha) = -F(alpha) <= P(theta) for every alpha; at the optimum they meet.

Dual coordinate step (the paper's eq. 8). Changing alpha_j by zeta changes
N * F by

    g_j(zeta) = l_j*(-(alpha_j + zeta)) + z_j zeta + (s_j / 2) zeta^2,
    z_j = x_j^T v / (lambda N)   (= x_j^T theta),
    s_j = L ||x_j||^2 / (lambda N),

where L = 1 gives the exact coordinate minimisation of sequential SCD, and
L = the mini-batch size gives the separable upper bound that makes the L
updates of a DP-SCD mini-batch independent (the "L ||x_j||^2 zeta^2" term).
``dual_step`` returns the minimiser (ridge, hinge: exactly; logistic: Newton).

Primal coordinate step (primal DP-SCD, Algorithm 2): coordinate k of theta
moves by the zeta minimising, over a mini-batch B with margins w_i = x_i^T theta,

    h_k(zeta) = (1/L) sum_{i in B} l_i(w_i + zeta x_ik) + (lambda/2) (theta_k + zeta)^2.

The step functions work on torch tensors (batched, any device) and on numpy
arrays; ``dual_step_scalar`` is the same step on Python floats, for the
sequential loop of seqDP-SCD (CPU scalars, where numpy's overhead dominates).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _xp(a):
    return torch if isinstance(a, torch.Tensor) else np


class Ridge:
    """Squared loss l_i(m) = (m - y_i)^2 / 2; l_i*(-a) = -a y_i + a^2 / 2 (no constraint on a)."""

    name = "ridge"
    kind = "regression"

    def loss(self, margin, y):
        return 0.5 * (margin - y) ** 2

    def conjugate(self, alpha, y):
        return -alpha * y + 0.5 * alpha ** 2

    def dual_step(self, alpha, y, z, s):
        # g'(zeta) = -y + alpha + zeta + z + s zeta = 0.
        return (y - z - alpha) / (1.0 + s)

    dual_step_scalar = dual_step

    def primal_step(self, theta_k, w, y, xk, lam, L):
        # h is quadratic: one exact step.
        g1 = ((w - y) * xk).sum() / L + lam * theta_k
        g2 = (xk * xk).sum() / L + lam
        return -g1 / g2

    def predict(self, margin):
        return margin


class Logistic:
    """Logistic loss l_i(m) = log(1 + exp(-y_i m)).

    With b = alpha y in [0, 1]: l_i*(-alpha) = b log b + (1 - b) log(1 - b)
    (infinite outside [0, 1]). g_j has no closed-form minimiser; ``dual_step``
    takes ``newton_steps`` Newton steps (one, as in the paper) from the
    current b clamped into [box, 1 - box] (the evaluation point must be inside
    (0, 1), where the entropy is differentiable; the authors' code uses
    box = 1e-4), and a step that would leave (0, 1) stops halfway to the
    boundary, so b stays strictly inside.
    """

    name = "logistic"
    kind = "binary"

    def __init__(self, box: float = 1e-4, newton_steps: int = 1):
        if not 0 < box < 0.5:
            raise ValueError(f"box must lie in (0, 0.5), got {box}")
        if newton_steps < 1:
            raise ValueError(f"newton_steps must be at least 1, got {newton_steps}")
        self.box = box
        self.newton_steps = newton_steps

    def loss(self, margin, y):
        if isinstance(margin, torch.Tensor):
            return torch.nn.functional.softplus(-y * margin)
        return np.logaddexp(0.0, -y * margin)

    def conjugate(self, alpha, y):
        xp = _xp(alpha)
        b = alpha * y
        inside = (b >= 0) & (b <= 1)
        bc = xp.clip(b, 0.0, 1.0)
        if xp is torch:
            ent = torch.special.xlogy(bc, bc) + torch.special.xlogy(1 - bc, 1 - bc)
            return torch.where(inside, ent, torch.full_like(ent, math.inf))
        from scipy.special import xlogy

        ent = xlogy(bc, bc) + xlogy(1 - bc, 1 - bc)
        return np.where(inside, ent, np.inf)

    def dual_step(self, alpha, y, z, s):
        xp = _xp(alpha)
        b0 = alpha * y
        b = xp.clip(b0, self.box, 1.0 - self.box)
        for _ in range(self.newton_steps):
            # In b = (alpha + zeta) y, with zeta = (b - b0) y: g'(b) = log(b / (1 - b)) + y z + s (b - b0),
            # g''(b) = 1 / (b (1 - b)) + s (y^2 = 1).
            grad = xp.log(b) - xp.log(1.0 - b) + y * z + s * (b - b0)
            hess = 1.0 / (b * (1.0 - b)) + s
            target = b - grad / hess
            # Fraction to the boundary: never leave (0, 1).
            b = xp.where(target <= 0, 0.5 * b, xp.where(target >= 1, 0.5 * (1.0 + b), target))
        return b * y - alpha

    def dual_step_scalar(self, alpha: float, y: float, z: float, s: float) -> float:
        """``dual_step`` on Python floats (the sequential loop's CPU form; ~10x faster than numpy scalars)."""
        b0 = alpha * y
        b = min(max(b0, self.box), 1.0 - self.box)
        for _ in range(self.newton_steps):
            grad = math.log(b) - math.log(1.0 - b) + y * z + s * (b - b0)
            target = b - grad / (1.0 / (b * (1.0 - b)) + s)
            b = 0.5 * b if target <= 0 else (0.5 * (1.0 + b) if target >= 1 else target)
        return b * y - alpha

    def primal_step(self, theta_k, w, y, xk, lam, L):
        zeta = 0.0
        for _ in range(self.newton_steps):
            m = y * (w + zeta * xk)
            p = torch.sigmoid(-m)                      # -l'(m) / y
            g1 = (-y * p * xk).sum() / L + lam * (theta_k + zeta)
            g2 = (p * (1 - p) * xk * xk).sum() / L + lam
            zeta = zeta - g1 / g2
        return zeta

    def predict(self, margin):
        return torch.where(margin > 0, 1.0, -1.0) if isinstance(margin, torch.Tensor) else np.where(margin > 0, 1.0, -1.0)


class Hinge:
    """Hinge loss of the L2-regularised SVM, l_i(m) = max(0, 1 - y_i m).

    l_i*(-alpha) = -alpha y_i for b = alpha y_i in [0, 1], infinite outside:
    g_j is a quadratic on an interval, so the minimiser is the unconstrained
    one, b = b0 + (1 - y z) / s, projected onto [0, 1] (exact, SDCA's step).
    """

    name = "svm"
    kind = "binary"

    def loss(self, margin, y):
        xp = _xp(margin)
        return xp.clip(1.0 - y * margin, 0.0, None) if xp is np else torch.clamp(1.0 - y * margin, min=0.0)

    def conjugate(self, alpha, y):
        xp = _xp(alpha)
        b = alpha * y
        inside = (b >= -1e-12) & (b <= 1 + 1e-12)
        if xp is torch:
            return torch.where(inside, -b, torch.full_like(b, math.inf))
        return np.where(inside, -b, np.inf)

    def dual_step(self, alpha, y, z, s):
        xp = _xp(alpha)
        # A zero row (s = 0) makes g linear: the minimiser is an end of the interval; a tiny s picks it.
        s = xp.clip(s, 1e-300, None) if xp is np else torch.clamp(s, min=1e-300)
        b = xp.clip(alpha * y + (1.0 - y * z) / s, 0.0, 1.0)
        return b * y - alpha

    def dual_step_scalar(self, alpha: float, y: float, z: float, s: float) -> float:
        """``dual_step`` on Python floats (the sequential loop's CPU form)."""
        b = min(max(alpha * y + (1.0 - y * z) / max(s, 1e-300), 0.0), 1.0)
        return b * y - alpha

    def primal_step(self, theta_k, w, y, xk, lam, L):
        """Exact minimiser of a strongly convex piecewise quadratic (sort the kinks, find where 0 is a subgradient).

        term_i(zeta) = max(0, a_i - c_i zeta), a_i = 1 - y_i w_i, c_i = y_i x_ik. Left of every kink the
        active terms are those with c_i > 0; crossing kink t_i = a_i / c_i raises the slope by |c_i| / L.
        """
        a = 1.0 - y * w
        c = y * xk
        nz = c != 0
        kinks = a[nz] / c[nz]
        order = torch.argsort(kinks)
        t = kinks[order]
        jumps = c[nz].abs()[order] / L
        d0 = -c[c > 0].sum() / L                        # slope of the loss part left of every kink
        slopes = torch.cat([d0.reshape(1), d0 + torch.cumsum(jumps, 0)])     # on interval j: (t_{j-1}, t_j)
        inf = torch.tensor([math.inf], dtype=t.dtype, device=t.device)
        left = torch.cat([-inf, t])
        right = torch.cat([t, inf])
        # The derivative on interval j is slopes_j + lam (theta_k + zeta): increasing. Take the first interval
        # whose right end has a non-negative derivative; the minimiser is the stationary point clamped into it.
        ok = slopes + lam * (theta_k + right) >= 0
        j = int(torch.nonzero(ok)[0]) if bool(ok.any()) else len(slopes) - 1
        stationary = -slopes[j] / lam - theta_k
        return torch.clamp(stationary, min=left[j], max=right[j])

    def predict(self, margin):
        return torch.where(margin > 0, 1.0, -1.0) if isinstance(margin, torch.Tensor) else np.where(margin > 0, 1.0, -1.0)


TASKS = {"ridge": Ridge, "logistic": Logistic, "svm": Hinge}


def make_glm(task: str, **kwargs):
    from .config import check_task

    check_task(task)
    if task == "logistic":
        return Logistic(**kwargs)
    return TASKS[task]()


def primal_objective(glm, margins: torch.Tensor, y: torch.Tensor, theta_sq_norm: float, lam: float) -> float:
    """P(theta) = mean_i l_i(x_i^T theta) + (lambda/2) ||theta||^2 from the margins and ||theta||^2."""
    return float(glm.loss(margins, y).mean()) + 0.5 * lam * float(theta_sq_norm)


def dual_objective(glm, alpha: torch.Tensor, y: torch.Tensor, v_sq_norm: float, lam: float) -> float:
    """D(alpha) = -(1/N) sum_i l_i*(-alpha_i) - ||v||^2 / (2 lambda N^2), a lower bound on min P."""
    n = alpha.shape[0]
    return -float(glm.conjugate(alpha, y).mean()) - float(v_sq_norm) / (2.0 * lam * n * n)
