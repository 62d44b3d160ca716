"""The smooth losses of FDSKL's Table 1, with the derivative L'(f, y) = dL/df that Algorithm 1 needs.

Binary classification (BC) uses labels y in {-1, +1} and the margin z = y f:

* square        L = (1 - y f)^2                     L' = -2 y (1 - y f)
* logistic      L = log(1 + exp(-y f))              L' = -y / (1 + exp(y f))
* smooth hinge  L = 1/2 - z        if z <= 0        L' = -y
                    (1 - z)^2 / 2  if 0 < z < 1          -y (1 - z)
                    0              if z >= 1             0

Regression (R) uses the square loss L = (f - y)^2, L' = 2 (f - y); for
y in {-1, +1} it is the same function as the BC square loss.

``curvature`` is the largest second derivative d^2L/df^2 (the smoothness
constant). ``default_step`` is the constant step gamma used when none is
given: 4 / curvature for the classification losses (16 logistic, 4 smooth
hinge), whose curvature is reached only near the margin, and 1 = 2 /
curvature for the square loss, whose curvature is the same everywhere
(gamma = 2 already oscillates on regression targets). Measured on a9a,
breast_cancer and abalone with the median-heuristic sigma (docs/fdskl.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Loss:
    name = ""
    tasks: tuple[str, ...] = ()
    curvature = 1.0
    default_step = 4.0

    def value(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def derivative(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SquareLoss(Loss):
    name = "square"
    tasks = ("binary", "regression")
    curvature = 2.0
    default_step = 1.0

    def value(self, f, y):
        return (f - y) ** 2

    def derivative(self, f, y):
        return 2.0 * (f - y)


class LogisticLoss(Loss):
    name = "logistic"
    tasks = ("binary",)
    curvature = 0.25
    default_step = 16.0

    def value(self, f, y):
        return F.softplus(-y * f)                      # log(1 + exp(-y f)) without overflow

    def derivative(self, f, y):
        return -y * torch.sigmoid(-y * f)              # -y / (1 + exp(y f))


class SmoothHingeLoss(Loss):
    name = "smooth_hinge"
    tasks = ("binary",)
    curvature = 1.0

    def value(self, f, y):
        z = y * f
        return torch.where(z <= 0, 0.5 - z, torch.where(z < 1, 0.5 * (1 - z) ** 2, torch.zeros_like(z)))

    def derivative(self, f, y):
        z = y * f
        return torch.where(z <= 0, -y, torch.where(z < 1, -y * (1 - z), torch.zeros_like(z)))


LOSSES: dict[str, Loss] = {c.name: c() for c in (SquareLoss, LogisticLoss, SmoothHingeLoss)}


def get_loss(name: str, task: str = "binary") -> Loss:
    """A loss by name, checked against the task ('binary' or 'regression')."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}: choose one of {', '.join(LOSSES)}")
    loss = LOSSES[name]
    if task not in loss.tasks:
        fits = [n for n, l in LOSSES.items() if task in l.tasks]
        raise ValueError(f"the {name} loss is for {' and '.join(loss.tasks)} tasks, not {task}: "
                         f"use {' or '.join(fits)}")
    return loss
