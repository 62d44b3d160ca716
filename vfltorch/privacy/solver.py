"""One entry point for every SCD variant, at one party of a federation (Q = 1: the centralised run).

``fit_glm(fed, X, y, config)`` runs in every party process with that party's
columns ``X`` (and the labels ``y`` at the active party only). Across parties the default vertical protocol
(``shared``) needs the federation's coordinator, the dealer: it calls ``fit_glm(fed, None, None, config)`` too
and gets None (``launch(..., coordinator=True)``; ``protocol="encrypted"`` runs without one, on Paillier):

1. checks the configuration and the data (row norms <= 1 for the DP variants:
   the sensitivity bounds assume it),
2. draws the batch schedule (``sampling.py``) and calibrates the noise
   multiplier sigma for (epsilon, delta) after T steps at rate q = L / N
   (``accountant.py``); the noise standard deviation is sigma times the
   variant's sensitivity S (next to each algorithm),
3. runs the variant - ``dual`` (DP-SCD, Algorithm 1), ``seq`` (seqDP-SCD,
   Algorithm 3), ``primal`` (Algorithm 2), ``primal-rows`` (a row-batch primal
   variant), ``nonprivate`` (SCD) - and, after each epoch, the epsilon spent so
   far (opacus; the training objective only when asked for: it is not private).

Every party computes sigma itself from public quantities (epsilon, delta, N,
L, epochs): the parties agree without a message.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..comm import Federation
from ..data import VFLInputError, federated_row_norms
from . import dpscd, primal, seqdpscd
from .accountant import calibrate_sigma, epsilon_spent
from .config import VARIANTS, DPSCDConfig, check_batch, check_vertical, validate  # noqa: F401  (VARIANTS: re-exported)
from .glm import make_glm, primal_objective
from .noise import BlockNoise, NoiseStream
from .randomness import VOID_NOTE, Randomness, numpy_from_seed128
from .sampling import BatchSampler, CoordinateSampler
from .vertical import PAPER_LEAK, ActiveLink, EncryptedUpdates

_TRAINERS = {"dual": dpscd, "seq": seqdpscd, "primal": primal, "primal-rows": primal, "nonprivate": seqdpscd}
_STEPS = {"dual": dpscd.dual_steps, "seq": seqdpscd.seq_steps, "primal": primal.primal_steps,
          "primal-rows": primal.row_primal_steps, "nonprivate": seqdpscd.seq_steps}
ROW_NORM_SLACK = 1e-6


def sensitivity(cfg: DPSCDConfig, d: int) -> float:
    """The L2 sensitivity S of one step of ``cfg.variant`` (each constant lives with its algorithm)."""
    if cfg.variant == "dual":
        # Poisson batches: add/remove one example (Lemma 1). Fixed-size lots: replace one, twice the step change.
        return dpscd.sensitivity(cfg.C) * (1.0 if cfg.resolved_sampling() == "poisson" else 2.0)
    if cfg.variant == "seq":
        return seqdpscd.sensitivity(cfg.C, cfg.L)
    if cfg.variant == "primal":
        return primal.sensitivity(cfg.C, cfg.L)
    if cfg.variant == "primal-rows":
        return primal.rows_sensitivity(cfg.C, d)
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
    randomness: Randomness
    noise_std: float
    alpha_stream: NoiseStream | None
    v_streams: BlockNoise | None
    encrypted: EncryptedUpdates | None = None

    def alpha_noise(self, count: int) -> torch.Tensor | float:
        if self.noise_std == 0 or self.alpha_stream is None:
            return 0.0
        return self.alpha_stream.normal(count, self.noise_std, device=self.X.device, dtype=self.X.dtype)

    def v_noise(self) -> torch.Tensor | float:
        if self.noise_std == 0 or self.v_streams is None:
            return 0.0
        return self.v_streams.normal(self.noise_std, device=self.X.device, dtype=self.X.dtype)

    def apply_steps(self, XB: torch.Tensor, zeta: torch.Tensor | None, rows: torch.Tensor | None = None
                    ) -> torch.Tensor | None:
        """v_l += X_{l,B}^T zeta_B + noise at every party; returns zeta_B as this party knows it (None: not at all).

        ``zeta`` is the active party's clipped steps (None elsewhere); ``rows`` the batch. One party: local.
        Federation, protocol ``paper``: zeta_B goes down the tree in the clear. Protocol ``encrypted``:
        ``EncryptedUpdates``; ``shared``: ``shared_updates.SharedUpdates`` (a dealer instead of Paillier).
        """
        st = self.state
        if self.encrypted is not None:
            if self.fed.is_active:
                self.encrypted.update(XB, zeta, self.C, self.noise_std, rows=rows)
                st.v += XB.T @ zeta if XB.shape[0] else 0.0
                st.v += self.v_noise()
                return zeta
            st.v += self.encrypted.update(XB, None, self.C, self.noise_std, rows=rows)
            return None
        b = XB.shape[0]
        if b:
            with self.fed.phase("dpscd/steps"):
                zeta = self.link.from_active(zeta, (b,), XB.dtype)
            st.v += XB.T @ zeta
        else:
            # An empty Poisson batch: no update, but the released state still gets its noise.
            zeta = XB.new_zeros(0)
        st.v += self.v_noise()
        return zeta


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
    epsilon: float | None           # towards an outsider who sees the released model (None for non-private)
    delta: float | None
    sampling: str
    train_seconds: float
    history: list = field(default_factory=list)   # per epoch: epoch, step, epsilon (+ objective if asked for)
    observers: dict | None = None   # epsilon per observer (``observer_epsilons``), at the active party
    randomness: str = ""            # where the secret randomness came from
    simulated: bool = False         # seeded secrets: the guarantee is void
    checkpoints: object = None      # ``checkpoint.Checkpoints`` of the run (``finish()`` once the model is kept)
    resumed_from: int = 0           # the step a checkpoint resumed the run after (0: from the start)


def accounted(cfg: DPSCDConfig, sampler: BatchSampler, done: int) -> tuple[float, int]:
    """(sampling rate, compositions) the accountant sees after ``done`` steps.

    Poisson batches: q = L / N per step, amplification by subsampling. Fixed-size lots (shuffle,
    seqDP-SCD): opacus' analyses are for Poisson sampling only, so no amplification is claimed:
    each example is in one lot per epoch, i.e. ceil(done / lots per epoch) compositions of a
    Gaussian mechanism at rate 1 (with the replace-one sensitivity). A valid, loose bound.
    """
    if sampler.kind == "poisson":
        return sampler.sample_rate, done
    if sampler.kind == "all-rows":        # primal DP-SCD: every example in every step
        return 1.0, done
    return 1.0, math.ceil(done / sampler.steps_per_epoch)


def observer_epsilons(cfg: DPSCDConfig, fed: Federation, sampler: BatchSampler, sigma: float, outsider: float
                      ) -> dict:
    """epsilon for each observer of the run, with what it knows."""
    delta = float(cfg.delta)
    # A party that knows the batch schedule: each example's privacy loss is that of its own visits, no
    # amplification; the busiest example bounds it (the schedule does not depend on the data).
    visits = int(sampler.visits.max()) if sampler.visits.size else 0
    known = epsilon_spent(sigma, 1.0, visits, delta, cfg.accountant) if visits else 0.0
    out = {"outsider": {"epsilon": outsider, "sees": "the released model, not the batch schedule"}}
    if fed.num_parties > 1:
        if cfg.protocol == "paper" or not cfg.private:
            passive = {"epsilon": math.inf, "sees": "the noise-free clipped steps zeta_B (protocol 'paper'): "
                                                    "no guarantee; labels leak"}
        else:
            passive = {"epsilon": known, "sees": f"the batch schedule and noisy updates of its block (no "
                                                 f"amplification; the busiest row was used {visits} times)"}
        out["passive_party"] = passive
        out["active_party"] = {"epsilon": None, "sees": "the labels and the noise it draws: DP is not towards it"}
    else:
        out["schedule_aware"] = {"epsilon": known, "sees": f"the batch schedule and every iterate (no "
                                                           f"amplification; the busiest row was used {visits} times)"}
    return out


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
            f"(with --scale maxabs first, the paper's preprocessing), or keep normalize_rows=True (the estimators' "
            f"default, which divides each row by its norm) instead of normalize_rows=False.")


def fit_glm(fed: Federation, X: torch.Tensor, y: torch.Tensor | None, cfg: DPSCDConfig, *,
            simulation_seed: int | None = None, noise_blocks=None, secure: bool = False,
            monitor_objective: bool = False, monitor_every: int = 1, on_epoch=None, on_step=None,
            progress=None, checkpoint_dir=None) -> FitResult:
    """Train ``cfg.variant`` on this party's columns; every party of ``fed`` calls it (SPMD).

    The batch schedule and the noise come from OS entropy; ``simulation_seed`` seeds them instead
    (reproducible, and the DP guarantee is void: the result says so). ``noise_blocks`` (a list of
    column-index arrays, centralised runs only) splits the columns into the blocks of a federation
    so that a centralised simulation reproduces a federated one draw for draw. ``on_epoch(record)``
    gets {epoch, step, epsilon} at the active party after each monitored epoch, plus the training
    objective when ``monitor_objective`` (computed from the data: not private, off by default);
    ``on_step(t, batch, zeta, state)`` is called after each step at every party (tests use it;
    ``zeta`` is None where the party does not know it); ``progress`` is a tqdm-like bar.

    ``checkpoint_dir`` (this party's folder; ``vfltorch.checkpoint``): after every epoch but the last each party
    saves its state there - its block of v, alpha at the active party, and the generator states of the schedule and
    of the noise - and a run started again with the same settings and data goes on after the newest epoch every
    party saved. The resumed steps draw the batches and the noise the unbroken run would have drawn, so the model
    is the unbroken run's (bit for bit on the same devices) and nothing is released twice with fresh noise: the
    privacy accounting is the unbroken run's. The caller calls ``result.checkpoints.finish()`` once the model is
    kept (the checkpoints hold the noise's generator states: whoever reads them can remove the noise).
    """
    validate(cfg)
    if fed.is_coordinator:
        # The dealer of the shared vertical protocol: no data, no model; it follows the schedule and deals.
        from .shared_updates import deal

        deal(fed)
        return None
    glm = make_glm(cfg.task, newton_steps=cfg.newton_steps) if cfg.task == "logistic" else make_glm(cfg.task)
    n, d = X.shape
    if cfg.variant != "primal":
        check_batch(cfg.L, n)
    if fed.is_active:
        _check_labels(glm, y, n)
    if cfg.variant in ("primal", "primal-rows"):
        primal.check_centralised(fed)
    if cfg.variant == "primal" and cfg.private:
        primal.check_columns(X)
    if noise_blocks is not None and fed.num_parties > 1:
        raise ValueError("noise_blocks is for centralised runs; in a federation each party's block is its columns")
    federated = fed.num_parties > 1
    encrypted = federated and cfg.protocol in ("encrypted", "shared")
    check_vertical(cfg, fed.num_parties)
    checkpoints = None if checkpoint_dir is None else \
        _checkpoints(fed, checkpoint_dir, cfg, X, y, secure=secure, simulation_seed=simulation_seed)
    # The step to go on from, agreed by the data parties before any protocol starts: the shared protocol's dealer
    # keeps nothing between starts and is told the step (it deals from there).
    resumed = checkpoints.resume(ranks=fed.parties) if checkpoints is not None else None
    start = checkpoints.resumed_from if checkpoints is not None else 0
    if federated and cfg.protocol == "paper":
        warnings.warn(PAPER_LEAK, UserWarning, stacklevel=2)
    randomness = Randomness(simulation_seed)
    if cfg.private:
        randomness.warn()

    link = ActiveLink(fed, secure=secure)
    sqnorms = row_sqnorms(fed, X)
    if cfg.private and cfg.variant != "primal":
        check_row_norms(sqnorms)

    schedule_seed = randomness.seed128("schedule") if fed.is_active else 0
    if federated:
        # The active party draws the schedule; the others must know it (they compute their parts for its rows).
        with fed.phase("dpscd/schedule"):
            words = link.from_active(torch.tensor([(schedule_seed >> (32 * k)) & 0xFFFFFFFF for k in range(4)],
                                                  dtype=torch.int64) if fed.is_active else None, (4,), torch.int64)
            schedule_seed = sum(int(w) << (32 * k) for k, w in enumerate(words.tolist()))
    if cfg.variant == "primal":
        sampler = CoordinateSampler(n, d, cfg.L, cfg.epochs, rng=numpy_from_seed128(schedule_seed))
    else:
        sampler = BatchSampler(n, cfg.L, cfg.epochs, kind=cfg.resolved_sampling(),
                               rng=numpy_from_seed128(schedule_seed))
    q, steps = sampler.sample_rate, sampler.steps
    if progress is not None and getattr(progress, "total", None) is None:
        progress.total = steps                 # the bar's total, known once the schedule is drawn
    if cfg.private:
        rate, compositions = accounted(cfg, sampler, steps)
        sigma = float(cfg.sigma) if cfg.sigma is not None else calibrate_sigma(
            float(cfg.epsilon), float(cfg.delta), rate, compositions, cfg.accountant)
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
    enc = None
    if encrypted:
        streams = {p: NoiseStream(randomness, f"v/{fed.parties.index(p)}") for p in fed.parties if p != fed.active} \
            if (fed.is_active and private_noise) else None
        if cfg.protocol == "shared":
            from .shared_updates import SharedUpdates, check_range

            check_range(cfg.L + 6 * cfg.L ** 0.5, C, noise_std)      # (a Poisson batch: L + 6 sd rows)
            facts = {"n": n, "L": cfg.L, "epochs": cfg.epochs, "kind": cfg.resolved_sampling(),
                     "seed": format(schedule_seed, "x"), "steps": sampler.steps, "start": start,
                     # resumed: the schedule's generator state after ``start`` steps (this start's seed is new)
                     "schedule": (resumed[0].get("generators") or {}).get("schedule") if resumed else None} \
                if fed.is_active else None
            enc = SharedUpdates(fed, X, sampler_facts=facts, noise_streams=streams)
        else:
            enc = EncryptedUpdates(fed, key_bits=cfg.key_bits, insecure_key=cfg.insecure_key, noise_streams=streams)
    own_noise = private_noise and (not encrypted or fed.is_active)
    ctx = Context(fed=fed, link=link, X=X, y=y, sqnorms=sqnorms, glm=glm, sampler=sampler, state=state, n=n,
                  L=cfg.L, C=C, lam=float(cfg.lam), randomness=randomness, noise_std=noise_std,
                  alpha_stream=NoiseStream(randomness, "alpha") if (private_noise and fed.is_active) else None,
                  v_streams=BlockNoise(randomness, blocks, d) if own_noise else None, encrypted=enc)

    def spent(done: int) -> float | None:
        if not cfg.private:
            return None
        return epsilon_spent(sigma, *accounted(cfg, sampler, done), float(cfg.delta), cfg.accountant)

    ends = set(sampler.epoch_ends()) if monitor_every else set()
    epoch_of = {e: k + 1 for k, e in enumerate(sampler.epoch_ends())}
    history = []
    train_seconds = 0.0
    saves = set()
    if checkpoints is not None:
        saves = set(sampler.epoch_ends()) - {steps}
        if resumed is not None:
            history, train_seconds = _restore(ctx, start, resumed, _generators(ctx))
            if progress is not None:
                progress.update(sampler.start)
    started = time.perf_counter()
    model_block = _TRAINERS[cfg.variant].model_block
    for t, batch, zeta in _STEPS[cfg.variant](ctx):
        if on_step is not None:
            on_step(t, batch, zeta, state)
        if progress is not None:
            progress.update(1)
        done = t + 1
        if done in ends and (epoch_of[done] % monitor_every == 0 or done == steps):
            train_seconds += time.perf_counter() - started
            record = {"epoch": epoch_of[done], "step": done, "epsilon": spent(done)}
            if monitor_objective:
                record["objective"] = monitor_objective_value(fed, link, X, y, glm, model_block(ctx), cfg.lam)
            if fed.is_active:
                history.append(record)
                if on_epoch is not None:
                    on_epoch(record)
            started = time.perf_counter()
        if done in saves:
            _save(checkpoints, ctx, done, history, train_seconds + time.perf_counter() - started)
    train_seconds += time.perf_counter() - started
    epsilon = spent(steps)
    observers = observer_epsilons(cfg, fed, sampler, sigma, epsilon) if (cfg.private and fed.is_active) else None
    return FitResult(theta=model_block(ctx), v=state.v, alpha=state.alpha, sigma=sigma, sensitivity=S,
                     noise_std=noise_std, sample_rate=q, steps=steps, epsilon=epsilon,
                     delta=float(cfg.delta) if cfg.private else None, sampling=sampler.kind,
                     train_seconds=train_seconds, history=history, observers=observers,
                     randomness=randomness.source, simulated=randomness.simulated, checkpoints=checkpoints,
                     resumed_from=checkpoints.resumed_from if checkpoints is not None else 0)


# ------------------------------------------------------------------------------------------------ checkpoints
RESUMABLE = ("dual", "seq", "nonprivate")


def _checkpoints(fed, root, cfg, X, y, *, secure, simulation_seed):
    """This party's ``Checkpoints`` for this run: the settings every party shares and a digest of its own data."""
    from ..checkpoint import Checkpoints, array_digest
    from ..devices import to_numpy

    if cfg.variant not in RESUMABLE:
        raise VFLInputError(f"--checkpoint: the {cfg.variant} variant runs on one machine and is not resumed; "
                            f"checkpoints are for the variants {', '.join(RESUMABLE)}")
    settings = {**cfg.as_dict(), "secure_sum": bool(secure), "parties": fed.num_parties, "rank": fed.rank,
                "simulation_seed": simulation_seed,
                "data": array_digest(to_numpy(X), None if y is None else to_numpy(y))}
    return Checkpoints(fed, root, method="dpscd", fingerprint=settings)


def _generators(ctx) -> dict:
    """Every secret generator of this party's run by name: the schedule's and the noise streams'."""
    gens = {"schedule": ctx.sampler.rng}
    streams = [ctx.alpha_stream, *(s for s, _ in (ctx.v_streams.blocks if ctx.v_streams is not None else [])),
               *(ctx.encrypted.noise_streams.values() if ctx.encrypted is not None else [])]
    for stream in streams:
        if stream is not None:
            gens[f"noise/{stream.name}"] = stream.generator
    return gens


def _save(checkpoints, ctx, done: int, history: list, seconds: float) -> None:
    st = ctx.state
    arrays = {"v": st.v, "visits": ctx.sampler.visits}
    if st.alpha is not None:
        arrays["alpha"] = st.alpha
    checkpoints.save(done, {"generators": {k: g.bit_generator.state for k, g in _generators(ctx).items()},
                            "history": history, "train_seconds": seconds}, arrays)


def _restore(ctx, done: int, resumed, gens: dict) -> tuple[list, float]:
    """Put this party back after the checkpoint's ``done`` steps; returns (history, training seconds) so far."""
    from ..checkpoint import CheckpointError

    state, arrays = resumed
    st = ctx.state
    saved = state.get("generators")
    want = {"v": tuple(st.v.shape), "visits": (ctx.n,), **({"alpha": (ctx.n,)} if st.alpha is not None else {})}
    if not isinstance(saved, dict) or set(saved) != set(gens) or \
            any(k not in arrays or tuple(arrays[k].shape) != shape for k, shape in want.items()):
        raise CheckpointError("the checkpoint does not hold this run's state (its generators or arrays differ): "
                              "delete the --checkpoint folder and start again")
    try:
        for name, g in gens.items():
            if name != "schedule":
                g.bit_generator.state = saved[name]
        ctx.sampler.resume(done, saved["schedule"], arrays["visits"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"the checkpoint cannot be resumed ({exc}): delete the --checkpoint folder and start "
                              f"again") from None
    st.v.copy_(torch.from_numpy(arrays["v"]).to(st.v.dtype))
    if st.alpha is not None:
        st.alpha.copy_(torch.from_numpy(arrays["alpha"]).to(st.alpha.dtype))
    return list(state.get("history") or []), float(state.get("train_seconds") or 0.0)


def monitor_objective_value(fed, link, X, y, glm, theta_block, lam) -> float | None:
    """The primal objective P(theta) at the active party (margins of all rows and ||theta||^2 summed up the tree).

    NOT differentially private: it is a function of every training row and label, released without noise.
    Off by default (``monitor_objective=True`` / ``--monitor-objective`` to debug; outputs mark it).
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
