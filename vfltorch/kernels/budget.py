"""FDSKL with a bounded model: D random features, linear cost in n, prediction in O(m D).

The paper's Algorithm 1 creates r new random features per iteration, so the
model has r T features after T iterations: an epoch of the cached schedule
costs O(n^2 r / B) (every iteration evaluates the new features on all n rows)
and scoring m rows costs O(m r T). Here the feature budget is fixed: D = nb r
features (nb blocks of r, created once, seeds j < D), f(x) = sum_{j < D}
alpha_j phi_j(x), and iteration t

1. draws a mini-batch I_t of B rows (public seed, as before);
2. evaluates the D features on the batch rows (Algorithm 3 for B rows and all
   D features: B D phases) and f(x_i) = sum_j alpha_j phi_j(x_i) (Algorithm 2);
3. takes a stochastic gradient step on E L(f(x), y) + (lambda / 2) ||alpha||^2.

Per epoch that is n D phases (compute and bytes O(n D)); memory per party is
O(B D + d_l D) (its rows of W, one batch of phases), independent of n beyond
its own columns; scoring m rows is m D phases, once.

Solvers (the active party alone updates alpha, from what it already learns):

* ``adam`` (default): all D coefficients per step, Adam's per-coefficient
  steps with lr_t = gamma / sqrt(1 + t / T_epoch), and the iterates averaged
  from the middle of training (from the second epoch under a time budget).
  The gradient is g_j = (1/B) sum_i L'(f(x_i), y_i) phi_j(x_i) + lambda alpha_j.
  Constant-step doubly stochastic descent stalls on hard data (docs/fdskl.md):
  the random-feature Gram matrix is badly conditioned, and a step large
  enough for its small directions oscillates along its large ones.
* ``dsg``: the paper's functional step on block k = t mod nb only, with a
  constant step: alpha_block -= gamma / (B r) sum_i L'_i phi_block(x_i) and
  every coefficient shrinks by (1 - gamma lambda): Algorithm 1 with seeds
  reused modulo D (coefficients of a feature accumulate instead of a new
  feature being created).

Under ``protocol='shared'`` step 2 runs with dealt phase masks: the active
party receives S = theta + beta (uniform; ``shared.star_phases``, one keeper
for all D features per iteration), f on the batch rows comes from the
products of its operands alpha_j cos S_ij with the keeper's cos beta_ij as
shares in Z_2^20 (``shared.StarProducts``, ``shared.TRAIN_BITS``), opened to
it alone, and the gradient sums sum_i L'_i phi_j(x_i) likewise in Z_2^16.
Bytes per iteration (all ranks): 2 (Q - 1) B D (phases) + 5 B D + 4 B G (the
two products' e: 2 B D words of 2.5 bytes, 2 B G of 2; G gradient sums) +
5 B + 4 G (corrections and openings) + 32 Q - 16 (seeds): 11 B D + O(B + D)
at Q = 2 against the paper's 4 B D. No party holds f on all n rows, so there is no
fixed-point growth limit. What the active party learns: f on its batch rows
(B values) and the gradient sums (D values for adam, r for dsg) per iteration,
f on the monitor rows once per epoch. Training stops before the number of such
equations reaches half of n D (``leak_limit``), but that counts the feature values
phi_j(x_i) as the unknowns; with W and b public the real unknowns are the n d_P
passive columns, and one step's D sums determine its batch's B d_P of them
(issue 35, open: tests/test_fdskl_gradient_attack.py, docs/fdskl.md *Known leak*).

Pipelined iteration (``f_delay``, issue 11: time at Q = 2). Computed as written,
iteration t is a chain of four sequential messages between A and the keeper K:
the phases S_t (K -> A), e of f_t (A -> K: needs alpha after step t - 1), K's
share of f_t (K -> A: A gets L'_t), e of the gradient (A -> K: needs L'_t), and
every send here is a rendezvous. With ``f_delay=1`` f on batch t is computed from
the coefficients before step t - 1: with ``adam`` moved on by the step before
(a_{t-1} + (a_{t-1} - a_{t-2}), a prediction of the missing step: Adam's momentum
makes consecutive steps nearly equal), with ``dsg`` as they are. Then A's e of
f_t does not wait for g_{t-1}, and in steady state iteration t is

    A -> K_t (and K_{t-1}):   [e_g of iteration t - 1, e_f of iteration t]
    each passive party -> A:  [its phases of round t + 1, and the shares it owes:
                               K_{t-1} of g_{t-1}, K_t of f_t]

(``_Pipeline``; S of round t + 1 depends on no model, so it travels an iteration
early): one message each way at Q = 2 against four, the same bytes, the same
values opened to the same roles, and the keeper's and other parties' messages
are those of ``star_phases`` with bytes appended. The pipeline drains (e_g and
the keeper's share travel alone, step t is taken at once) where the model must
be complete next or a stop may follow: the end, the epoch-end monitor, the leak
limit, and under a time budget every iteration (its stop flag comes first, so
round t + 1 is not sent ahead). The dealer sends the rounds it has made whenever
the parties' next round has not gone out, and makes rounds ahead between, so that
it waits only at the synchronisations. ``f_delay=1`` is the same algorithm at every
Q, the centralised Q = 1 run included (the federated run equals its twin). It is
opt-in (``estimator.SHARED_F_DELAY`` says why: with the defaults' width selection
and checked compression it cost credit_default 0.16 point). With Adam's step the
stale f fell into a limit cycle along the stiffest direction (the batch mean of f
swinging by +-10 logits; 0.3-0.5 point lost on credit_default), so under
``f_delay=1`` the active party takes a delay-compensated step instead: Nesterov's
form of Adam's step (this gradient's share at once), a slower first moment
(beta_1 = 1 - 2 / iterations per epoch in [0.9, 0.97]) and a linear warm-up of the
rate over the first epoch (at most half the run); f_t is still computed from
a_{t-1} + (a_{t-1} - a_{t-2}). Nothing else changes: the same messages, bytes and
openings. Centralised, 8 seeds: -0.06 point on phishing, -0.02 on credit_default
against ``f_delay=0`` (docs/design/2026-11-24-fdskl-shared-protocol-cost.md,
*Delay compensation*). ``f_delay=0`` (the default,
and always under ``paper``) keeps Adam and the four-message order, with the gradient
share riding on the next phase message; each party makes round t + 1's local part (the
dealer's material, the masks, its own partial phases: ``_local_round``) while round t's
forward product is under way (A waiting for the keeper's share, the keeper, whose share
leaves without waiting, for A's e of the gradient), except before a synchronisation
(``sync`` in ``train_budget``: the dealer sends round t + 1 only after it). A makes its own
partial phases of round t + 1 later, once its e of the gradient has left: they fill its wait
for the keeper's next message. Every receive of a steady iteration is posted ahead
(``Federation.post_recv``), so each message leaves its sender at once. The same
messages, bytes and values; only the order of each party's local work changes.
"""

from __future__ import annotations

import math
import time
import warnings

import torch

from ..comm import Federation, pairwise_tree
from ..comm.sharing import split_bytes, words_from_bytes
from .shared import (TRAIN_BITS, DealerWindow, DealtPhases, StarProducts, all_columns, deal_rounds,
                     post_operand_recvs, post_star_recvs, shared_decision_values, star_local, star_send)
from .traffic import announce, iteration_bytes
from .trainer import (MONITOR_PHASE, TRAIN_PHASE, BatchSampler, TrainingLoop, TrainResult, _stop, log_interval,
                      step_marks)

SOLVERS = ("adam", "dsg")
DEALER_WINDOW = 16          # iterations of dealer material per message (shared.DealerWindow)
# The dealer's rounds per batch (``shared.deal_rounds``), and the most bytes of masks a batch holds: its CPU per
# iteration on phishing (B = 64, D = 1536, two alternating runs each): 1.53 / 1.20 ms one round at a time, 0.89-0.96
# from 2 rounds on (4, 8, 16 alike), about 0.3 ms less on the two cores every process shares.
DEALER_BATCH = 8
DEALER_BATCH_BYTES = 16 << 20
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# f_delay 1's step (the delay-compensated pipelined iteration, docs/fdskl.md): Adam's step with f one step behind
# falls into a limit cycle along the stiffest direction (the batch mean of f swung by +-10 logits on credit_default;
# Adam's first moment keeps pushing for ~1 / (1 - beta_1) steps after the stale gradient has turned). Nesterov's
# form of the step (this gradient's share at once), a slower first moment and a linear warm-up over the first epoch
# (at most half the run) remove it: centralised, 8 seeds, -0.06 / -0.02 point against f_delay 0. beta_1 =
# 1 - 2 / (iterations per epoch) within [0.9, DELAYED_BETA1]: 0.97 from 67 iterations per epoch on (at the default
# batch size from n = 2,144 rows on), Adam's 0.9 on small data (breast cancer, 13 per epoch, 8 seeds: -0.18 point
# at 0.9, -0.62 at 0.95, -0.79 at 0.97). (1 - 4 / (iterations per epoch), 0.969 on phishing: -0.09, seeds to -0.36.)
DELAYED_BETA1 = 0.97
DELAYED_WARMUP_EPOCHS = 1.0
DELAYED_WARMUP_SHARE = 0.5


def leak_limit(n: int, n_features: int, batch: int, grad_per_step: int) -> int:
    """Iterations before the active party's equations (B + g per step) reach half of n D.

    n D counts the feature values as unknowns; the real ones are the n d_P passive columns (W and b are public),
    so this is not a bound on what the gradient sums reveal (issue 35, docs/fdskl.md *Known leak*)."""
    return max(1, (n * n_features) // (2 * (batch + grad_per_step)))


class _Optimizer:
    """The active party's update of alpha from the gradient sums (module docstring)."""

    def __init__(self, cfg, D: int, r: int, per_epoch: float, max_iter: int | None, delay: int = 0,
                 device="cpu"):
        self.cfg, self.D, self.r = cfg, D, r
        self.per_epoch = per_epoch
        # The step's settings: Adam (f_delay 0), or under f_delay 1 the delay-compensated step: Nesterov's form, a
        # slower first moment (up to DELAYED_BETA1) and a linear warm-up of the rate over the first DELAYED_WARMUP_EPOCHS
        # (at most DELAYED_WARMUP_SHARE of the run; module docstring). ``dsg`` ignores them.
        delayed = bool(delay) and cfg.solver == "adam"
        self.beta1 = min(DELAYED_BETA1, max(ADAM_BETAS[0], 1.0 - 2.0 / per_epoch)) if delayed else ADAM_BETAS[0]
        self.nesterov = delayed
        self.warmup = 0.0
        if delayed:
            self.warmup = DELAYED_WARMUP_EPOCHS * per_epoch
            if max_iter is not None:
                self.warmup = min(self.warmup, max_iter * DELAYED_WARMUP_SHARE)
        # On the device of the gradient sums: the party's device under the paper's protocol (and Q = 1), the CPU
        # under the shared one (its products are host arithmetic).
        self.alpha = torch.zeros(D, dtype=torch.float64, device=device)
        self.m = torch.zeros(D, dtype=torch.float64, device=device)
        self.v = torch.zeros(D, dtype=torch.float64, device=device)
        self.mean = torch.zeros(D, dtype=torch.float64, device=device)
        self.averaged = 0
        self.steps = 0                          # steps taken so far
        self.before = self.alpha.clone()        # alpha before the last step (f_delay 1: a_{k-1} after k steps)
        self.earlier = self.alpha.clone()       # and before the one before it (a_{k-2})
        self.average_from = (max_iter // 2 if max_iter is not None else math.ceil(per_epoch)) \
            if cfg.solver == "adam" else None

    def columns(self, t: int) -> torch.Tensor:
        """The features whose gradient sums step t needs (``step_columns``)."""
        return step_columns(self.cfg.solver, self.D, self.r, t)

    def coefficients(self, t: int, delay: int) -> torch.Tensor:
        """The coefficients f on batch t is computed with (module docstring, *Pipelined iteration*).

        ``delay`` 0: alpha after steps 0 .. t - 1. ``delay`` 1: alpha after steps 0 .. t - 2, and with
        ``adam`` moved on by the last of those steps (a_{t-1} + (a_{t-1} - a_{t-2})): the momentum
        makes consecutive steps nearly equal, so this predicts the missing step t - 1 (with Adam's step,
        before the delay-compensated one, leaving it out cost 0.7 point on phishing; predicting the missing
        step from its known part, b1 m_{t-2}, did no better). ``dsg`` steps one block at a time, so its
        delayed f is not extrapolated.
        """
        want = max(0, t - delay)
        if self.steps == want:
            now, last = self.alpha, self.before
        elif self.steps == want + 1:
            now, last = self.before, self.earlier
        else:
            raise RuntimeError(f"FDSKL: iteration {t} needs the coefficients after {want} steps, "
                               f"{self.steps} were taken")
        if delay and self.cfg.solver == "adam":
            return 2 * now - last           # (1.5x or 2x the last step: no better, 4 seeds, phishing and credit_default)
        return now

    def step(self, t: int, cols: torch.Tensor, sums: torch.Tensor, B: int) -> None:
        """sums[j] = sum_{i in I_t} L'_i phi_j(x_i) for j in cols."""
        cfg = self.cfg
        self.steps += 1
        self.earlier, self.before = self.before, self.earlier          # (no copies: a swap, then one copy)
        self.before.copy_(self.alpha)
        if cfg.solver == "dsg":
            self.alpha *= 1.0 - cfg.gamma * cfg.lam                                  # line 9
            self.alpha[cols] -= cfg.gamma / (B * self.r) * sums                      # line 8, accumulated
            return
        grad = sums / B + cfg.lam * self.alpha
        b1, b2 = self.beta1, ADAM_BETAS[1]
        self.m.mul_(b1).add_(grad, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        lr = cfg.gamma / math.sqrt(1.0 + t / self.per_epoch)
        if self.warmup:
            lr *= min(1.0, (t + 1) / self.warmup)
        if self.nesterov:       # (NAdam's step: the next momentum's share of m, and this gradient's share now)
            m_hat = self.m * (b1 / (1 - b1 ** (t + 2))) + grad * ((1 - b1) / (1 - b1 ** (t + 1)))
        else:
            m_hat = self.m / (1 - b1 ** (t + 1))
        v_hat = self.v / (1 - b2 ** (t + 1))
        self.alpha -= lr * m_hat / (v_hat.sqrt() + ADAM_EPS)
        if t >= self.average_from:
            self.averaged += 1
            self.mean += (self.alpha - self.mean) / self.averaged

    @property
    def model(self) -> torch.Tensor:
        """The coefficients to predict with: the averaged iterate once averaging has started."""
        return self.mean.clone() if self.averaged else self.alpha.clone()


def train_budget(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, n_blocks: int,
                 dealer: int | None = None, table=None, monitor=None, log=None,
                 progress: bool = False, checkpoint=None, resume=None) -> TrainResult:
    """Train the D = n_blocks r feature model at this party (SPMD; the dealer too under the shared protocol).

    ``dealer`` None: the paper's protocol (or Q = 1); otherwise the shared
    protocol with that dealer and its cosine ``table``. ``X`` is this party's
    columns ((n x 0) at the dealer), ``y`` the labels at the active party.
    ``cfg.f_delay`` 1: f on batch t is computed with the coefficients before step t - 1 (module
    docstring, *Pipelined iteration*); under the shared protocol the iteration is then pipelined.

    ``checkpoint(t, state, arrays)`` is called at every rank after each epoch end (and the last iteration): the
    active party's optimizer has then taken every step before t (the pipeline drains and no gradient waits at an
    epoch end), and what any rank holds beyond it (rounds made ahead, the dealer's window) is rebuilt from the
    public schedule after a restart. ``resume`` = (state, arrays) of such a checkpoint: the loop goes on at t.
    """
    n = X.shape[0]
    r = fmap.block_size
    shared = dealer is not None
    active = fed.is_active
    for _ in range(n_blocks - fmap.n_blocks):
        fmap.add_block()                                         # Algorithm 1, line 4: once, for all D features
    D = fmap.n_features
    blocks = range(fmap.n_blocks)
    # The active party's step runs on its device under the paper's protocol (and Q = 1): phases, f and the
    # gradient sums never leave it during training. Under the shared protocol the products are host arithmetic.
    opt_device = torch.device("cpu") if shared else X.device
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed, device=opt_device)
    batch_of = _Batches(sampler)
    B = sampler.batch_size
    max_iter = max(1, math.ceil(cfg.epochs * sampler.per_epoch - 1e-9)) if cfg.epochs is not None else None
    log_every = log_interval(cfg.log_every, max_iter)
    delay = int(getattr(cfg, "f_delay", 0))
    opt = _Optimizer(cfg, D, r, sampler.per_epoch, max_iter, delay, device=opt_device) if active else None
    grad_per_step = D if cfg.solver == "adam" else r
    limit = leak_limit(n, D, B, grad_per_step) if shared else None
    everyone = [fed.active] + [p for p in fed.parties if p != fed.active] + ([dealer] if shared else [])
    control_tree = pairwise_tree(everyone)
    if active:
        y = y.to(device=opt_device, dtype=torch.float64)
    mon = (_BudgetMonitor(fed, fmap, monitor, dealer, table, cfg.max_elements, opt_device)
           if monitor is not None else None)
    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    window = DealerWindow(fed, dealer) if shared else None
    pipe = _Pipeline(fed, opt) if shared and delay == 1 else None
    buffered = 0
    window_size = 1         # iterations in the dealer's next window: 1 after each point where it waited, then doubling
    pending = None          # f_delay 0: (products, t, columns) of the step whose gradient sums the keeper's next message carries
    ahead = None            # f_delay 0, at a party: the local part of the next round, made while it waited (_LocalRound)
    stopped_by_leak = False
    rounds = {}             # t -> StarProducts of round t, made ahead (the pipeline; the dealer before a synchronisation)
    bits = TRAIN_BITS if cfg.product_bits == 20 else (32, 32)
    # The pipelined dealer's last round (None: it depends on the time budget) and the last round it has sent.
    last_round = None
    if max_iter is not None and cfg.max_time is None:
        last_round = min(max_iter, limit if limit is not None else max_iter) - 1
    sent_until = -1
    t = 0
    if resume is not None:
        t = _resume(resume, opt, loop, batch_of)
        loop.tree = control_tree        # (the restored points' bytes are summed over it at the end)
    if loop.bar is not None and cfg.max_time is None and max_iter is not None:
        # A run that will move a lot says so before it starts (issue 38), from the formula the tests check.
        line = announce(iteration_bytes("shared" if shared else "paper", fed.num_parties, B, D, grad_per_step,
                                        bits=bits, angle_bits=fmap.circle.bits),
                        min(max_iter, limit if limit is not None else max_iter) - t)
        if line is not None:
            loop.bar.write(line, file=getattr(loop.bar, "fp", None))

    def shared_round(t_round, carry=None):
        if window is not None:
            window.round = t_round          # the dealer's buffered material is tagged by its round (a curve point's bytes)
        out = _shared_round(fed, fmap, X[batch_of(t_round).to(X.device)], blocks, dealer, table, B, t_round,
                            cfg.solver, r, D, window, carry, bits=bits)
        out.t = t_round
        return out

    def local_round(t_round, reserve, star=True):
        return _local_round(fed, fmap, X[batch_of(t_round).to(X.device)], blocks, dealer, table, B, t_round,
                            cfg.solver, r, D, window, bits=bits, reserve=reserve, star=star)

    # The dealer's rounds in batches (``deal_rounds``: its per-round calls cost more than its arithmetic): under
    # the unpipelined shared iteration with Adam's all-feature gradient, packed products and no time budget.
    batch_dealer = (shared and fed.rank == dealer and pipe is None and cfg.solver == "adam" and min(bits) < 32
                    and cfg.max_time is None)
    workspace = {}

    def _rounds_to_flush(t_from, most):
        """Rounds t_from, t_from + 1 ... that go out in the dealer's next flush: up to ``most`` (what its window
        still takes), ending at the first iteration that a synchronisation follows (``sync`` below)."""
        for j in range(max(1, most)):
            final1, epoch_end1 = step_marks(t_from + j + 1, max_iter, sampler.per_epoch)
            if final1 or (limit is not None and t_from + j + 1 >= limit) or (epoch_end1 and mon is not None):
                return j + 1
        return max(1, most)

    while True:
        started = time.perf_counter()
        with fed.phase(TRAIN_PHASE):
            if max_iter is not None and t >= max_iter:
                break
            if limit is not None and t >= limit:
                stopped_by_leak = True
                break
            if cfg.max_time is not None and _stop(fed, control_tree, loop.train_seconds >= cfg.max_time):
                break
            batch = batch_of(t)
            batch_of.forget(t)
            cols = opt.columns(t) if active else None
            final1, epoch_end1 = step_marks(t + 1, max_iter, sampler.per_epoch)
            last = final1 or (limit is not None and t + 1 >= limit)     # no iteration t + 1
            # A synchronisation follows this iteration (the dealer acts in step with the parties: the
            # epoch-end monitor, the time-budget flag, the end). The dealer flushes its window before it, and round
            # t + 1's material is sent only after it: nobody makes round t + 1 ahead across it (f_delay 0).
            sync = (epoch_end1 and mon is not None) or cfg.max_time is not None or last
            if pipe is not None:
                # Round t + 1 rides on this iteration's messages when it certainly runs (not under a time budget,
                # whose stop flag comes first); step t is taken within this iteration where the model must be
                # complete next (the end, the epoch-end monitor) or a stop may follow.
                ahead = not last and cfg.max_time is None
                drain = last or epoch_end1 or cfg.max_time is not None
                prod = rounds.pop(t, None) or shared_round(t)

                def make_next(carry, t_next=t + 1):
                    if t_next not in rounds:            # (the dealer may have made it already: below)
                        rounds[t_next] = shared_round(t_next, carry)
                    return rounds[t_next]
                f_batch = pipe.forward(t, prod, make_next if ahead else None)
            elif shared:
                prod = rounds.pop(t, None)
                if prod is None and batch_dealer:
                    # The dealer makes the rounds up to its next flush (or synchronisation) in one batch
                    # (``deal_rounds``): the same messages, in the same windows.
                    # (14 B D bytes of masks a round: beta 2 B D, a of f 8 B D in int32 words, of the gradient 4 B D)
                    most = min(window_size - buffered, DEALER_BATCH, DEALER_BATCH_BYTES // (14 * B * D))
                    k = _rounds_to_flush(t, most)
                    if k > 1:
                        batch = [(t + j, fmap.keeper_of(t + j)) for j in range(k)]
                        deal_rounds(window, table, batch, B, D, bits, workspace)
                        rounds.update({tj: _DealerRound(tj, keeper, bits) for tj, keeper in batch})
                        prod = rounds.pop(t)
                if prod is None:
                    carry = None
                    if pending is not None:     # last step's keeper appends its share of the gradient sums
                        k_last = pending[0].keeper
                        carry = (dict(carry_bytes={k_last: 2 * len(pending[0].grad_cols)}) if active else
                                 dict(carry=pending[0].carry.view(torch.uint8)) if fed.rank == k_last else None)
                    if ahead is not None:       # round t's local part, made in iteration t - 1 (below)
                        if ahead.t != t:
                            raise RuntimeError(f"FDSKL: round {ahead.t} was made ahead for iteration {t}")
                        prod, ahead = _finish_round(ahead, carry), None
                        prod.t = t
                    else:
                        prod = shared_round(t, carry)
                if pending is not None:
                    if active:
                        done, t_last, cols_last = pending
                        words = words_from_bytes(prod.phases_carry[done.keeper], (len(done.grad_cols),), 16)
                        opt.step(t_last, cols_last, done.finish_gradient(words), B)
                    pending = None
                # The keeper's share of the gradient sums rides on its next phase message (one message fewer per
                # iteration); where no phase message follows (the end, a stop check, the epoch-end monitor) or the
                # gradient's ring is not 16-bit, it travels alone.
                defer = not (last or epoch_end1 or cfg.max_time is not None) and prod.bits[1] == 16
                prod.forward_begin(opt.alpha if active else None)
                if not sync and fed.rank in fed.parties:
                    # Round t + 1's local part while A waits for the keeper's share of f_t (and the keeper, having
                    # sent it, for A's e of the gradient): the dealer's material, the masks, the own partial phases.
                    # Not across a synchronisation (``sync``): the dealer sends round t + 1's material only after it.
                    reserve = 2 * len(prod.grad_cols) if defer and fed.rank == prod.keeper else 0
                    # A's own partial phases of round t + 1 wait until its e of the gradient has left (below): they
                    # fill its wait for the keeper's next message, as the rest of its local part fills this one.
                    ahead = local_round(t + 1, reserve, star=not active)
                f_batch = prod.forward_end()
            else:
                # Algorithm 3: B rows, all D features (computed in the map's dtype, handed over in float64).
                phi = fmap.features(X[batch.to(X.device)], blocks, dtype=torch.float64)
                f_batch = phi @ opt.coefficients(t, delay) if active else None
            d_loss = None
            if active:
                y_batch = y[batch]
                d_loss = cfg.loss.derivative(f_batch, y_batch)
                loop.add_loss(cfg.loss.value(f_batch, y_batch).mean())        # (no host round trip)
            if pipe is not None:
                pipe.gradient(t, prod, cols, d_loss, B, drain)
            elif shared:
                # (``defer`` above) A takes the step when the keeper's next phase message arrives, before it
                # needs alpha.
                if not defer:
                    sums = prod.gradient(d_loss)
                    if active:
                        opt.step(t, cols, sums, B)
                else:
                    # Round t + 1 certainly follows, with no other message first: its messages' receives are posted
                    # now (``Federation.post_recv``: each then leaves its sender at once), A's for the phases (the
                    # keeper's carrying its share of these sums), the next keeper's for A's two operands.
                    # (A's before its e of these sums leaves; the keeper's once it has taken that e.)
                    if active:
                        post_star_recvs(fed, B, D, {prod.keeper: 2 * len(prod.grad_cols)})
                    prod.gradient(d_loss, defer=True)
                    pending = (prod, t, cols)
                    if fed.rank == fmap.keeper_of(t + 1):
                        post_operand_recvs(fed, B, D, len(step_columns(cfg.solver, D, r, t + 1)), prod.bits)
                if ahead is not None:
                    ahead.finish_star()         # (A: above)
            else:
                if active:
                    # (adam: every column, in order: no gathered copy)
                    sums = (phi if len(cols) == phi.shape[1] else phi[:, cols]).T @ d_loss
                    opt.step(t, cols, sums, B)
            if pipe is not None and last_round is not None:
                # The pipelined dealer: every round up to the last certainly runs (no time budget), and the parties
                # take round t + 1 in iteration t. So it sends what it has made whenever round t + 1 has not gone
                # out yet (a window then always starts at the round the parties take next, and every window sent
                # before a synchronisation has been read before it), and makes rounds ahead up to DEALER_WINDOW
                # (2, 4, 6 ... at the start) after each send, while the parties work: it waits for nothing but
                # the synchronisations, and the parties wait for its work only at the start.
                if fed.rank == dealer:
                    if not last and sent_until < t + 1:
                        with fed.phase(f"{fed.current_phase}/deal"):
                            window.flush()
                        sent_until = max(rounds)
                    horizon = min(t + min(DEALER_WINDOW, t + 2), last_round)
                    for t_ahead in range(max(rounds, default=t) + 1, horizon + 1):
                        rounds[t_ahead] = shared_round(t_ahead)
            elif shared:
                # The dealer runs up to DEALER_WINDOW iterations ahead; it flushes before it next has to act in
                # step with the others: the epoch-end monitor (held-out values opened), the time-budget flag, the
                # end. A curve point is not such a point: it sends nothing (``TrainingLoop.log_point``). After a
                # synchronisation the parties wait for its next window, so that window is one iteration, the next
                # two, then four ... up to DEALER_WINDOW: the wait is one iteration of the dealer's work, not a
                # window. (f_delay 0, and the pipeline under a time budget, where the rounds ahead are not certain
                # to run.)
                buffered += 1
                if buffered >= window_size or sync:
                    with fed.phase(f"{fed.current_phase}/deal"):
                        window.flush()
                    buffered = 0
                    window_size = 1 if sync else min(2 * window_size, DEALER_WINDOW)
                    if sync and fed.rank == dealer and not last and t + 1 not in rounds:
                        # The dealer receives nothing during training: it computes round t + 1 now and sends it
                        # right after the synchronisation (the monitor, the time-budget flag), so
                        # the parties do not wait there for its work. Its messages keep their order: what it
                        # sends in between goes out first (the window is flushed above). If the time budget
                        # stops training instead, the round's seeds are never sent.
                        rounds[t + 1] = shared_round(t + 1)
        loop.tick(started)
        t += 1
        final, epoch_end = step_marks(t, max_iter, sampler.per_epoch)
        if t % log_every == 0 or final or epoch_end:
            # Under the shared protocol held-out values are opened at epoch ends only (module docstring).
            use_mon = mon if (not shared or final or epoch_end) else None
            with fed.phase(MONITOR_PHASE):
                f_mon = use_mon.values(opt.model if opt is not None else None) if use_mon is not None else None
            loop.log_point(t, D, f_mon, use_mon, cfg, log, control_tree,
                           unsent=window.queued_before(t) if window is not None else 0)
            if checkpoint is not None and (final or epoch_end):
                checkpoint(t, *_snapshot(t, opt, loop, window.queued_before(t) if window is not None else 0))
    if pipe is not None:
        pipe.close()
    if window is not None:
        window.drain()                  # the dealer's last window sends (shared.DealerWindow)
    loop.close()
    if stopped_by_leak and active:
        warnings.warn(f"FDSKL (shared protocol, {D} features) stopped after {t} iterations: the active party's "
                      f"f values and gradient sums would next reach half the number of unknown feature values "
                      f"n x D it could solve for. Raise n_components or the batch size, or train fewer epochs.",
                      RuntimeWarning, stacklevel=2)
    return loop.result(opt.model.to(X.dtype) if active else None, t)


_OPT_ARRAYS = ("alpha", "m", "v", "mean", "before", "earlier")


def _snapshot(t: int, opt, loop: TrainingLoop, unsent: int) -> tuple[dict, dict]:
    """This rank's training state after iteration t - 1 (``train_budget``'s ``checkpoint``): the active party's
    optimizer, and every rank's curve bookkeeping (points, clock; its bytes so far, ``unsent`` included)."""
    state = {"t": int(t), "loop": loop.state(unsent)}
    arrays = {}
    if opt is not None:
        state["opt"] = {"steps": opt.steps, "averaged": opt.averaged}
        arrays = {k: getattr(opt, k) for k in _OPT_ARRAYS}
    return state, arrays


def _resume(resume, opt, loop: TrainingLoop, batch_of) -> int:
    """Put this rank back after a checkpoint's iteration t (``_snapshot``); returns t."""
    from ..checkpoint import CheckpointError

    state, arrays = resume
    try:
        t = int(state["t"])
        if opt is not None:
            for k in _OPT_ARRAYS:
                saved = torch.from_numpy(arrays[k].copy())
                mine = getattr(opt, k)
                if tuple(saved.shape) != tuple(mine.shape):
                    raise ValueError(f"{k} has {tuple(saved.shape)} values, this run {tuple(mine.shape)}")
                mine.copy_(saved.to(mine.dtype))
            opt.steps, opt.averaged = int(state["opt"]["steps"]), int(state["opt"]["averaged"])
        loop.restore(state["loop"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the FDSKL checkpoint cannot be resumed ({exc}): delete the --checkpoint folder "
                              f"and start again") from None
    batch_of.skip_to(t)
    return t


class _Batches:
    """The public mini-batches by iteration, drawn in order from the sampler (a round can be made ahead)."""

    def __init__(self, sampler: BatchSampler):
        self.sampler, self.drawn, self.next_t = sampler, {}, 0

    def __call__(self, t: int) -> torch.Tensor:
        while self.next_t <= t:
            self.drawn[self.next_t] = self.sampler.next()
            self.next_t += 1
        return self.drawn[t]

    def forget(self, t: int) -> None:
        for k in [k for k in self.drawn if k < t]:
            del self.drawn[k]

    def skip_to(self, t: int) -> None:
        """Draw (and drop) the batches of iterations before t: a resumed run takes iteration t's batch next."""
        while self.next_t < t:
            self.sampler.next()
            self.next_t += 1


class _Pipeline:
    """The shared iteration with f one step behind (``f_delay=1``): one message each way per iteration at Q = 2.

    Iteration t: A sends the keeper K_t e_f of f_t (computed with the coefficients before step t - 1, so it
    does not wait for g_{t-1}) together with the pending e_g of iteration t - 1 (to K_{t-1}: one message when
    that is K_t); every passive party answers with one message that carries its phases of round t + 1 (the
    star, ``star_phases``) and the shares it owes (K_{t-1}: of g_{t-1}, K_t: of f_t). A opens g_{t-1} (step
    t - 1) and f_t, and builds e_g of iteration t, which waits for the next iteration's message. Where the
    pipeline drains (``drain``: the end, the epoch-end monitor, a stop check) e_g and the keeper's share travel
    alone and step t is taken at once; where round t + 1 may not run (``forward(ahead=None)``) the shares
    travel without phases and the next iteration starts with a star of its own. The same values, bytes and
    openings as ``f_delay=0``; only the order of the messages changes.
    """

    def __init__(self, fed: Federation, opt):
        self.fed, self.opt = fed, opt
        self.pending = None         # (products, t, columns, A's e_g bytes or None) of the step not yet taken
        self.sent = None            # a passive party's last message to A, sent without waiting (close waits)

    def close(self) -> None:
        """Wait for this passive party's last message to A (a dead A raises ``PartyFailure`` here)."""
        sent, self.sent = self.sent, None
        if sent is not None:
            sent.wait()

    def _owed(self, prod) -> list:
        """(products, k) whose operand each passive party receives from A this iteration, in message order."""
        out = []
        if self.pending is not None:
            out.append((self.pending[0], 1))
        out.append((prod, 0))
        return out

    def forward(self, t: int, prod, ahead):
        """f_t at A (None elsewhere); takes step t - 1 at A. ``ahead(carry)`` makes round t + 1 with ``carry``."""
        fed = self.fed
        owed = self._owed(prod)
        sends = []
        with fed.phase(f"{fed.current_phase}/products"):
            if fed.is_active:
                e_f = prod.operand(0, self.opt.coefficients(t, 1))
                parts = {}
                for p, k in owed:
                    parts.setdefault(p.keeper, []).append(self.pending[3] if k == 1 else e_f)
                sends = [fed.send_nowait(torch.cat(v), q) for q, v in parts.items()]
                expect = {}
                for p, k in owed:
                    expect[p.keeper] = expect.get(p.keeper, 0) + p.share_bytes(k)
        mine = [(p, k) for p, k in owed if p.keeper == fed.rank]

        def reply():
            """At a passive party: its shares, from the operands A sent it (None when it is owed nothing).

            Called once its phases of round t + 1 are ready: its last message to A (sent without waiting, so
            that it computed these phases meanwhile) is waited for first; at most one is in flight."""
            self.close()
            if not mine:
                return None
            with fed.phase(f"{fed.current_phase}/products"):
                lengths = [p.operand_bytes(k) for p, k in mine]
                buf = fed.recv(fed.active, (sum(lengths),), torch.uint8, device="cpu")
                return torch.cat([p.share(k, e) for (p, k), e in zip(mine, split_bytes(buf, lengths))])

        got = None
        if ahead is not None:           # the shares ride on round t + 1's phase messages
            if fed.is_active:
                got = ahead(dict(carry_bytes=expect)).phases_carry
            elif fed.rank in fed.parties:
                self.sent = ahead(dict(carry=reply, nowait=True)).phases_sent
            else:
                ahead(None)
        else:
            with fed.phase(f"{fed.current_phase}/products"):
                if fed.is_active:
                    got = {q: fed.recv(q, (expect[q],), torch.uint8, device="cpu")
                           for q in fed.parties if q in expect}
                elif fed.rank in fed.parties:
                    out = reply()
                    if out is not None:
                        fed.send(out, fed.active)
                    self.close()
        if not fed.is_active:
            self.pending = None
            return None
        return self._open(owed, sends, got)

    def _open(self, owed, sends, got):
        for s in sends:
            s.wait()
        at = {}
        values = {}
        for p, k in owed:
            buf = got[p.keeper]
            start = at.get(p.keeper, 0)
            at[p.keeper] = start + p.share_bytes(k)
            values[k] = p.open(k, buf[start:at[p.keeper]])
        if self.pending is not None:
            done, t_last, cols_last, _ = self.pending
            self.opt.step(t_last, cols_last, values[1], done.m)
            self.pending = None
        return values[0]

    def gradient(self, t: int, prod, cols, d_loss, B: int, drain: bool) -> None:
        """Step t's gradient operand: sent now and the step taken (``drain``), or kept for the next message."""
        fed = self.fed
        e_g = prod.operand(1, d_loss) if fed.is_active else None
        if not drain:
            self.pending = (prod, t, cols, e_g)
            return
        with fed.phase(f"{fed.current_phase}/products"):
            if fed.is_active:
                fed.send(e_g, prod.keeper)
                sums = prod.open(1, fed.recv(prod.keeper, (prod.share_bytes(1),), torch.uint8, device="cpu"))
                self.opt.step(t, cols, sums, B)
            elif fed.rank == prod.keeper:
                e = fed.recv(fed.active, (prod.operand_bytes(1),), torch.uint8, device="cpu")
                fed.send(prod.share(1, e), fed.active)
        self.close()            # A has had every message this party sent: before a monitor or the end
        self.pending = None


def step_columns(solver: str, D: int, r: int, t: int) -> torch.Tensor:
    """The features whose gradient sums step t needs: all D (adam, the shared ``all_columns`` tensor) or block
    t mod (D / r) (dsg). Every rank computes it from public sizes."""
    if solver == "adam":
        return all_columns(D)
    k = t % (D // r)
    return torch.arange(k * r, (k + 1) * r)


def _shared_round(fed, fmap, Xb, blocks, dealer, table, B, t, solver, r, D, window=None, carry=None,
                  bits=TRAIN_BITS, grad_cols=None, products=StarProducts) -> StarProducts:
    """Step 2's phases under the shared protocol (one keeper for all D features, drawn per iteration from the
    public seed) and the dealer's material for both of the iteration's products (f, then the gradient sums).
    ``grad_cols`` (default ``step_columns``) and ``products`` (a ``StarProducts`` class or factory taking its
    arguments) let the width selection's lockstep candidates use the same round (``selection.py``).
    It is ``_local_round`` then ``_finish_round``: training makes the local part of round t + 1 ahead."""
    reserve = 0
    if carry is not None and "carry" in carry and not callable(carry["carry"]):
        reserve = carry["carry"].numel() * carry["carry"].element_size()
    local = _local_round(fed, fmap, Xb, blocks, dealer, table, B, t, solver, r, D, window, bits=bits,
                         grad_cols=grad_cols, products=products, reserve=reserve)
    return _finish_round(local, carry)


class _DealerRound:
    """The dealer's round t made in a batch (``shared.deal_rounds``): it takes no part in the products."""

    def __init__(self, t, keeper, bits):
        self.t, self.keeper, self.bits = t, keeper, list(bits)

    def forward_begin(self, coef) -> None:
        return None

    def forward_end(self) -> None:
        return None

    def gradient(self, weights, defer: bool = False) -> None:
        return None


class _LocalRound:
    """A round's work before any party's message (``_local_round``); ``_finish_round`` completes it. ``star`` None:
    A's own partial phases are still to be made (``make_star``; ``_local_round(..., star=False)``)."""

    def __init__(self, t, prod, star, make, make_star=None):
        self.t, self.prod, self.star, self.make, self.make_star = t, prod, star, make, make_star

    def finish_star(self) -> None:
        if self.star is None:
            self.star = self.make_star()


def _local_round(fed, fmap, Xb, blocks, dealer, table, B, t, solver, r, D, window=None, *, bits=TRAIN_BITS,
                 grad_cols=None, products=StarProducts, reserve: int = 0, star: bool = True) -> _LocalRound:
    """The local part of round t (``_shared_round``'s arguments): the dealer's material, the masks and this party's
    own partial phases (``shared.star_local``); at A also its product material (``StarProducts``: the dealer's
    message, the masks a expanded from its seed). No party's message: only the dealer's, which it sends without
    waiting for anyone except at the synchronisations (so a round may be made ahead only within a stretch of
    iterations without one: ``train_budget``). ``reserve``: bytes a passive party will append to its phases.
    ``star`` False, at A: its own partial phases wait for ``finish_star`` (A receives nothing in its star, so it can
    make them at any point before the phase messages)."""
    keeper = fmap.keeper_of(t)
    if grad_cols is None:
        grad_cols = step_columns(solver, D, r, t)

    def make(ph):
        return products(fed, ph, table, dealer, B, grad_cols=grad_cols, bits=bits, dealer_io=window)
    prod = None
    if fed.is_active:
        # A receives nothing from the dealer in the star, so it takes (and expands) its product material first;
        # it needs S only in forward.
        prod = make(DealtPhases(None, [(keeper, all_columns(D), None)]))

    def make_star():
        return star_local(fmap, Xb, blocks, dealer, keeper, dealer_io=window, reserve=reserve)
    if not star and not fed.is_active:
        raise ValueError("only the active party's star can be made later: the others receive in theirs")
    return _LocalRound(t, prod, make_star() if star else None, make, make_star)


def _finish_round(local: _LocalRound, carry=None) -> StarProducts:
    """The phase messages of a round whose local part is made (``star_send`` with ``carry``: the keyword arguments
    of ``star_phases``), and the products at the parties other than A (beta at the keeper and the dealer)."""
    local.finish_star()
    ph = star_send(local.star, **(carry or {}))
    if local.prod is not None:
        prod = local.prod
        prod.S = ph.S
    else:
        prod = local.make(ph)
    prod.phases_carry, prod.phases_sent = ph.carry, ph.sent
    return prod


class _BudgetMonitor:
    """Held-out decision values of the current model (phases cached under the paper's protocol)."""

    def __init__(self, fed, fmap, monitor, dealer, table, max_elements, device="cpu"):
        self.fed, self.fmap, self.dealer, self.table = fed, fmap, dealer, table
        self.max_elements = max_elements
        self.X = monitor[0]
        # (on the device of the values: the coefficients' under the paper's protocol, the host under the shared one)
        self.y = None if monitor[1] is None else monitor[1].to(device=device, dtype=torch.float64)
        self.phi = None
        self.fetched = False

    def values(self, alpha):
        fed = self.fed
        if self.dealer is not None:
            return shared_decision_values(fed, self.fmap, self.X, alpha, dealer=self.dealer, table=self.table,
                                          max_elements=self.max_elements)
        if not self.fetched:            # the paper's protocol: the active party sees these phases anyway
            self.fetched = True
            self.phi = self.fmap.features(self.X, range(self.fmap.n_blocks))
            if self.phi is not None:
                self.phi = self.phi.to(device=alpha.device, dtype=torch.float64)
        return None if self.phi is None else self.phi @ alpha
