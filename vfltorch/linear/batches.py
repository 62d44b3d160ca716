"""Mini-batches and Hessian sub-samples from a public seed.

The rows are aligned across parties, and which rows form a mini-batch is not
secret (every party must use the same ones). So every party draws the same
permutation from ``(seed, epoch)`` and the same Hessian sub-sample S_H from
``(seed, t)`` without talking. The last mini-batch of an epoch holds the
remainder when the batch size does not divide n.
"""

from __future__ import annotations

import numpy as np

_HESSIAN_STREAM = 7_919


def batch_too_large(batch_size: int | None, n: int) -> str | None:
    """Why an explicit ``batch_size`` cannot run on ``n`` training rows, or None (None: min(default, n))."""
    if batch_size is not None and batch_size > n:
        return f"batch_size={batch_size} is larger than the training set ({n} rows): use at most {n}"
    return None


class BatchPlan:
    def __init__(self, n: int, batch_size: int, hessian_batch: int, seed: int):
        self.n, self.batch_size, self.hessian_batch, self.seed = int(n), int(batch_size), int(hessian_batch), int(seed)

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.n // self.batch_size)

    def epoch(self, e: int) -> list[np.ndarray]:
        """The row indices of each mini-batch of epoch e (a fresh permutation each epoch)."""
        perm = np.random.default_rng([self.seed, e]).permutation(self.n)
        return [perm[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)]

    def hessian_rows(self, t: int) -> np.ndarray:
        """S_H for curvature pair t: ``hessian_batch`` rows drawn without replacement."""
        rng = np.random.default_rng([self.seed, _HESSIAN_STREAM, t])
        return np.sort(rng.choice(self.n, size=min(self.hessian_batch, self.n), replace=False))


__all__ = ["BatchPlan"]
