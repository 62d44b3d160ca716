"""DP-SCD's hyperparameters and their checks, free of torch and opacus.

The launching process (``vfl dpscd`` / ``vfl dpsgd``) checks the options with these before any party
starts and without importing torch, so a mistake is answered at once; the parties run the very same
``validate``. The names here are the library's: glm, accountant, vertical and solver import them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..data.validation import VFLInputError

TASKS = ("logistic", "ridge", "svm")                       # the GLMs of glm.py
VARIANTS = ("dual", "seq", "primal", "primal-rows", "nonprivate")
PRIVATE = ("dual", "seq", "primal", "primal-rows")
MECHANISMS = ("rdp", "prv", "gdp")                         # opacus accountants (accountant.py)
DEFAULT_MECHANISM = "prv"
PROTOCOLS = ("encrypted", "shared", "paper")               # vertical protocols (vertical.py, shared_updates.py)


def check_task(task: str) -> None:
    if task not in TASKS:
        raise VFLInputError(f"unknown task {task!r}: choose ridge (regression), logistic or svm (binary labels -1/+1)")


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise VFLInputError(f"unknown accountant {mechanism!r}: choose one of {', '.join(MECHANISMS)} "
                            f"(prv is the default and the tightest; rdp is the classic bound)")
    return mechanism


def check_budget(epsilon: float, delta: float) -> None:
    """(epsilon, delta) must be a meaningful DP budget."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise VFLInputError(f"epsilon must be a positive number, got {epsilon!r}: pass e.g. --epsilon 1 "
                            f"(smaller is more private; the paper uses 0.1 to 2)")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise VFLInputError(f"delta must lie strictly between 0 and 1, got {delta!r}: pass e.g. --delta 1e-3 "
                            f"(the paper's value; take delta well below 1 / N)")


def check_batch(L, n: int) -> None:
    if not isinstance(L, int) or isinstance(L, bool) or L < 1:
        raise VFLInputError(f"the mini-batch size L must be a positive integer, got {L!r}")
    if L > n:
        raise VFLInputError(f"the mini-batch size L={L} exceeds the {n} training rows: pass --L {n} or less "
                            f"(the paper uses L well below N, e.g. 100 to 1000)")


def check_vertical(cfg: "DPSCDConfig", num_parties: int) -> None:
    """Across parties, the label-safe protocols (shared, encrypted) exist for DP-SCD (the dual variant) only."""
    if num_parties > 1 and cfg.protocol in ("encrypted", "shared") and cfg.variant != "dual":
        raise VFLInputError(f"--variant {cfg.variant} across parties sends every coordinate step to the passive "
                            f"parties in the clear (and so the labels); only DP-SCD (--variant dual) has the "
                            f"label-safe protocols (shared, the default, and encrypted). Use --variant dual, or "
                            f"--vertical-protocol paper to accept the leak.")


def check_primal_parties(num_parties: int) -> None:
    if num_parties > 1:
        raise VFLInputError(
            "primal DP-SCD cannot run across parties: each coordinate step would show the active party "
            "a scaled slice of another party's raw column. Use --variant dual (DP-SCD, the paper's method), "
            "or --parties 1 for the centralised primal baseline.")


@dataclass
class DPSCDConfig:
    """Hyperparameters of a run (the paper's notation: L mini-batch size, C clipping bound, lambda = ``lam``)."""

    task: str = "logistic"           # ridge | logistic | svm
    variant: str = "dual"            # dual | seq | primal | nonprivate
    epsilon: float = 1.0
    delta: float = 1e-3
    L: int = 100
    C: float = 1.0
    lam: float = 1e-4
    epochs: float = 10
    accountant: str = DEFAULT_MECHANISM   # prv (default) | rdp | gdp (opacus)
    sampling: str | None = None      # poisson | shuffle; None: poisson for dual/primal, shuffle for seq/nonprivate
    newton_steps: int = 1            # logistic only
    sigma: float | None = None       # a given noise multiplier instead of calibrating to (epsilon, delta)
    protocol: str = "shared"         # vertical runs: shared (default: a dealer, shared_updates.py) | encrypted
                                     # (Paillier, no dealer, 40-150x slower) | paper (leaks labels, vertical.py)
    key_bits: int = 2048             # the active party's Paillier key (encrypted protocol)
    insecure_key: bool = False       # allow keys under 1024 bits (tests only)

    @property
    def private(self) -> bool:
        return self.variant in PRIVATE

    def resolved_sampling(self) -> str:
        if self.variant == "primal":
            return "all-rows"            # Algorithm 2 uses every example at every step
        if self.sampling is not None:
            return self.sampling
        return "poisson" if self.variant in ("dual", "primal-rows") else "shuffle"

    def as_dict(self) -> dict:
        return asdict(self)


def validate(cfg: DPSCDConfig) -> None:
    """Every bad hyperparameter is named with its fix; checked identically at every party."""
    if cfg.variant not in VARIANTS:
        raise VFLInputError(f"unknown variant {cfg.variant!r}: choose dual (DP-SCD), seq (seqDP-SCD), "
                            f"primal (primal DP-SCD, Algorithm 2), primal-rows (row-batch primal) or nonprivate (SCD)")
    check_task(cfg.task)
    if cfg.private:
        if cfg.sigma is None:
            check_budget(cfg.epsilon, cfg.delta)
        elif not (math.isfinite(cfg.sigma) and cfg.sigma >= 0):
            raise VFLInputError(f"a given noise multiplier sigma must be >= 0, got {cfg.sigma}")
        if not (isinstance(cfg.C, (int, float)) and math.isfinite(cfg.C) and cfg.C > 0):
            raise VFLInputError(f"the clipping bound C must be a positive number, got {cfg.C!r}: pass e.g. --C 1 "
                                f"(each coordinate step is clipped to [-C, C]; tune it, the paper tries 1e-3 .. 10)")
        check_mechanism(cfg.accountant)
    elif not (isinstance(cfg.C, (int, float)) and cfg.C > 0):
        raise VFLInputError(f"the clipping bound C must be positive (or inf for no clipping), got {cfg.C!r}")
    if not (isinstance(cfg.lam, (int, float)) and math.isfinite(cfg.lam) and cfg.lam > 0):
        raise VFLInputError(f"the regularisation lambda must be positive, got {cfg.lam!r}: pass e.g. --lambda 1e-4")
    if not (isinstance(cfg.epochs, (int, float)) and math.isfinite(cfg.epochs) and cfg.epochs > 0):
        raise VFLInputError(f"epochs must be positive, got {cfg.epochs!r}")
    if not isinstance(cfg.L, int) or isinstance(cfg.L, bool) or cfg.L < 1:
        raise VFLInputError(f"the mini-batch size L must be a positive integer, got {cfg.L!r}")
    if cfg.resolved_sampling() not in ("poisson", "shuffle", "all-rows"):
        raise VFLInputError(f"unknown sampling {cfg.sampling!r}: choose poisson or shuffle")
    if cfg.variant == "seq" and cfg.resolved_sampling() != "shuffle":
        raise VFLInputError("seqDP-SCD needs fixed-size lots (--sampling shuffle): its sensitivity "
                            "2 C sqrt(L (L + 1)) holds for lots of exactly L examples")
    if cfg.protocol not in PROTOCOLS:
        raise VFLInputError(f"unknown vertical protocol {cfg.protocol!r}: choose shared (the default: passive "
                            f"parties see only noisy updates; a dealer deals correlated randomness), encrypted (the "
                            f"same with Paillier and no dealer) or paper (the paper's, which leaks labels)")
    if not isinstance(cfg.newton_steps, int) or cfg.newton_steps < 1:
        raise VFLInputError(f"newton_steps must be a positive integer, got {cfg.newton_steps!r}")
