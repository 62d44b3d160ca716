"""FDSKL's sealed protocol (issue 35): the label holder is opened f on its batch rows, and nothing per feature.

Why. Under ``protocol='shared'`` the active party A is opened the D gradient sums
g_j = sum_i L'_i phi_j(x_i) of every step. W and b are public, so one step's sums are D equations in the batch's
B d_P passive values, and solving them gives A the passive columns (tests/test_fdskl_gradient_attack.py). Here the
coefficients alpha, the gradient sums and the optimiser's state stay in additive shares on Z_2^64 between A and a
fixed passive *holder* H (the first passive party, which is also every iteration's keeper of the dealt phase masks),
and only f on the batch rows is opened, to A, as the loss needs it.

Roles: A (labels), H, the other passive parties, and the dealer D (``vfl fdskl``'s coordinator; no data).

Iteration t (batch I_t of B rows, public seed):

1. Phases with dealt masks (``shared.star_phases``, keeper H): A receives S = theta + beta (uniform); H and D
   know beta. phi_j(x_i) = sqrt2 (cos S cos beta + sin S sin beta)_ij.
2. f on the batch as one dealt row product (``sharing.mul_dealt``, A's operand x, an operand y that H and D know):
       x = [alpha_A (.) [cos S, sin S],  [cos S, sin S]]      y = [[cos beta, sin beta],  alpha_H (.) [cos beta, sin beta]]
   (each pair of columns one feature; B x 4D), so x . y = sum_j (alpha_A + alpha_H)_j (cos S cos beta + sin S sin beta),
   in Z_2^32 with a coarse copy of alpha (each holder truncates its share locally to 10 fractional bits; the
   cosines have 6): f has 22 fractional bits and |f| < 2^9. H's share is opened to A: A gets f on I_t. D must know alpha_H to deal the product: H sends it D after each
   step, once A and H have re-randomised their shares of alpha with a fresh pad from a stream only they know (D
   computes A's raw product shares, c_0, so without the pad it could follow A's share and add the two).
3. The gradient sums as one dealt column product in Z_2^64: A's operand [L'_i cos S_ij, L'_i sin S_ij], y = [cos
   beta, sin beta]; the shares stay where they are (nothing opened). The dealer's material for both products
   travels to A in one message before the data messages (``sharing.deal_dealt``).
4. Momentum SGD on the shares (linear in the gradient: local on shares, with SecureML's local truncation for the
   two fixed-point products by public constants): m <- mu m + g, alpha <- alpha - (gamma / B) m, mu = 29/32 and
   gamma = 16 / D by default (a step of fixed size in function space: f moves by gamma D k(x_i, x) per unit L'). From
   the middle of training the shares of alpha are summed (the averaged iterate). Adam's per-coefficient division
   is not linear; benchmarks/fdskl_linear_optimizer.py measured momentum SGD within 0.3 point of it
   (docs/design/2026-11-28-fdskl-gradient-leak.md). The weight decay lambda alpha (1e-5) is below alpha's
   fixed-point step and is left out.

At the end the averaged alpha is opened to A (prediction then runs ``shared``'s protocol with A's coefficients).
That is D numbers, alpha = sum_i C_i phi(x_i) with weights C_i that A knows, functions of the n d_P passive
values: training refuses to start where n d_P < ``UNKNOWNS_PER_OPENED`` D (``check_sealed``), and says what to
change. The steps x B values of f are what the loss needs (every protocol opens them); A is warned where they
reach n d_P.

What each role receives: A, per step, S (uniform), the dealer's c_0 (uniform), H's share of f (f on I_t once
added), at each epoch end with monitor rows the same for f on them (``SealedMonitor``), and once the averaged
alpha; H: e = x - a (uniform), the dealer's seeds, A's pad seed; D: alpha_H after
the pad (uniform), nothing else. Fixed point: the cosines with 6 fractional bits in both products, L' with 8,
alpha with 20 (10 in f's product); both products are exact in their rings; a truncation fails with probability below
about 2^-29 per coefficient and step at B = 64 even where every |L'| is 1 (SecureML: about |x| / 2^63 for a value
x; a larger batch raises it in proportion), which
A sees as an impossible |f| and stops with an error.
"""

from __future__ import annotations

import math
import time

import torch

from ..comm import Federation, pairwise_tree
from ..comm.sharing import _stream_from, _uniform, _word, deal_dealt, fresh_seed, mul_dealt, open_shares, truncate
from ..data.validation import VFLInputError
from .shared import REAL_PAIRS, cos_sin, narrow_table, star_phases
from .traffic import announce, iteration_bytes
from .trainer import MONITOR_PHASE, TRAIN_PHASE, BatchSampler, TrainingLoop, _stop, log_interval, step_marks

SQRT2 = math.sqrt(2.0)
F_RING = 32             # f's product in Z_2^32: half the bytes of its operand (4D columns: the largest message)
COS_BITS = 6            # cosines in both products (A's cos S, H's and D's cos beta): each side rounds them once
ALPHA_F_BITS = 10       # the copy of alpha in f's product: f has 10 + 2 x 6 = 22 fractional bits, |f| < 2^9
LPRIME_BITS = 8         # L'
ALPHA_BITS = 20         # alpha's shares
G_BITS = LPRIME_BITS + 2 * COS_BITS            # the gradient sums' (and m's) fractional bits
MU_NUM, MU_SHIFT = 29, 5                      # momentum 29 / 32
LR_SHIFT = 16                                 # (gamma / B) as an integer over 2**16
F_LIMIT = 2.0 ** 9                            # |f| beyond this: a failed truncation (or a diverged step); f's
                                              # 22 fractional bits and its sign then fill Z_2^32
LPRIME_LIMIT = 2.0 ** 6
UNKNOWNS_PER_OPENED = 2                       # n d_P >= 2 D before the averaged alpha may be opened
DEFAULT_RATE = 16.0                           # momentum SGD's constant step gamma = DEFAULT_RATE / D (benchmarks/
                                              # fdskl_linear_optimizer.py: alpha ~ sum L' phi moves f by gamma D k)


def steps_of(n: int, batch: int, epochs: float) -> int:
    """The iterations of a run (``BatchSampler``'s batches of min(batch, n) rows, ``epochs`` passes)."""
    return max(1, math.ceil(epochs * (n / min(batch, n)) - 1e-9))


def check_sealed(n: int, passive_columns: int, D: int, batch: int, epochs: float | None) -> str | None:
    """Refuse a run whose opened model could determine the passive values; return a warning about the f values.

    Beyond what the loss needs, the label holder is opened the trained coefficients once: D numbers
    alpha_j = sum_i C_i phi_j(x_i) with weights C_i it knows, functions of the n d_P passive values (W and b are
    public). The run needs at least ``UNKNOWNS_PER_OPENED`` passive values per coefficient.

    f on the batch rows (steps x B numbers, one per row per epoch) is what the loss needs: every FDSKL protocol
    opens it to the label holder (the paper's too). Where they reach the n d_P passive values (fewer passive
    columns than epochs) the returned text says so; the pooled attack (tests/test_fdskl_gradient_attack.py) is
    what they give on real runs."""
    if not passive_columns:
        return None
    unknowns = n * passive_columns
    if unknowns < UNKNOWNS_PER_OPENED * D:
        room = unknowns // UNKNOWNS_PER_OPENED
        raise VFLInputError(
            f"protocol='sealed' opens the label holder the {D} trained coefficients once, functions of the "
            f"{unknowns} passive values ({n} rows x {passive_columns} passive columns); they may be at most "
            f"1/{UNKNOWNS_PER_OPENED} of them: pass n_components <= {room}")
    if epochs is None:                  # (a time budget alone: the steps are not known in advance)
        return None
    f_values = steps_of(n, batch, epochs) * min(batch, n)
    if f_values >= unknowns:
        return (f"protocol='sealed': the label holder is opened f on its batch rows {f_values} times (what its loss "
                f"needs, under every protocol), as many as the {unknowns} passive values ({passive_columns} "
                f"passive columns): fewer epochs open fewer (docs/fdskl.md, *What each role learns*)")
    return None


# A's [cos S, sin S] rounded to COS_BITS, as a table over the 16-bit angle words: the same integers as rounding the
# float cosines each iteration (round(cos x 2^6)), from one gather of 1-byte pairs (a 128 KB table that stays in a
# core's cache) instead of a float gather, a multiply and a round.
ACTIVE_PAIRS = torch.round(REAL_PAIRS * 2.0 ** COS_BITS).to(torch.int8).contiguous()


def _fixed(x: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.round(x * 2.0 ** bits).to(torch.int64)


def _f_operands(rank: int, A: int, ph, alpha: torch.Tensor, known_h: torch.Tensor | None, table):
    """Step 2's operands: at A (x of f's product, A's fixed-point [cos S, sin S]); at H and the dealer (y of f's
    product, the fixed-point [cos beta, sin beta]); ``known_h`` is H's share of alpha as H and the dealer hold it."""
    if rank == A:
        cs8 = cos_sin(ACTIVE_PAIRS, ph.S.cpu())                          # B x 2D [cos S, sin S] x 2^6, int8
        # (int32 words multiply mod 2**32: the small cosines times the 32 low bits of alpha's copy)
        cs_f = _word(cs8, F_RING)
        a_f = _word(truncate(alpha, 0, ALPHA_BITS - ALPHA_F_BITS), F_RING)  # alpha's coarse copy (A's share)
        return torch.cat([cs_f * a_f.repeat_interleave(2), cs_f], dim=1), cs8.to(torch.int64)
    beta = ph.groups[0][2]
    # [cos beta, sin beta] of the dealer's 16-bit table rounded to COS_BITS (shared.narrow_table: int8, cached)
    cb8 = cos_sin(narrow_table(table, COS_BITS), beta.cpu())
    cb_narrow = cb8.to(torch.int64)                                      # (both products' cosines)
    cb_f = _word(cb8, F_RING)
    a_f = _word(truncate(known_h, 1, ALPHA_BITS - ALPHA_F_BITS), F_RING)  # H's share, as H truncates it
    return torch.cat([cb_f, cb_f * a_f.repeat_interleave(2)], dim=1), cb_narrow


def _opened_f(f_int: torch.Tensor, where: str) -> torch.Tensor:
    """f from its opened ring value, with the check that a failed truncation or a diverged step trips."""
    f = f_int.to(torch.float64) * (SQRT2 / 2.0 ** (ALPHA_F_BITS + 2 * COS_BITS))
    peak = float(f.abs().max()) if f.numel() else 0.0
    if not math.isfinite(peak) or peak >= F_LIMIT:
        raise RuntimeError(f"FDSKL sealed protocol: |f| reached {peak:.3g} {where} (a failed share truncation, "
                           f"probability about 2^-29 per coefficient and step, or a diverging step): rerun, or "
                           f"lower gamma")
    return f


class SealedMonitor:
    """Held-out f of the current iterate, opened to the active party at epoch ends (as ``shared`` opens its
    monitor rows): step 2's dealt row product on chunks of the monitor rows. ``X``: this party's monitor columns
    (the dealer's: m x 0); ``y`` at the active party."""

    def __init__(self, monitor, max_elements: int):
        self.X = monitor[0]
        self.y = None if monitor[1] is None else monitor[1].to(torch.float64).cpu()
        self.max_elements = max_elements

    def values(self, fed: Federation, fmap, alpha, known_h, *, A: int, H: int, dealer: int, table):
        rank, D = fed.rank, fmap.n_features
        chunk = max(1, self.max_elements // (4 * D))
        out = []
        for start in range(0, self.X.shape[0], chunk):
            rows = self.X[start:start + chunk]
            m = rows.shape[0]
            ph = star_phases(fmap, rows, range(fmap.n_blocks), dealer, H)
            x_f = y_f = None
            if rank == A:
                x_f, _ = _f_operands(rank, A, ph, alpha, None, table)
            elif rank in (H, dealer):
                y_f, _ = _f_operands(rank, A, ph, None, known_h, table)
            dealt = deal_dealt(fed, [y_f] if y_f is not None else None, holders=(A, H), dealer=dealer,
                               kind=["rowdot"], shapes_x=[(m, 4 * D)], shapes_y=[(m, 4 * D)], bits=[F_RING])
            z = mul_dealt(fed, x_f, y_f, holders=(A, H), dealer=dealer, kind="rowdot", shape_x=(m, 4 * D),
                          dealt=dealt[0] if dealt is not None else True, bits=F_RING)
            if rank in (A, H):
                f_int = open_shares(fed, z, holders=(A, H), to=A, shape=(m,), bits=F_RING)
                if rank == A:
                    out.append(_opened_f(f_int, "on the monitor rows"))
        return torch.cat(out) if rank == A and out else None


def _restore(resume, loop: TrainingLoop, sampler: BatchSampler, arrays: dict) -> int:
    """Put this rank back after a checkpoint's iteration t: its shares (A and H: alpha, m and the running total;
    the dealer: H's share of alpha as H last sent it), the curve and clock, the public batches; returns t."""
    from ..checkpoint import CheckpointError

    state, saved = resume
    try:
        t = int(state["t"])
        for k, mine in arrays.items():
            value = torch.from_numpy(saved[k].copy())
            if tuple(value.shape) != tuple(mine.shape) or value.dtype != mine.dtype:
                raise ValueError(f"{k} has {tuple(value.shape)} {value.dtype} values, this run {tuple(mine.shape)}")
            mine.copy_(value)
        loop.restore(state["loop"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the FDSKL checkpoint cannot be resumed ({exc}): delete the --checkpoint folder "
                              f"and start again") from None
    for _ in range(t):
        sampler.next()                       # (the batches of the iterations done: public, drawn and dropped)
    return t


def train_sealed(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, n_blocks: int,
                 dealer: int, table, monitor=None, log=None, progress: bool = False, checkpoint=None,
                 resume=None):
    """Train the D = n_blocks r feature model under the sealed protocol (SPMD: every party and the dealer).
    Returns a ``TrainResult`` whose alpha (float64, the averaged iterate) is at the active party only.
    ``monitor`` ((X, y), this party's columns of the held-out rows; y at the active party): the curve's points
    carry their metrics at epoch ends, of the current iterate (the returned model is the average).
    ``checkpoint(t, state, arrays)`` is called at every rank after each epoch end and the last iteration, with
    this rank's shares (uniform on their own); ``resume`` is such a (state, arrays) to go on from. The pad stream
    is not saved: A sends H a fresh seed at every start, and the dealer's copy of H's share is the saved one."""
    n = X.shape[0]
    for _ in range(n_blocks - fmap.n_blocks):
        fmap.add_block()
    D = fmap.n_features
    blocks = range(fmap.n_blocks)
    passive = [p for p in fed.parties if p != fed.active]
    holder = passive[0]
    A, H = fed.active, holder
    rank = fed.rank
    holds = rank in (A, H)
    index = 0 if rank == A else 1
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed)
    B = sampler.batch_size
    # epochs, a time budget (cfg.max_time: the active party's decision, one flag per iteration down the control
    # tree, as budget.py), or both; without an end known in advance the averaging starts after the first epoch
    max_iter = steps_of(n, cfg.batch_size, cfg.epochs) if cfg.epochs is not None else None
    average_from = max_iter // 2 if max_iter is not None else math.ceil(sampler.per_epoch)
    lr_int = int(round(cfg.gamma / B * SQRT2 * 2.0 ** (ALPHA_BITS - G_BITS + LR_SHIFT)))
    if lr_int < 1:
        raise VFLInputError(f"protocol='sealed': the step gamma / B = {cfg.gamma / B:.3g} is below the fixed point's "
                            f"resolution; raise gamma or lower batch_size")
    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    log_every = log_interval(cfg.log_every, max_iter)
    control_tree = pairwise_tree([A] + passive + [dealer])
    mon = SealedMonitor(monitor, cfg.max_elements) if monitor is not None else None
    if loop.bar is not None and max_iter is not None and cfg.max_time is None:
        # A run that will move a lot says so before it starts (issue 38), from the formula the tests check.
        line = announce(iteration_bytes("sealed", fed.num_parties, B, D, D), max_iter, extras=False)
        if line is not None:
            loop.bar.write(line, file=getattr(loop.bar, "fp", None))
    zero = torch.zeros(D, dtype=torch.int64)
    alpha, m, total = zero.clone(), zero.clone(), zero.clone()
    alpha_h = zero.clone()                  # at D: H's share of alpha, as H last sent it

    def saved():
        """This rank's part of a checkpoint: its shares (A and H), its copy of H's share (the dealer)."""
        return {"alpha": alpha, "m": m, "total": total} if holds else {"alpha_h": alpha_h} if rank == dealer else {}

    t = 0
    if resume is not None:
        t = _restore(resume, loop, sampler, saved())      # (into these tensors, before the loop rebinds them)
    pad = None
    with fed.phase(TRAIN_PHASE):
        if rank == A:
            seed = fresh_seed()
            fed.send(seed, H)
            pad = _stream_from(seed)
        elif rank == H:
            pad = _stream_from(fed.recv(A, (2,), torch.int64, device="cpu"))
    if rank == A:
        y = y.to(torch.float64).cpu()
    while max_iter is None or t < max_iter:
        started = time.perf_counter()
        with fed.phase(TRAIN_PHASE):
            batch = sampler.next()
            # (the dealer's X has no columns: the batch's rows of it are B x 0)
            ph = star_phases(fmap, X[batch.to(X.device)], blocks, dealer, H)
            shapes = [(B, 4 * D), (B, 2 * D)]
            x_f = x_g = y_f = y_g = ys = None
            if rank == A:
                x_f, cs_int = _f_operands(rank, A, ph, alpha, None, table)
            elif rank in (H, dealer):
                y_f, y_g = _f_operands(rank, A, ph, None, alpha if rank == H else alpha_h, table)
                ys = [y_f, y_g]
            # Both products' material in one message to A before any data message (sharing.deal_dealt).
            dealt = deal_dealt(fed, ys, holders=(A, H), dealer=dealer, kind=["rowdot", "coldot"], shapes_x=shapes,
                               shapes_y=shapes, bits=[F_RING, 64])
            mine = dealt if dealt is not None else [True, True]
            z = mul_dealt(fed, x_f, y_f, holders=(A, H), dealer=dealer, kind="rowdot", shape_x=shapes[0],
                          dealt=mine[0], bits=F_RING)
            f_int = open_shares(fed, z, holders=(A, H), to=A, shape=(B,), bits=F_RING) if holds else None
            if rank == A:
                f = _opened_f(f_int, f"at iteration {t}")
                yb = y[batch]
                d = cfg.loss.derivative(f, yb)
                loop.add_loss(float(cfg.loss.value(f, yb).mean()))
                if float(d.abs().max()) >= LPRIME_LIMIT:
                    raise RuntimeError("FDSKL sealed protocol: a loss derivative beyond 2^6; normalise the targets")
                x_g = cs_int * _fixed(d, LPRIME_BITS).unsqueeze(1)
            g = mul_dealt(fed, x_g, y_g, holders=(A, H), dealer=dealer, kind="coldot", shape_x=shapes[1],
                          dealt=mine[1], bits=64)
            if holds:
                m = truncate(m * MU_NUM, index, MU_SHIFT) + g
                alpha = alpha - truncate(m * lr_int, index, LR_SHIFT)
                if t >= average_from:
                    total = total + alpha
                rho = _uniform(pad, (D,))
                alpha = alpha + rho if rank == A else alpha - rho
            if rank == H:
                fed.send(alpha, dealer)
            elif rank == dealer:
                alpha_h = fed.recv(H, (D,), torch.int64, device="cpu")
        loop.tick(started)
        stop = False
        if cfg.max_time is not None:
            with fed.phase(TRAIN_PHASE):
                stop = _stop(fed, control_tree, loop.train_seconds >= cfg.max_time)
        final, epoch_end = step_marks(t + 1, max_iter, sampler.per_epoch)
        final = final or stop                   # (the time budget's last step: its point carries the monitor)
        if (t + 1) % log_every == 0 or final or epoch_end:
            f_mon = None
            if mon is not None and (final or epoch_end):
                with fed.phase(MONITOR_PHASE):
                    f_mon = mon.values(fed, fmap, alpha if rank == A else None, alpha if rank == H else alpha_h,
                                       A=A, H=H, dealer=dealer, table=table)
            loop.log_point(t + 1, D, f_mon, mon if f_mon is not None else None, cfg, log, control_tree)
        if checkpoint is not None and (final or epoch_end):
            checkpoint(t + 1, {"t": t + 1, "loop": loop.state()}, saved())
        t += 1
        if stop:
            break
    # The averaged iterate over the steps from average_from on; a run stopped before them opens the last alpha.
    count = t - average_from
    with fed.phase(TRAIN_PHASE):
        shares = (total if count > 0 else alpha) if holds else None
        opened = open_shares(fed, shares, holders=(A, H), to=A, shape=(D,)) if holds else None
    coef = None
    if rank == A:
        coef = opened.to(torch.float64) / (max(count, 1) * 2.0 ** ALPHA_BITS)
    return loop.result(coef, t)
