"""Per-phase wall time of one party: where an encrypted epoch spends its seconds.

Phases used by the protocol: ``offline`` (obfuscators made ahead of need),
``encrypt`` (online encryption), ``he`` (homomorphic arithmetic: [[d]]^T X,
sums, products), ``decrypt`` (the coordinator), ``send`` (re-randomisation,
serialisation and sending), ``recv`` (waiting for and reading messages),
``plain`` (local tensor work: margins, updates, L-BFGS).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict


class Stopwatch:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - started

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in sorted(self.seconds.items())}


__all__ = ["Stopwatch"]
