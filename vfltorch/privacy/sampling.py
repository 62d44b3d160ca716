"""Mini-batch sampling from a secret generator.

Every party must process the same rows at each step, so the row indices of a
batch are no secret among the parties (each computes its part for them). They
must be secret from everyone else: amplification by subsampling - the reason a
small q buys a small epsilon - holds only for an observer who does not know
which rows each batch holds. The generator is therefore seeded from OS entropy
(``randomness.py``); in a federation the active party draws that seed and
sends it to the others (who would learn the batches anyway). A party that
knows the schedule gets no amplification: ``visits`` counts how often each
row was used, which bounds the privacy loss towards such a party.

* ``poisson``: every example joins each batch independently with
  probability q = L / N; T = round(epochs * N / L) steps. This is the
  sampling opacus' accountants (and DP-SGD's data loader) assume, and DP-SCD's
  sensitivity sqrt(2) C does not depend on the batch size, so it is the
  default for the DP variants.
* ``shuffle``: a fresh permutation every epoch, cut into lots of exactly L
  (the remainder N mod L is skipped that epoch); T = epochs * (N // L). The
  authors' code does this. seqDP-SCD needs it: its sensitivity grows with the
  batch size, which must therefore be fixed. Accounting it as a
  Poisson-subsampled mechanism with q = L / N (what the paper does) understates
  epsilon; ``solver.accounted`` claims no amplification for it instead.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data import VFLInputError
from .config import check_batch  # noqa: F401  (the library's)

SAMPLERS = ("poisson", "shuffle")


class BatchSampler:
    def __init__(self, n: int, L: int, epochs: float, *, kind: str = "poisson", rng: np.random.Generator):
        if kind not in SAMPLERS:
            raise VFLInputError(f"unknown sampling {kind!r}: choose poisson or shuffle")
        check_batch(L, n)
        if not epochs > 0:
            raise VFLInputError(f"epochs must be positive, got {epochs}")
        self.n, self.L, self.kind, self.epochs = int(n), int(L), kind, float(epochs)
        self.rng = rng
        self.visits = np.zeros(self.n, dtype=np.int64)
        self.start = 0                       # steps already done (a run resumed from a checkpoint)
        if kind == "poisson":
            self.steps_per_epoch = self.n / self.L
            self.steps = max(1, round(self.epochs * self.n / self.L))
        else:
            self.steps_per_epoch = self.n // self.L
            self.steps = max(1, round(self.epochs * self.steps_per_epoch))

    @property
    def sample_rate(self) -> float:
        """q = L / N: the probability that a given example is in a given batch."""
        return self.L / self.n

    def epoch_ends(self) -> list[int]:
        """Step counts after which an epoch (N examples in expectation) is complete."""
        whole = int(self.epochs)
        ends = [round(k * self.steps_per_epoch) for k in range(1, whole + 1)]
        if not ends or ends[-1] != self.steps:
            ends.append(self.steps)
        return [e for e in ends if 0 < e <= self.steps]

    def resume(self, done: int, rng_state: dict, visits: np.ndarray) -> None:
        """Go on after ``done`` steps from a checkpoint: the generator's state then, and the visits so far.

        The generator state alone fixes every later batch, so the resumed schedule is the unbroken run's. A
        ``shuffle`` schedule resumes at an epoch end only (its permutation is drawn at the epoch's start)."""
        if not 0 <= done < self.steps:
            raise ValueError(f"cannot resume after step {done} of {self.steps}")
        if self.kind == "shuffle" and done % self.steps_per_epoch:
            raise ValueError(f"a shuffle schedule resumes at an epoch end, not after step {done}")
        self.rng.bit_generator.state = rng_state
        self.visits = np.asarray(visits, dtype=np.int64).copy()
        self.start = int(done)

    def __iter__(self):
        if self.kind == "poisson":
            q = self.sample_rate
            for _ in range(self.start, self.steps):
                batch = np.flatnonzero(self.rng.random(self.n) < q)
                self.visits[batch] += 1
                yield torch.from_numpy(batch)
            return
        done = self.start
        while done < self.steps:
            perm = self.rng.permutation(self.n)
            for k in range(self.steps_per_epoch):
                if done == self.steps:
                    return
                batch = perm[k * self.L:(k + 1) * self.L]
                self.visits[batch] += 1
                yield torch.from_numpy(batch)
                done += 1


class CoordinateSampler:
    """Primal DP-SCD (Algorithm 2): every step uses all N examples and L of the d coordinates.

    The coordinates are drawn without replacement (in the order they are updated) from the secret
    generator; one epoch is d / L steps (every coordinate once, in expectation). No example is
    subsampled, so the accountant gets sampling rate 1 (``solver.accounted``) and every example is
    "visited" at every step.
    """

    kind = "all-rows"

    def __init__(self, n: int, d: int, L: int, epochs: float, *, rng: np.random.Generator):
        if not isinstance(L, int) or isinstance(L, bool) or L < 1:
            raise VFLInputError(f"the number of coordinates per step L must be a positive integer, got {L!r}")
        if L > d:
            raise VFLInputError(f"primal DP-SCD updates L coordinates per step, but L={L} exceeds the {d} features: "
                                f"pass --L {d} or less")
        if not epochs > 0:
            raise VFLInputError(f"epochs must be positive, got {epochs}")
        self.n, self.d, self.L, self.epochs = int(n), int(d), int(L), float(epochs)
        self.rng = rng
        self.steps_per_epoch = self.d / self.L
        self.steps = max(1, round(self.epochs * self.steps_per_epoch))
        self.visits = np.zeros(self.n, dtype=np.int64)

    start = 0                                # the primal variants are not resumed (``solver.fit_glm``)
    sample_rate = 1.0
    epoch_ends = BatchSampler.epoch_ends

    def __iter__(self):
        for _ in range(self.steps):
            self.visits += 1
            yield torch.from_numpy(self.rng.choice(self.d, self.L, replace=False))
