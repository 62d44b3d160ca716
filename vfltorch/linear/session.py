"""What every role of one training run shares: the federation, the scheme, the public schedule.

Roles (``vfltorch.comm`` ranks):

* the guest B = the active party (rank ``fed.active``, 0): features and labels;
* the hosts A = the other data parties (Q - 1 of them, Q = 2 in the paper):
  features only, in rank order - they form the chain of ``host.py``;
* the coordinator C = ``fed.coordinator`` (the last rank): the Paillier
  private key, no data.

Communication phases (the meter counts bytes per phase; ``TRAIN_PHASES`` are
the ones that make up "bytes per epoch").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .batches import BatchPlan
from .bounds import PublicBounds
from .masks import MaskSource
from .optimizers import IterationPlan, StepSize
from .timing import Stopwatch

PHASE_SETUP = "hetero-lr/setup"
PHASE_MARGINS = "hetero-lr/margins"
PHASE_GRADIENT = "hetero-lr/gradient"
PHASE_LOSS = "hetero-lr/loss"
PHASE_CURVATURE = "hetero-lr/curvature"
PHASE_EPOCH = "hetero-lr/epoch"
PHASE_MONITOR = "hetero-lr/monitor"
PHASE_REPORT = "hetero-lr/report"
PHASE_PREDICT = "hetero-lr/predict"
PHASE_SCALE = "hetero-lr/scale"         # the raw-scale intercept of standardize=True (standardize.py)
TRAIN_PHASES = (PHASE_MARGINS, PHASE_GRADIENT, PHASE_LOSS, PHASE_CURVATURE, PHASE_EPOCH)


@dataclass
class Session:
    fed: object
    scheme: object                  # PaillierScheme or PlaintextScheme
    bounds: PublicBounds
    batches: BatchPlan
    plan: IterationPlan
    step: StepSize
    masks: MaskSource
    l2: float
    feature_frac_bits: int
    n_features: list                # columns per data party, in party order (the guest's with its intercept)
    clock: Stopwatch = field(default_factory=Stopwatch)

    @property
    def guest(self) -> int:
        return self.fed.active

    @property
    def hosts(self) -> list[int]:
        return [r for r in self.fed.parties if r != self.fed.active]

    @property
    def coordinator(self) -> int:
        return self.fed.coordinator

    @property
    def data_parties(self) -> list[int]:
        """The guest first, then the hosts: the order of the blocks of w at the coordinator."""
        return [self.guest] + self.hosts


__all__ = ["PHASE_CURVATURE", "PHASE_EPOCH", "PHASE_GRADIENT", "PHASE_LOSS", "PHASE_MARGINS", "PHASE_MONITOR",
           "PHASE_PREDICT", "PHASE_REPORT", "PHASE_SETUP", "Session", "TRAIN_PHASES"]
