"""The training loss per epoch and the stopping rule (Yang et al.: loss change < 1e-5 between epochs).

The loss of an epoch is the average Taylor loss of its mini-batches, each
evaluated at the model *before* that batch's update and weighted by its rows
(so it is sum_i l_i / n over the epoch's n rows), as FATE reports it. It costs
nothing extra: the batch losses come out of the gradient rounds. Training
stops after epoch e when |loss_e - loss_{e-1}| < tol, or after ``max_epochs``.
The penalty (lambda/2) ||w||^2 is not part of the reported loss.
"""

from __future__ import annotations

import math


class LossTracker:
    def __init__(self, tol: float, max_epochs: int):
        self.tol, self.max_epochs = float(tol), int(max_epochs)
        self.history: list[float] = []
        self._sum, self._rows = 0.0, 0

    def add_batch(self, loss_sum: float, rows: int) -> None:
        """Record a mini-batch: the sum of its rows' losses."""
        if not math.isfinite(loss_sum):
            raise FloatingPointError("the training loss is not finite: the model diverged; lower the learning rate")
        self._sum += loss_sum
        self._rows += rows

    def end_epoch(self) -> tuple[float, bool, bool]:
        """(epoch loss, stop, converged)."""
        loss = self._sum / max(self._rows, 1)
        self._sum, self._rows = 0.0, 0
        converged = bool(self.history) and abs(loss - self.history[-1]) < self.tol
        self.history.append(loss)
        return loss, converged or len(self.history) >= self.max_epochs, converged


__all__ = ["LossTracker"]
