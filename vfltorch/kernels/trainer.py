"""FDSKL's Algorithm 1, batched: doubly stochastic functional gradient descent across parties.

The model is f(x) = sum_j alpha_j phi_j(x), one coefficient per random feature.
Iteration t draws a mini-batch I_t of B rows and a block of r new features
(B = r = 1 is the paper's algorithm) and takes one step of functional
gradient descent on E L(f(x), y) + (lambda / 2) ||f||^2 with the kernel
replaced by the r new features, k(x, .) ~ (1/r) sum_k phi_k(x) phi_k(.):

    alpha_k   = -gamma / (B r) * sum_{i in I_t} L'(f(x_i), y_i) phi_k(x_i)    (Algorithm 1, line 8)
    alpha_j  <- (1 - gamma lambda) alpha_j   for every earlier feature j      (line 9)

with f(x_i) evaluated before the step (line 6, Algorithm 2) and a constant
step gamma. Sample indices come from the shared seed, so every party knows
I_t without a message (the paper sends i down the reverse tree T0; either
way every party learns the indices, nothing more).

Who holds what. The labels and every alpha stay at the active party: only it
can evaluate L'(f(x_i), y_i), so it creates all coefficients (in the paper
every worker holds labels and creates the coefficients of the samples it
picks; with labels at one party, handing L' or alpha to a passive party would
reveal labels). Passive parties take part in Algorithm 3 only: they send
masked partial projections and see nothing else.

Two schedules of the same arithmetic (identical results up to rounding):

* ``paper``: every iteration evaluates f(x_i) for the batch from scratch, so
  the phases of the B batch rows on all t r features so far cross the wire:
  O(Q B r t) values per iteration, growing with t (the paper's O(q t)), and
  O(Q B r T^2 / 2) in all.
* ``cached``: every iteration sends the phases of all n training rows on the
  r new features, and the active party keeps f(x_i) for every training row,
  updated as f <- (1 - gamma lambda) f + Phi_new alpha_new (valid because old
  coefficients only ever shrink together). O(Q n r) values per iteration,
  constant in t, O(Q n r T) in all. With T = E n / B iterations (E epochs)
  that is cheaper than ``paper`` by a factor E / 2 overall, and cheaper per
  iteration from the end of the first epoch on; it also gives the full
  training loss for free.

``prefetch`` (cached schedule): the phases of the new features depend on W and
X only, not on alpha, so the blocks of k = ``prefetch`` iterations are fetched
in one round of Algorithm 3 (n x k r angles), then the active party runs the k
iterations on its own. Same values, same bytes, k times fewer synchronisations
between the parties (a round trip over the trees costs several scheduler
wake-ups per party, which dominates small data sets); the time budget is
checked once per round. k = 1 is the per-iteration protocol.

Monitoring (held-out rows for learning curves) uses the same trick: every
``log_every`` iterations the phases of the monitor rows on the blocks created
since the last check are computed, and f_monitor <- (1 - gamma lambda)^k
f_monitor + Phi alpha. Its time and bytes are kept apart from training's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..comm import Federation, broadcast, pairwise_tree, reduce
from .losses import Loss
from .protocol import FederatedFeatureMap

TRAIN_PHASE = "fdskl/train"
MONITOR_PHASE = "fdskl/monitor"
CURVE_PHASE = MONITOR_PHASE + "/curve"      # the curve points' bytes, summed once at the end of training


@dataclass
class DSGConfig:
    loss: Loss
    gamma: float
    lam: float
    batch_size: int
    epochs: float | None = None
    max_time: float | None = None
    schedule: str = "cached"
    seed: int = 0
    log_every: int | None = None
    prefetch: int = 1                          # cached schedule: blocks of new features fetched per round
    task: str = "binary"
    y_offset: float = 0.0                      # regression: f is fitted to (y - y_offset) / y_scale
    y_scale: float = 1.0
    solver: str = "dsg"                        # bounded model (budget.py): "adam" or "dsg"
    max_elements: int = 2 ** 22
    # Shared bounded model's training products (shared.TRAIN_BITS): 20 -> f in Z_2^20 and the gradient sums in
    # Z_2^16 (fewer bytes; reproducible to about 3% of alpha); 32 -> both in Z_2^32 (about 0.1%).
    product_bits: int = 20
    # Bounded model: f on batch t from the coefficients after steps 0 .. t - 1 - f_delay (budget.py). 1 lets the
    # shared protocol pipeline its iteration (one message each way at Q = 2); 0 is the paper's algorithm.
    f_delay: int = 0


@dataclass
class TrainResult:
    alpha: torch.Tensor | None                 # at the active party only
    iterations: int
    train_seconds: float
    history: list = field(default_factory=list)
    batch_loss: float = float("nan")            # mean mini-batch loss over the last logging window
    train_loss: float = float("nan")            # full training loss (cached schedule)
    bytes_sent: int = 0                         # by this party, in the training phase of this run
    messages_sent: int = 0
    held_out_f: torch.Tensor | None = None      # sealed width selection: f of the model on held-out rows, at A


class BatchSampler:
    """Mini-batches of exactly B rows from a stream of seeded permutations: every party derives the same I_t.

    Each epoch is a fresh permutation of the rows and batches run across
    epoch boundaries, so every batch has B rows. (A short last batch per
    epoch would take a step of the same size gamma on a handful of rows, a
    large noisy step that can undo an epoch's progress when it is the last.)
    """

    def __init__(self, n: int, batch_size: int, seed: int, device="cpu"):
        self.n = n
        self.batch_size = min(batch_size, n)
        self.generator = torch.Generator().manual_seed(int(seed) % (2 ** 63))
        # ``device``: the batches' index tensors live there (drawn on the CPU, the same permutations; one copy per
        # epoch instead of one per iteration on a GPU).
        self.device = torch.device(device)
        self.buffer = self._permutation()

    def _permutation(self) -> torch.Tensor:
        perm = torch.randperm(self.n, generator=self.generator)
        return perm if self.device.type == "cpu" else perm.to(self.device)

    @property
    def per_epoch(self) -> float:
        return self.n / self.batch_size

    def next(self) -> torch.Tensor:
        if len(self.buffer) < self.batch_size:
            self.buffer = torch.cat([self.buffer, self._permutation()])
        batch, self.buffer = self.buffer[:self.batch_size], self.buffer[self.batch_size:]
        return batch


class TrainingLoop:
    """The bookkeeping every FDSKL trainer (growing, shared, bounded) shares: the progress bar, the training
    clock, the bytes sent since the start (the meter counts every run of this federation), the batch-loss
    window between curve points and the curve itself.

    A curve point sends no message (issue 11: the points synchronised every rank, the dealer included, about
    50 times a run). Each rank records its own training bytes at each point; at the end of training (``close``,
    where every rank of ``tree`` arrives anyway) one reduce of the per-point vector gives the active party the
    totals, which it fills into its points and logs (the ``fdskl_vs_kbytes`` scalars). The points fall at
    iterations every rank knows (``t`` is agreed, the time budget's stop flag included), so the vectors line
    up; the reduce carries each rank's point count and the sum of its points' iterations to check that."""

    def __init__(self, fed: Federation, max_iter: int | None, *, log=None, progress: bool = False):
        self.fed = fed
        self.log = log
        self.bar = log.progress(total=max_iter, desc="fdskl", unit="it") if progress and log is not None else None
        self.sent_before = phase_totals(fed, TRAIN_PHASE)
        self.history: list[dict] = []
        self.points: list[tuple[int, int]] = []     # (iteration, this rank's training bytes) per curve point
        self.tree = None                            # the control tree the points' bytes are summed over
        self.closed = False
        self.window_loss, self.window_count = 0.0, 0
        self.last_batch_loss = float("nan")
        self.train_seconds = 0.0

    def state(self, unsent: int = 0) -> dict:
        """What a checkpoint keeps of this bookkeeping (at a curve point, so the loss window is empty): the
        curve (active party), this rank's points, the clock, and its training bytes so far (``unsent``: bytes
        its dealer window holds for iterations before the point)."""
        sent = phase_totals(self.fed, TRAIN_PHASE)["bytes_sent"] - self.sent_before["bytes_sent"] + int(unsent)
        return {"history": self.history, "points": self.points, "train_seconds": self.train_seconds,
                "last_batch_loss": self.last_batch_loss, "bytes": int(sent)}

    def restore(self, state: dict) -> None:
        """Back to ``state()`` after a restart: later points count this process's bytes on top of the saved ones."""
        self.history = [dict(p) for p in state["history"]]
        self.points = [(int(t), int(b)) for t, b in state["points"]]
        self.train_seconds = float(state["train_seconds"])
        self.last_batch_loss = float(state["last_batch_loss"])
        self.sent_before = dict(self.sent_before)
        self.sent_before["bytes_sent"] -= int(state["bytes"])
        if self.bar is not None and self.points:
            self.bar.update(self.points[-1][0])

    def add_loss(self, value) -> None:
        """A batch's mean loss: a float, or a one-element tensor on any device (summed there in float64, read at
        the next curve point: no host round trip per iteration on a GPU; the same sums as Python floats)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().to(torch.float64)
        self.window_loss = self.window_loss + value
        self.window_count += 1

    def tick(self, started: float) -> None:
        """One iteration done (``started``: its perf_counter at the start)."""
        self.train_seconds += time.perf_counter() - started
        if self.bar is not None:
            self.bar.update(1)

    def batch_loss(self) -> float:
        """The mean batch loss since the last call (the previous value when no batch was seen since)."""
        if self.window_count:
            self.last_batch_loss = float(self.window_loss) / self.window_count
        self.window_loss, self.window_count = 0.0, 0
        return self.last_batch_loss

    def log_point(self, t: int, features: int, f_mon, mon, cfg, log, tree, extra: dict | None = None,
                  unsent: int = 0) -> None:
        """A curve point (every rank calls it; it sends nothing): this rank's training bytes so far are recorded
        (``unsent``: bytes it has committed to iterations before ``t`` but not yet sent, the dealer's window,
        ``DealerWindow.queued_before``); the point, with its A-local values, is kept at the active party and
        its ``bytes`` (every rank's, over ``tree``) filled in by ``close``."""
        fed = self.fed
        mine = phase_totals(fed, TRAIN_PHASE)["bytes_sent"] - self.sent_before["bytes_sent"] + int(unsent)
        self.points.append((int(t), int(mine)))
        self.tree = tree
        loss = self.batch_loss()
        if not fed.is_active:
            return
        point = {"iteration": t, "features": features, "train_seconds": self.train_seconds, "bytes": None,
                 "batch_loss": loss, **(extra or {})}
        self.history.append(finish_point(point, f_mon, mon, cfg, log))

    def _total_bytes(self) -> None:
        """The points' bytes of every rank, one reduce over the control tree, into the active party's points."""
        fed = self.fed
        if not self.points:
            return
        k = len(self.points)
        iterations = sum(t for t, _ in self.points)
        vec = torch.tensor([k, iterations] + [b for _, b in self.points], dtype=torch.int64)
        with fed.phase(CURVE_PHASE):
            total = reduce(fed, vec, self.tree)
        if not fed.is_active:
            return
        ranks = len(self.tree.order)
        if int(total[0]) != ranks * k or int(total[1]) != ranks * iterations:
            raise RuntimeError(f"FDSKL: the ranks' curve points disagree (the active party has {k} points at "
                               f"iterations summing to {iterations}; the ranks' sums are {int(total[0])} and "
                               f"{int(total[1])} over {ranks} ranks)")
        for point, b in zip(self.history, total[2:].tolist()):
            point["bytes"] = int(b)
            log_bytes_point(point, self.log)

    def close(self) -> None:
        """The end of training at this rank (every rank of the control tree calls it, once or more)."""
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        self.batch_loss()
        self._total_bytes()

    def result(self, alpha, t: int, train_loss: float = float("nan")) -> TrainResult:
        self.close()
        sent = phase_totals(self.fed, TRAIN_PHASE)
        return TrainResult(alpha, t, self.train_seconds, self.history, self.last_batch_loss, train_loss,
                           sent["bytes_sent"] - self.sent_before["bytes_sent"],
                           sent["messages_sent"] - self.sent_before["messages_sent"])


def train_dsg(fed: Federation, fmap: FederatedFeatureMap, X: torch.Tensor, y: torch.Tensor | None,
              cfg: DSGConfig, *, monitor=None, log=None, progress: bool = False) -> TrainResult:
    """Run Algorithm 1 (batched) at this party; the active party's result carries alpha and the curve.

    ``monitor`` is ``(X_monitor, y_monitor)`` (labels at the active party
    only) or None. ``log`` is a ``vfltorch.runlog.RunLog`` (scalars are
    written at the active party only).
    """
    n = X.shape[0]
    r = fmap.block_size
    dtype, device = X.dtype, X.device
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed, device=device)
    max_iter = max(1, math.ceil(cfg.epochs * sampler.per_epoch - 1e-9)) if cfg.epochs is not None else None
    log_every = log_interval(cfg.log_every, max_iter)
    shrink = 1.0 - cfg.gamma * cfg.lam
    active = fed.is_active
    control_tree = pairwise_tree([fed.active] + [p for p in fed.parties if p != fed.active])

    # Cached schedule: the phases of the new features do not depend on alpha, only on W and X, so the
    # blocks of `prefetch` iterations can cross the wire in one round (same values, same bytes, fewer
    # synchronisations); the paper schedule needs the batch of each iteration and fetches one at a time.
    prefetch = max(1, int(cfg.prefetch)) if cfg.schedule == "cached" else 1
    fetched_until, phi_round, round_start = 0, None, 0
    alpha = torch.zeros(0, dtype=dtype, device=device) if active else None
    f_train = torch.zeros(n, dtype=dtype, device=device) if active and cfg.schedule == "cached" else None
    if active:
        y = y.to(device=device, dtype=dtype)
    mon = _Monitor(fed, fmap, monitor, dtype, device) if monitor is not None else None

    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    t = 0
    while True:
        started = time.perf_counter()
        with fed.phase(TRAIN_PHASE):
            if max_iter is not None and t >= max_iter:
                break
            if t == fetched_until:                                    # a new round (every iteration if prefetch = 1)
                if cfg.max_time is not None and _stop(fed, control_tree, loop.train_seconds >= cfg.max_time):
                    break
                k = prefetch if max_iter is None else min(prefetch, max_iter - t)
                for _ in range(k):
                    fmap.add_block()                                  # Algorithm 1, line 4 (k iterations ahead)
                if cfg.schedule == "cached":
                    phi_round = fmap.features(X, range(t, t + k))     # Algorithm 3 for all rows, k r new features
                round_start, fetched_until = t, t + k
            batch = sampler.next()
            if cfg.schedule == "cached":
                if active:
                    j = (t - round_start) * r
                    phi = phi_round[:, j:j + r]                       # this iteration's r new features
                    f_batch = f_train[batch.to(device)]
                    phi_batch = phi[batch.to(device)]
            else:
                phi = fmap.features(X[batch.to(device)], range(t + 1))  # Algorithm 3 for the batch, all features
                if active:
                    f_batch = phi[:, :t * r] @ alpha                  # Algorithm 2 (the active holds every alpha)
                    phi_batch = phi[:, t * r:]
            if active:
                y_batch = y[batch.to(device)]
                d_loss = cfg.loss.derivative(f_batch, y_batch)        # L'(f(x_i), y_i)
                a_new = (-cfg.gamma / (len(batch) * r)) * (phi_batch.T @ d_loss)   # line 8
                alpha = torch.cat([alpha * shrink, a_new])           # line 9: earlier alphas shrink
                if f_train is not None:
                    f_train = shrink * f_train + phi @ a_new
                loop.add_loss(cfg.loss.value(f_batch, y_batch).mean())
        loop.tick(started)
        t += 1
        if t % log_every == 0 or (max_iter is not None and t == max_iter):
            with fed.phase(MONITOR_PHASE):
                f_mon = mon.update(alpha, shrink, t) if mon is not None else None
            extra = {"train_loss": float(cfg.loss.value(f_train, y).mean())} if f_train is not None else None
            loop.log_point(t, t * fmap.block_size, f_mon, mon, cfg, log, control_tree, extra)
    train_loss = float("nan")
    if active and f_train is not None:
        train_loss = float(cfg.loss.value(f_train, y).mean())
    return loop.result(alpha, t, train_loss)


def _stop(fed: Federation, tree, mine: bool) -> bool:
    """The active party's stop decision (time budget) for everyone: one flag down the reverse tree T0."""
    if fed.num_parties == 1:
        return mine
    flag = torch.tensor([1 if mine else 0], dtype=torch.int64) if fed.is_active else None
    flag = broadcast(fed, flag, tree, shape=(1,), dtype=torch.int64)
    return bool(int(flag[0]))


class _Monitor:
    """Decision values on held-out rows, brought up to date every few iterations (see the module docstring)."""

    def __init__(self, fed, fmap, monitor, dtype, device):
        self.fed = fed
        self.fmap = fmap
        self.X = monitor[0].to(device=device, dtype=dtype)
        self.y = None if monitor[1] is None else monitor[1].to(device=device, dtype=dtype)
        self.f = torch.zeros(self.X.shape[0], dtype=dtype, device=device) if fed.is_active else None
        self.blocks_done = 0
        self.shrinks_done = 0

    def update(self, alpha: torch.Tensor | None, shrink: float, t: int) -> torch.Tensor | None:
        # Blocks used by the t iterations so far (one per iteration; prefetched ones may exist beyond them).
        blocks = range(self.blocks_done, t)
        phi = self.fmap.features(self.X, blocks) if len(blocks) else None
        if self.fed.is_active:
            self.f = self.f * shrink ** (t - self.shrinks_done)
            if phi is not None:
                r = self.fmap.block_size
                self.f = self.f + phi @ alpha[self.blocks_done * r:t * r]
        self.blocks_done = t
        self.shrinks_done = t
        return self.f


def log_interval(log_every: int | None, max_iter: int | None) -> int:
    """Iterations between curve points: as asked, else about 50 points over the run (10 without an end)."""
    return log_every or (max(1, max_iter // 50) if max_iter else 10)


def step_marks(t: int, max_iter: int | None, per_epoch: float) -> tuple[bool, bool]:
    """(final, epoch_end) after iteration ``t``: the run's last iteration, and the first one of a new epoch."""
    final = max_iter is not None and t == max_iter
    epoch_end = math.floor(t / per_epoch + 1e-9) > math.floor((t - 1) / per_epoch + 1e-9)
    return final, epoch_end


CURVE_KEYS = ("batch_loss", "train_loss", "test_error", "test_mse")


def finish_point(point: dict, f_mon, mon, cfg, log) -> dict:
    """A curve point at the active party: held-out metrics of the monitored rows added, and every curve
    logged against iterations and training milliseconds (one routine for all three trainers); against
    kilobytes once the point's bytes are known, at the end of training (``log_bytes_point``)."""
    if f_mon is not None and mon.y is not None:
        f_orig = cfg.y_offset + cfg.y_scale * f_mon if cfg.task == "regression" else f_mon
        point.update(held_out_metrics(f_orig, mon.y, cfg.task, prefix="test_"))
    if log is not None:
        t, ms = point["iteration"], int(point["train_seconds"] * 1000)
        for key in CURVE_KEYS:
            if key in point:
                log.scalar(f"fdskl/{key}", point[key], t)
                log.scalar(f"fdskl_vs_time_ms/{key}", point[key], ms)
    return point


def log_bytes_point(point: dict, log) -> None:
    """A point's curves against the kilobytes all ranks had sent for training by its iteration."""
    if log is None:
        return
    kb = point["bytes"] // 1024
    for key in CURVE_KEYS:
        if key in point:
            log.scalar(f"fdskl_vs_kbytes/{key}", point[key], kb)


def phase_totals(fed: Federation, prefix: str) -> dict:
    """This party's meter totals over ``prefix`` and its sub-phases (``prefix/masked-sum`` ...)."""
    names = [k for k in fed.meter.as_dict() if k == prefix or k.startswith(prefix + "/")]
    return fed.meter.totals(names)


def held_out_metrics(f: torch.Tensor, y: torch.Tensor, task: str, prefix: str = "") -> dict:
    """Error / accuracy for classification (sign of f against y in {-1, +1}), MSE / R^2 for regression."""
    f, y = f.to(torch.float64), y.to(torch.float64)
    if task == "binary":
        acc = float(((f >= 0).to(torch.float64) * 2 - 1 == y).to(torch.float64).mean())
        return {f"{prefix}accuracy": acc, f"{prefix}error": 1.0 - acc}
    mse = float(((f - y) ** 2).mean())
    var = float(((y - y.mean()) ** 2).mean())
    return {f"{prefix}mse": mse, f"{prefix}r2": 1.0 - mse / var if var > 0 else float("nan")}
