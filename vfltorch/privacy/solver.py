"""One entry point for every SCD variant, at one party of a federation (Q = 1: the centralised run).

``fit_glm(fed, X, y, config)`` runs in every party process with that party's
columns ``X`` (and the labels ``y`` at the active party only):

1. checks the configuration and the data (row norms <= 1 for the DP variants:
   the sensitivity bounds assume it),
2. draws the batch schedule (``sampling.py``) and calibrates the noise
   multiplier sigma for (epsilon, delta) after T steps at rate q = L / N
   (``accountant.py``); the noise standard deviation is sigma times the
   variant's sensitivity S (next to each algorithm),
3. runs the variant - ``dual`` (DP-SCD, Algorithm 1), ``seq`` (seqDP-SCD,
   Algorithm 3), ``primal`` (Algorithm 2), ``nonprivate`` (SCD) - and, after
   each epoch, the primal objective and the epsilon spent so far (opacus).

Every party computes sigma itself from public quantities (epsilon, delta, N,
L, epochs): the parties agree without a message.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from ..comm import Federation
from ..data import VFLInputError, federated_row_norms
from . import dpscd, primal, seqdpscd
from .accountant import PrivacyAccountant, calibrate_sigma, check_budget, check_mechanism
from .glm import make_glm, primal_objective
from .noise import BlockNoise, NoiseStream
from .sampling import BatchSampler, check_batch
from .vertical import ActiveLink

VARIANTS = ("dual", "seq", "primal", "nonprivate")
PRIVATE = ("dual", "seq", "primal")
_TRAINERS = {"dual": dpscd, "seq": seqdpscd, "primal": primal, "nonprivate": seqdpscd}
_STEPS = {"dual": dpscd.dual_steps, "seq": seqdpscd.seq_steps, "primal": primal.primal_steps,
          "nonprivate": seqdpscd.seq_steps}
ROW_NORM_SLACK = 1e-6


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
    accountant: str = "rdp"          # rdp | prv | gdp (opacus)
    sampling: str | None = None      # poisson | shuffle; None: poisson for dual/primal, shuffle for seq/nonprivate
    newton_steps: int = 1            # logistic only
    sigma: float | None = None       # a given noise multiplier instead of calibrating to (epsilon, delta)

    @property
    def private(self) -> bool:
        return self.variant in PRIVATE

    def resolved_sampling(self) -> str:
        if self.sampling is not None:
            return self.sampling
        return "poisson" if self.variant in ("dual", "primal") else "shuffle"

    def as_dict(self) -> dict:
        return asdict(self)


def validate(cfg: DPSCDConfig) -> None:
    """Every bad hyperparameter is named with its fix; checked identically at every party."""
    if cfg.variant not in VARIANTS:
        raise VFLInputError(f"unknown variant {cfg.variant!r}: choose dual (DP-SCD), seq (seqDP-SCD), "
                            f"primal (primal DP-SCD) or nonprivate (SCD)")
    make_glm(cfg.task)
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
    if cfg.resolved_sampling() not in ("poisson", "shuffle"):
        raise VFLInputError(f"unknown sampling {cfg.sampling!r}: choose poisson or shuffle")
    if cfg.variant == "seq" and cfg.resolved_sampling() != "shuffle":
        raise VFLInputError("seqDP-SCD needs fixed-size lots (--sampling shuffle): its sensitivity "
                            "2 C sqrt(L (L + 1)) holds for lots of exactly L examples")
    if not isinstance(cfg.newton_steps, int) or cfg.newton_steps < 1:
        raise VFLInputError(f"newton_steps must be a positive integer, got {cfg.newton_steps!r}")


def sensitivity(cfg: DPSCDConfig, d: int) -> float:
    """The L2 sensitivity S of one step of ``cfg.variant`` (each constant lives with its algorithm)."""
    if cfg.variant == "dual":
        return dpscd.sensitivity(cfg.C)
    if cfg.variant == "seq":
        return seqdpscd.sensitivity(cfg.C, cfg.L)
    if cfg.variant == "primal":
        return primal.sensitivity(cfg.C, d)
    return 0.0


@dataclass
class State:
    v: torch.Tensor                 # this party's block of v (dual variants) or of theta (primal)
    alpha: torch.Tensor | None      # the dual variables, at the active party


@dataclass
class Context:
    """What a variant's step generator needs at this party."""

    fed: Federation
    link: ActiveLink
    X: torch.Tensor
    y: torch.Tensor | None
    sqnorms: torch.Tensor
    glm: object
    sampler: BatchSampler
    state: State
    n: int
    L: int
    C: float
    lam: float
    seed: int
    noise_std: float
    alpha_stream: NoiseStream | None
    v_streams: BlockNoise | None

    def alpha_noise(self, count: int) -> torch.Tensor | float:
        if self.noise_std == 0 or self.alpha_stream is None:
            return 0.0
        return self.alpha_stream.normal(count, self.noise_std, device=self.X.device, dtype=self.X.dtype)

    def v_noise(self) -> torch.Tensor | float:
        if self.noise_std == 0 or self.v_streams is None:
            return 0.0
        return self.v_streams.normal(self.noise_std, device=self.X.device, dtype=self.X.dtype)


@dataclass
class FitResult:
    """The outcome at one party. ``theta`` is this party's block of the model; ``alpha`` only at the active party."""

    theta: torch.Tensor
    v: torch.Tensor
    alpha: torch.Tensor | None
    sigma: float
    sensitivity: float
    noise_std: float
    sample_rate: float
    steps: int
    epsilon: float | None           # spent, as opacus computes it (None for the non-private variant)
    delta: float | None
    sampling: str
    train_seconds: float
    history: list = field(default_factory=list)   # per epoch: epoch, step, objective, epsilon (active party)


def row_sqnorms(fed: Federation, X: torch.Tensor) -> torch.Tensor:
    """||x_j||^2 over all parties' columns, at every party (a masked sum when there are several)."""
    if fed.num_parties == 1:
        return (X.to(torch.float64) ** 2).sum(dim=1).to(X.dtype)
    with fed.phase("dpscd/row-norms"):
        return (federated_row_norms(fed, X) ** 2).to(X.dtype)


def check_row_norms(sqnorms: torch.Tensor) -> None:
    peak = float(sqnorms.max().sqrt()) if sqnorms.numel() else 0.0
    if peak > 1.0 + ROW_NORM_SLACK:
        worst = int(torch.argmax(sqnorms))
        raise VFLInputError(
            f"DP-SCD's privacy guarantee needs every training row to have L2 norm at most 1 (the sensitivity "
            f"bounds, Lemma 1), but row {worst} has norm {peak:.4g}. Normalise the rows: pass --normalize-rows "
            f"(with --scale maxabs first, the paper's preprocessing), or normalize_rows=True to the estimator.")


def fit_glm(fed: Federation, X: torch.Tensor, y: torch.Tensor | None, cfg: DPSCDConfig, *, seed: int = 0,
            noise_seed: int | None = None, noise_blocks=None, secure: bool = False, monitor_every: int = 1,
            on_epoch=None, on_step=None, progress=None) -> FitResult:
    """Train ``cfg.variant`` on this party's columns; every party of ``fed`` calls it (SPMD).

    ``noise_seed`` (None: fresh OS entropy) seeds the private noise streams;
    ``noise_blocks`` (a list of column-index arrays, centralised runs only)
    splits the columns into the blocks of a federation so that a centralised
    run reproduces a federated one draw for draw. ``on_epoch(record)`` gets
    {epoch, step, objective, epsilon} at the active party after each
    monitored epoch; ``on_step(t, batch, zeta, state)`` is called after each
    step at every party (tests use it); ``progress`` is a tqdm-like bar.
    """
    validate(cfg)
    glm = make_glm(cfg.task, newton_steps=cfg.newton_steps) if cfg.task == "logistic" else make_glm(cfg.task)
    n, d = X.shape
    check_batch(cfg.L, n)
    if fed.is_active:
        _check_labels(glm, y, n)
    if cfg.variant == "primal":
        primal.check_centralised(fed)
    if noise_blocks is not None and fed.num_parties > 1:
        raise ValueError("noise_blocks is for centralised runs; in a federation each party's block is its columns")

    link = ActiveLink(fed, secure=secure)
    sqnorms = row_sqnorms(fed, X)
    if cfg.private:
        check_row_norms(sqnorms)

    sampler = BatchSampler(n, cfg.L, cfg.epochs, kind=cfg.resolved_sampling(), seed=seed)
    q, steps = sampler.sample_rate, sampler.steps
    if cfg.private:
        sigma = float(cfg.sigma) if cfg.sigma is not None else calibrate_sigma(
            float(cfg.epsilon), float(cfg.delta), q, steps, cfg.accountant)
        S = sensitivity(cfg, d)
        noise_std = sigma * S
        C = float(cfg.C)
    else:
        sigma, S, noise_std, C = 0.0, 0.0, 0.0, float(cfg.C)

    party = fed.parties.index(fed.rank)
    blocks = [(party, torch.arange(d))] if noise_blocks is None else \
        [(b, torch.as_tensor(cols, dtype=torch.long)) for b, cols in enumerate(noise_blocks)]
    private_noise = noise_std > 0
    state = State(v=X.new_zeros(d), alpha=X.new_zeros(n) if fed.is_active else None)
    ctx = Context(fed=fed, link=link, X=X, y=y, sqnorms=sqnorms, glm=glm, sampler=sampler, state=state, n=n,
                  L=cfg.L, C=C, lam=float(cfg.lam), seed=seed, noise_std=noise_std,
                  alpha_stream=NoiseStream(noise_seed, "alpha") if (private_noise and fed.is_active) else None,
                  v_streams=BlockNoise(noise_seed, blocks, d) if private_noise else None)

    accountant = PrivacyAccountant(cfg.accountant) if cfg.private else None
    ends = set(sampler.epoch_ends()) if monitor_every else set()
    epoch_of = {e: k + 1 for k, e in enumerate(sampler.epoch_ends())}
    history = []
    train_seconds = 0.0
    started = time.perf_counter()
    model_block = _TRAINERS[cfg.variant].model_block
    for t, batch, zeta in _STEPS[cfg.variant](ctx):
        if accountant is not None:
            accountant.step(sigma, q)
        if on_step is not None:
            on_step(t, batch, zeta, state)
        if progress is not None:
            progress.update(1)
        done = t + 1
        if done in ends and (epoch_of[done] % monitor_every == 0 or done == steps):
            train_seconds += time.perf_counter() - started
            objective = monitor_objective(fed, link, X, y, glm, model_block(ctx), cfg.lam)
            if fed.is_active:
                record = {"epoch": epoch_of[done], "step": done, "objective": objective,
                          "epsilon": accountant.epsilon(cfg.delta) if accountant is not None else None}
                history.append(record)
                if on_epoch is not None:
                    on_epoch(record)
            started = time.perf_counter()
    train_seconds += time.perf_counter() - started
    return FitResult(theta=model_block(ctx), v=state.v, alpha=state.alpha, sigma=sigma, sensitivity=S,
                     noise_std=noise_std, sample_rate=q, steps=steps,
                     epsilon=accountant.epsilon(cfg.delta) if accountant is not None else None,
                     delta=float(cfg.delta) if cfg.private else None, sampling=sampler.kind,
                     train_seconds=train_seconds, history=history)


def monitor_objective(fed, link, X, y, glm, theta_block, lam) -> float | None:
    """The primal objective P(theta) at the active party (margins of all rows and ||theta||^2 summed up the tree).

    For monitoring only: it is computed on the training data and is not itself differentially private.
    """
    with fed.phase("dpscd/monitor"):
        margins = link.sum_at_active(X @ theta_block)
        sq = link.sum_at_active((theta_block.to(torch.float64) ** 2).sum().reshape(1))
    if not fed.is_active:
        return None
    return primal_objective(glm, margins, y, float(sq[0]), lam)


def _check_labels(glm, y, n) -> None:
    if y is None:
        raise VFLInputError("the active party has no labels: DP-SCD is supervised (ridge, logistic, svm)")
    if y.shape[0] != n:
        raise VFLInputError(f"{y.shape[0]} labels for {n} training rows")
    if glm.kind == "binary":
        values = set(torch.unique(y).tolist())
        if not values <= {-1.0, 1.0}:
            raise VFLInputError(f"task {glm.name} needs binary labels -1 / +1, got {sorted(values)[:6]}: use a "
                                f"binary dataset (or --task ridge for a regression target)")
