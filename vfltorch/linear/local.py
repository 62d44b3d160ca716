"""The centralised twin: one process holds every column and the labels (Q = 1, no coordinator).

Same schedule, same step sizes, same averaging windows, same L-BFGS memory
and two-loop recursion, same stopping rule as the federated protocol; the
gradient, loss and Hessian-vector products are computed directly from
``taylor.py``. With quantised features it is what the federated plaintext
protocol must reproduce up to float rounding, and the encrypted protocol up
to the fixed-point rounding of its ciphertexts (``tests/test_hetero_lr*.py``).
"""

from __future__ import annotations

import torch

from .bounds import COEF_MAX, DivergenceError
from .lbfgs import CurvatureMemory
from .optimizers import IterateAverager
from .session import Session
from .stopping import LossTracker
from .taylor import LOG2, hessian_vector, residual


class LocalLearner:
    role = "centralised"

    def __init__(self, session: Session, X: torch.Tensor, y: torch.Tensor, penalized: torch.Tensor,
                 memory: CurvatureMemory, tracker: LossTracker):
        self.s = session
        self.X = X
        self.y = y.to(X.device, torch.float64)
        self.penalized = penalized.to(X.device, torch.float64)
        self.w = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
        self.memory, self.tracker = memory, tracker
        self.averager = IterateAverager(session.plan.L)
        self.last_gradient = None

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        with self.s.clock("plain"):
            idx = torch.as_tensor(rows, device=self.X.device)
            Xb, yb = self.X[idx], self.y[idx]
            u = Xb @ self.w
            self.tracker.add_batch(float((LOG2 - 0.5 * yb * u + 0.125 * u * u).sum()), len(rows))
            g = Xb.T @ residual(u, yb) / len(rows) + self.s.l2 * self.penalized * self.w
            self.last_gradient = g
            p = self.memory.direction(g) if quasi_newton else g
            self.w = self.w - eta * p
            if not float(self.w.abs().max()) <= COEF_MAX:
                raise DivergenceError("a coefficient passed the cap: the model diverged; lower the learning rate")
            if self.s.plan.optimizer == "sqn":
                self.averager.add(self.w)

    def close_window(self, k: int) -> None:
        s_t = self.averager.close()
        if s_t is None:
            return
        with self.s.clock("plain"):
            rows_H = torch.as_tensor(self.s.batches.hessian_rows(k // self.s.plan.L), device=self.X.device)
            v = hessian_vector(self.X[rows_H], s_t, self.s.l2, self.penalized)
            self.memory.push(s_t, v)

    def end_epoch(self) -> dict:
        loss, stop, converged = self.tracker.end_epoch()
        return {"loss": loss, "stop": stop, "converged": converged}

    def prepare(self, batches, k: int) -> float:
        return 0.0


__all__ = ["LocalLearner"]
