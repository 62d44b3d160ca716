"""The optimizers' public schedule: step sizes, which iterations use curvature, iterate averages.

Every party (and the coordinator) derives the same schedule from public
hyperparameters, so nobody has to announce what kind of step comes next.

SGD (Hardy et al. 2017): w_{k+1} = w_k - eta_e g_k at every iteration k.

SQN (Byrd et al. 2016, as in Yang et al.'s Algorithm 2), with update interval
L and memory M:

* iterations k = 1 .. 2L are plain SGD steps;
* after every L-th update (k = tL) the parties close a window: the average
  iterate w_bar_t = (1/L) sum_{j=k-L+1}^{k} w_{j+1} (w_{j+1}: the model after
  update j); from t = 2 on, s_t = w_bar_t - w_bar_{t-1} and the coordinator
  receives v_t = (sub-sampled Hessian) s_t (eq. 7) - the curvature pair;
* iterations k > 2L are quasi-Newton steps w_{k+1} = w_k - eta_e H_t g_k
  (eq. 8; H_t from the last M pairs, ``lbfgs.two_loop``).

Each party keeps only its own block of w, of w_bar and of s
(``IterateAverager``).

Step size: eta_e = lr / (1 + decay e), or lr / sqrt(1 + decay e) with
``decay_sqrt`` (FATE's two forms), e = 0, 1, ... the epoch.
"""

from __future__ import annotations

import math

import torch


class StepSize:
    """eta_e = lr / (1 + decay e)  (or lr / sqrt(1 + decay e))."""

    def __init__(self, lr: float, decay: float = 0.0, decay_sqrt: bool = False):
        self.lr, self.decay, self.decay_sqrt = float(lr), float(decay), bool(decay_sqrt)

    def __call__(self, epoch: int) -> float:
        x = 1.0 + self.decay * epoch
        return self.lr / (math.sqrt(x) if self.decay_sqrt else x)


class IterationPlan:
    """Which iterations are curvature (quasi-Newton) steps and when a curvature pair is due."""

    def __init__(self, optimizer: str, L: int):
        self.optimizer = optimizer
        self.L = int(L)

    def quasi_newton(self, k: int) -> bool:
        """Iteration k (1-based) applies H_t: SQN after the first 2L plain SGD iterations."""
        return self.optimizer == "sqn" and k > 2 * self.L

    def window_closes(self, k: int) -> bool:
        """After update k the parties close an averaging window (SQN only)."""
        return self.optimizer == "sqn" and k % self.L == 0

    def pair_due(self, k: int) -> bool:
        """A curvature pair (s_t, v_t) is computed after update k: windows t >= 2 (k = tL, t >= 2)."""
        return self.window_closes(k) and k >= 2 * self.L


class IterateAverager:
    """A party's block of the window averages w_bar_t and of s_t = w_bar_t - w_bar_{t-1}."""

    def __init__(self, L: int):
        self.L = int(L)
        self._sum = None
        self._count = 0
        self.previous: torch.Tensor | None = None

    def add(self, w: torch.Tensor) -> None:
        """Record the model after an update."""
        self._sum = w.clone() if self._sum is None else self._sum + w
        self._count += 1

    def close(self) -> torch.Tensor | None:
        """End the window: returns s_t (None for the first window)."""
        if self._count != self.L:
            raise RuntimeError(f"closing an averaging window of {self._count} iterates, expected {self.L}")
        average = self._sum / self.L
        s = None if self.previous is None else average - self.previous
        self.previous = average
        self._sum, self._count = None, 0
        return s


__all__ = ["IterateAverager", "IterationPlan", "StepSize"]
