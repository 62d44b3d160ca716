"""The Taylor-expanded logistic loss of Hardy et al. 2017 and Yang et al. (SQN), in plaintext.

For labels y in {-1, +1} and a margin u = w^T x, the logistic loss
log(1 + exp(-y u)) has the second-order expansion around u = 0

    l(u, y) ~ log 2 - (1/2) y u + (1/8) u^2          (y^2 = 1)

(the odd terms of log(1 + e^{-t}) beyond the linear one vanish, the next
term is O(u^4)). Over rows i of a mini-batch S, with an L2 penalty
(lambda/2) ||w||^2 on the penalised coordinates (the intercept is not):

    L(w)      = (1/|S|) sum_i l(u_i, y_i) + (lambda/2) ||w||^2
    d_i       = dl/du_i = (1/4) u_i - (1/2) y_i                  the residual
    grad L    = (1/|S|) sum_i d_i x_i + lambda w                 (the paper's eq. 4, signs fixed)
    hess L s  = (1/|S|) sum_i (1/4) (s^T x_i) x_i + lambda s     (eq. 7 with S_H rows)

The Hessian does not depend on w: the Taylor loss is a quadratic, so every
curvature pair (s, v) of SQN sees the same matrix up to sub-sampling.

These functions are the centralised twin of the federated protocol (one
party holding every column) and what the tests compare the protocol with.
In the protocol the same quantities are split by columns: u = sum_l u_l with
u_l = X_l w_l, and each party l computes its own block (1/|S|) X_l^T d.
"""

from __future__ import annotations

import math

import torch

LOG2 = math.log(2.0)


def residual(u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d_i = (1/4) u_i - (1/2) y_i: the derivative of the Taylor loss in the margin."""
    return 0.25 * u - 0.5 * y


def taylor_loss(u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of log 2 - (1/2) y u + (1/8) u^2 over the rows (no penalty)."""
    return (LOG2 - 0.5 * y * u + 0.125 * u * u).mean()


def logistic_loss(u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of log(1 + exp(-y u)), the loss the Taylor series approximates (for reporting)."""
    return torch.nn.functional.softplus(-y * u).mean()


def gradient(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, l2: float = 0.0,
             penalized: torch.Tensor | None = None) -> torch.Tensor:
    """(1/n) X^T d + lambda (penalized * w): the gradient of the Taylor loss over the rows of X."""
    d = residual(X @ w, y)
    g = X.T @ d / X.shape[0]
    return g + l2 * _mask(penalized, w) * w


def hessian_vector(X: torch.Tensor, s: torch.Tensor, l2: float = 0.0,
                   penalized: torch.Tensor | None = None) -> torch.Tensor:
    """(1/n) sum_i (1/4) (s^T x_i) x_i + lambda (penalized * s): the sub-sampled Hessian times s."""
    return X.T @ (0.25 * (X @ s)) / X.shape[0] + l2 * _mask(penalized, s) * s


def penalty(w: torch.Tensor, l2: float, penalized: torch.Tensor | None = None) -> torch.Tensor:
    """(lambda/2) ||penalized * w||^2."""
    return 0.5 * l2 * ((_mask(penalized, w) * w) ** 2).sum()


def _mask(penalized, like: torch.Tensor) -> torch.Tensor:
    if penalized is None:
        return torch.ones_like(like)
    return penalized.to(like.dtype)


__all__ = ["LOG2", "gradient", "hessian_vector", "logistic_loss", "penalty", "residual", "taylor_loss"]
