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
That is D numbers, alpha = sum_i C_i phi(x_i) with weights C_i that A knows; with the steps x B values of f, all
functions of the n d_P passive values: training refuses to start where n d_P < ``UNKNOWNS_PER_OPENED`` times
their count (``check_sealed``), and says what to change.

What each role receives: A, per step, S (uniform), the dealer's c_0 (uniform), H's share of f (f on I_t once
added), and once the averaged alpha; H: e = x - a (uniform), the dealer's seeds, A's pad seed; D: alpha_H after
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

from ..comm import Federation
from ..comm.sharing import _stream_from, _uniform, _word, deal_dealt, fresh_seed, mul_dealt, open_shares, truncate
from ..data.validation import VFLInputError
from .shared import REAL_PAIRS, cos_sin, star_phases
from .trainer import TRAIN_PHASE, BatchSampler, TrainingLoop

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


def check_sealed(n: int, passive_columns: int, D: int, batch: int, epochs: float) -> None:
    """Refuse a run whose openings could determine the passive values: the label holder is opened f on its batch
    rows at every step (steps x B numbers) and the trained coefficients (D), all functions of the n d_P passive
    values (W and b are public); the run needs at least ``UNKNOWNS_PER_OPENED`` unknowns per opened number."""
    if not passive_columns:
        return
    B = min(batch, n)
    f_values = steps_of(n, batch, epochs) * B
    unknowns = n * passive_columns
    if unknowns >= UNKNOWNS_PER_OPENED * (f_values + D):
        return
    room = unknowns // UNKNOWNS_PER_OPENED - f_values
    fix = (f"pass n_components <= {room}" if room >= 1 else
           "train for fewer epochs (the f values alone are too many) or with more passive columns")
    raise VFLInputError(
        f"protocol='sealed' opens the label holder f on its batch rows at every step ({f_values} values) and the "
        f"trained coefficients ({D}); with {n} rows and {passive_columns} passive columns that is more than "
        f"1/{UNKNOWNS_PER_OPENED} of the {unknowns} passive values: {fix}")


def _fixed(x: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.round(x * 2.0 ** bits).to(torch.int64)


def _narrow(table_words: torch.Tensor, bits: int) -> torch.Tensor:
    """The dealer's 16-bit fixed-point cosines rounded to ``bits`` fractional bits (the same integers at H and D)."""
    shift = 16 - bits
    return (table_words + (1 << (shift - 1))) >> shift


def train_sealed(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, n_blocks: int,
                 dealer: int, table, log=None, progress: bool = False):
    """Train the D = n_blocks r feature model under the sealed protocol (SPMD: every party and the dealer).
    Returns a ``TrainResult`` whose alpha (float64, the averaged iterate) is at the active party only."""
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
    if cfg.epochs is None:
        raise VFLInputError("protocol='sealed' needs epochs (a time budget is not supported yet)")
    max_iter = steps_of(n, cfg.batch_size, cfg.epochs)
    average_from = max_iter // 2
    lr_int = int(round(cfg.gamma / B * SQRT2 * 2.0 ** (ALPHA_BITS - G_BITS + LR_SHIFT)))
    if lr_int < 1:
        raise VFLInputError(f"protocol='sealed': the step gamma / B = {cfg.gamma / B:.3g} is below the fixed point's "
                            f"resolution; raise gamma or lower batch_size")
    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    zero = torch.zeros(D, dtype=torch.int64)
    alpha, m, total = zero.clone(), zero.clone(), zero.clone()
    alpha_h = zero.clone()                  # at D: H's share of alpha, as H last sent it
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
    for t in range(max_iter):
        started = time.perf_counter()
        with fed.phase(TRAIN_PHASE):
            batch = sampler.next()
            # (the dealer's X has no columns: the batch's rows of it are B x 0)
            ph = star_phases(fmap, X[batch.to(X.device)], blocks, dealer, H)
            shapes = [(B, 4 * D), (B, 2 * D)]
            x_f = x_g = y_f = y_g = ys = None
            if rank == A:
                cs = cos_sin(REAL_PAIRS, ph.S)                                    # B x 2D float [cos S, sin S]
                # (int32 words multiply mod 2**32: the small cosines times the 32 low bits of alpha's copy)
                cs_int = _fixed(cs, COS_BITS)                                    # (both products' cosines)
                cs_f = _word(cs_int, F_RING)
                a_f = _word(truncate(alpha, 0, ALPHA_BITS - ALPHA_F_BITS), F_RING)  # alpha's coarse copy (A's share)
                x_f = torch.cat([cs_f * a_f.repeat_interleave(2), cs_f], dim=1)
            elif rank in (H, dealer):
                beta = ph.groups[0][2]
                cb = cos_sin(table, beta)                                          # B x 2D, 16 fractional bits
                y_g = _narrow(cb, COS_BITS)                                      # (both products' cosines)
                cb_f = _word(y_g, F_RING)
                known = alpha if rank == H else alpha_h
                a_f = _word(truncate(known, 1, ALPHA_BITS - ALPHA_F_BITS), F_RING)  # H's share, as H truncates it
                y_f = torch.cat([cb_f, cb_f * a_f.repeat_interleave(2)], dim=1)
                ys = [y_f, y_g]
            # Both products' material in one message to A before any data message (sharing.deal_dealt).
            dealt = deal_dealt(fed, ys, holders=(A, H), dealer=dealer, kind=["rowdot", "coldot"], shapes_x=shapes,
                               shapes_y=shapes, bits=[F_RING, 64])
            mine = dealt if dealt is not None else [True, True]
            z = mul_dealt(fed, x_f, y_f, holders=(A, H), dealer=dealer, kind="rowdot", shape_x=shapes[0],
                          dealt=mine[0], bits=F_RING)
            f_int = open_shares(fed, z, holders=(A, H), to=A, shape=(B,), bits=F_RING) if holds else None
            if rank == A:
                f = f_int.to(torch.float64) * (SQRT2 / 2.0 ** (ALPHA_F_BITS + 2 * COS_BITS))
                peak = float(f.abs().max())
                if not math.isfinite(peak) or peak >= F_LIMIT:
                    raise RuntimeError(f"FDSKL sealed protocol: |f| reached {peak:.3g} at iteration {t} (a failed "
                                       f"share truncation, probability about 2^-29 per coefficient and step, or a "
                                       f"diverging step): rerun, or lower gamma")
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
    count = max_iter - average_from
    with fed.phase(TRAIN_PHASE):
        opened = open_shares(fed, total if holds else None, holders=(A, H), to=A, shape=(D,)) if holds else None
    coef = None
    if rank == A:
        coef = opened.to(torch.float64) / (count * 2.0 ** ALPHA_BITS)
    return loop.result(coef, max_iter)
