"""The kernel width by a federated held-out criterion (issue 16): a small grid of multipliers of sigma.

The median heuristic fixes the scale of the RBF kernel but not which scale
suits the data: on the nearly linear a9a twice the median width gains about
0.35 point of accuracy, on the synthetic ``hard`` set (a boundary made of
many small clusters) it loses 3 points (docs/fdskl.md). So, with
``sigma='median'`` and a ``sigma_grid`` of K multipliers c_k, the bounded
model (``budget.py``) first

1. splits the training rows by the public seed into a held-out part H
   (n / 5 rows, at most 3,000) and a selection part S (at most 6,000 of the
   rest): every party knows the indices, as it knows the mini-batches;
2. trains one candidate per multiplier, each the default model with width
   c_k sigma and half its random features (D / 2, Adam rate scaled by sqrt 2 as
   the default rate is for D / 2), on S for ``SELECT_EPOCHS`` epochs, *in
   lockstep* (``train_lockstep``): the K candidates' D / 2 features are stacked
   into one feature map of K D / 2 features (candidate k's feature j is the
   serial candidate's feature j: direction w_j / c_k, phase b_j), and every
   iteration evaluates all of them on the same public batch in one protocol
   round (one star of phases, one product for the K candidates' f on the batch
   rows, one for their gradient sums, each feature's sums weighted by its own
   candidate's L'); each candidate keeps its own coefficients and Adam state.
   The same batches, features and steps as K serial runs (centralised: the same
   numbers to the summation order), in 1 / K of their sequential rounds: at
   K = 2 each round has the messages of one iteration of the final model
   (D features), the f product carrying K columns;
3. evaluates the K candidates on H once, in one opening (``shared``: f of each
   candidate opened to the active party only, like one epoch-end monitor
   opening per candidate; ``paper``/Q = 1: the active party's own product);
4. the active party scores them (classification: held-out accuracy, ties
   broken by the lower held-out loss; regression: held-out squared error) and
   broadcasts the index of the best multiplier to every rank (the dealer too).

The final model is then trained from scratch on all rows with that width.
What this adds to what each party learns (the same as K serial runs): the
active party, per iteration K f values per batch row and K D / 2 gradient sums
(the candidates' batch values and gradient sums, the same kinds of value as
training's, within ``budget.leak_limit`` for |S| rows and K D / 2 unknown
features per row), and f of each candidate on H once; the passive parties and
the dealer, the index of the winning multiplier: a function of the labels of at
most log2(K) bits (2 bits for the default grid of four, issue 40), the only
label-dependent value they receive (everything else: seeds and uniform values,
as in training). Pass ``sigma`` (a number) or ``sigma_grid=(1.0,)`` to skip the
selection (and those bits).

Under ``protocol='sealed'`` (``select_width_sealed``) step 2 is K sealed runs,
one after the other (a sealed product sums f over all of a model's features:
no stacking), with momentum SGD at the rate for D / 2, and step 3 is each run's
ending: the active party is opened f of the candidate's averaged model on H,
never the candidate's coefficients. The same split, widths, features, epochs
and step 4.

The selection always computes f on batch t after step t - 1 (``f_delay=0``, the
paper's order), whatever ``f_delay`` the final model trains with.

The selection runs are not counted in a time budget (``max_time``), and ``train_seconds_`` is the
final training's clock; ``selection_seconds_`` holds the selection's.

Sets with fewer than ``SELECT_MIN_ROWS`` training rows skip the selection:
their held-out part would have fewer than 1,000 rows, too few to tell the
candidates apart (the standard error of an accuracy is about 1 point there).
"""

from __future__ import annotations

import functools
import math
import sys
import time

import numpy as np
import torch

from ..comm import Federation
from ..devices import to_host
from .budget import DEALER_WINDOW, _Optimizer, _shared_round, leak_limit, step_columns
from .random_features import FourierSampler, counter_words
from .sealed import setup_rows, steps_of, train_sealed
from .shared import TRAIN_BITS, StarProducts, DealerWindow, _factors32, shared_decision_values
from .traffic import announce_selection, sealed_selection_bytes
from .trainer import BatchSampler

SELECT_MIN_ROWS = 5000
SELECT_HELD_OUT = 3000
SELECT_TRAIN = 6000
# Epochs of the candidates' runs. 2 until the lockstep version; 1.5 chooses the same width on a9a (2x), hard, phishing,
# credit_default, give_me_some_credit and cal_housing (1x), with held-out margins 0.53, 2.1, 0.7, 0.6, 0.17 points and
# 0.054 in squared error (2 epochs: 0.87, 2.5, 0.6, 0.07, 0.27, 0.054); 1 epoch also chose the same, but
# give_me_some_credit by one held-out row in 3,000 (0.5 epoch: credit_default flipped). docs/fdskl.md, *Kernel width*.
SELECT_EPOCHS = 1.5
SELECT_BLOCKS = 0.5              # the candidates have half the model's random features
# The candidates' batch: None, the model's rule for |S| rows (n / 128 in [32, 256]: 46 for 6,000 rows). Larger batches
# (fewer rounds) flipped choices (docs/design/2026-11-24-fdskl-defaults-and-fit-time.md,
# *Issue 16: the fit time, second round*); benchmarks/fdskl_selection.py
# sets it to measure that.
SELECT_BATCH = None
SELECT_PHASE = "fdskl/select"


def split_sizes(n: int) -> tuple[int, int]:
    """(|S|, |H|) for n training rows (step 1)."""
    h = min(n // 5, SELECT_HELD_OUT)
    return min(n - h, SELECT_TRAIN), h


def selection_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(selection rows S, held-out rows H) from the public seed, the same at every party."""
    s, h = split_sizes(n)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed) % (2 ** 63)))
    return perm[h:h + s], perm[:h]


def wants_selection(n: int, grid) -> bool:
    return len(grid) > 1 and n >= SELECT_MIN_ROWS


def selection_openings(n: int, grid, batch_size) -> int:
    """How many f values the sealed selection opens to the active party on n training rows (0: no selection): per
    candidate, f on its batch rows (``SELECT_EPOCHS`` passes over S, ``batch_size(|S|)`` rows a step) and on H."""
    if not wants_selection(n, grid):
        return 0
    rows, held = split_sizes(n)
    B = int(batch_size(rows))
    return len(grid) * (steps_of(rows, B, SELECT_EPOCHS) * min(B, rows) + held)


class StackedSampler:
    """The directions of K candidate feature maps side by side: feature k * half + j is the j-th feature of the
    sampler of width c_k sigma (``FourierSampler(kernel, c_k sigma, seed)``), bit for bit."""

    def __init__(self, base: FourierSampler, multipliers, half: int):
        self.kernel, self.sigma, self.seed = base.kernel, base.sigma, base.seed
        self.half = int(half)
        self.samplers = [FourierSampler(base.kernel, base.sigma * float(c), base.seed) for c in multipliers]

    def omega(self, columns, features, *, dtype=torch.float64, device="cpu") -> torch.Tensor:
        features = torch.as_tensor(features, dtype=torch.int64).reshape(-1)
        columns = torch.as_tensor(columns, dtype=torch.int64).reshape(-1)
        out = torch.empty(len(columns), len(features), dtype=dtype, device=device)
        which = features // self.half
        for k, sampler in enumerate(self.samplers):
            at = (which == k).nonzero().reshape(-1)
            if len(at):
                out[:, at.to(device)] = sampler.omega(columns, features[at] % self.half, dtype=dtype, device=device)
        return out


def stacked_map(fmap, multipliers, half_blocks: int):
    """``fmap`` (a fresh ``FederatedFeatureMap`` of the median width) made into the K candidates' stacked map:
    K x ``half_blocks`` blocks, candidate k's block k * half_blocks + s with the directions and phases b_j of the
    serial candidate's block s (its keeper is drawn per stacked block, as any block's)."""
    if fmap.n_blocks:
        raise ValueError("stacked_map needs a feature map without blocks")
    half = half_blocks * fmap.block_size
    fmap.sampler = StackedSampler(fmap.sampler, multipliers, half)
    for _ in range(len(multipliers) * half_blocks):
        t = fmap.add_block()
        if t in fmap.phase_words:               # b_j of the serial candidate's feature j (public under shared)
            fmap.phase_words[t] = counter_words(fmap._phase_key, fmap.block_features(t) % half,
                                                fmap.circle.bits).to(fmap.device)
    return fmap


class _LockstepProducts(StarProducts):
    """``StarProducts`` for K stacked candidates: ``forward`` with the D x K coefficients (candidate k's alpha on its
    features, 0 elsewhere) gives the K candidates' f on the batch rows; ``gradient`` takes the m x K row weights
    (each candidate's L') and weights feature j's sum by the weights of its candidate (j // half). The same
    operand layout, bytes and openings as one product of row weights: only A's operand differs."""

    def __init__(self, *args, half: int, **kw):
        super().__init__(*args, **kw)
        self.half = half

    def _gradient_x(self, weights: torch.Tensor):
        """Column j's sum weighted by its candidate's row weights (j // half), scaled per candidate (``_scales``)."""
        w = _factors32(weights)                                                 # m x K, sqrt2 w, float32
        s = self._scales(1, w)                                                  # (K,): one per candidate
        ws = torch.from_numpy((w * s).astype(np.float32))                 # (in float64, as in _forward_x)
        which = self.grad_cols // self.half
        cs = self._cos_sin_S().view(self.m, self.D, 2)
        if not self._all(self.grad_cols):
            cs = cs[:, self.grad_cols]
        x = cs * ws[:, which].unsqueeze(2)
        return x.reshape(self.m, 2 * len(self.grad_cols)), torch.from_numpy(s[which.numpy()])


def train_lockstep(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, K: int,
                   dealer: int | None = None, table=None) -> tuple[list | None, int]:
    """Train K candidates stacked in ``fmap`` (``stacked_map``: K equal runs of features) on the same batches, in
    one protocol pass (module docstring, step 2). Returns (the K coefficient vectors at the active party, None
    elsewhere; iterations). SPMD over the parties and (``dealer``: the shared protocol) the dealer."""
    n = X.shape[0]
    D, r = fmap.n_features, fmap.block_size
    half = D // K
    shared = dealer is not None
    active = fed.is_active
    # The candidates' steps run on the party's device under the paper's protocol (and Q = 1), on the host under the
    # shared one (host products), as in training (budget.py).
    opt_device = torch.device("cpu") if shared else X.device
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed, device=opt_device)
    B = sampler.batch_size
    max_iter = max(1, math.ceil(cfg.epochs * sampler.per_epoch - 1e-9))
    grad_per_step = half if cfg.solver == "adam" else r
    if shared:                  # each candidate's equations (B + its sums per step) below half its n x half unknowns
        max_iter = min(max_iter, leak_limit(n, half, B, grad_per_step))
    opts = ([_Optimizer(cfg, half, r, sampler.per_epoch, max_iter, device=opt_device) for _ in range(K)]
            if active else None)
    if active:
        y = y.to(device=opt_device, dtype=torch.float64)
    blocks = range(fmap.n_blocks)
    window = DealerWindow(fed, dealer) if shared else None
    window_size, buffered = 1, 0
    bits = TRAIN_BITS if cfg.product_bits == 20 else (32, 32)
    for t in range(max_iter):
        batch = sampler.next()
        Xb = X[batch.to(X.device)]
        cols = step_columns(cfg.solver, half, r, t)
        grad_cols = torch.cat([k * half + cols for k in range(K)])
        coef = None
        if active and shared:
            coef = torch.zeros(D, K, dtype=torch.float64)
            for k, opt in enumerate(opts):
                coef[k * half:(k + 1) * half, k] = opt.alpha
        with fed.phase(f"{SELECT_PHASE}/train"):
            if shared:
                prod = _shared_round(fed, fmap, Xb, blocks, dealer, table, B, t, cfg.solver, r, D, window,
                                     bits=bits, grad_cols=grad_cols,
                                     products=functools.partial(_LockstepProducts, classes=K, half=half))
                f = prod.forward(coef)                                           # B x K at A
                d_loss = cfg.loss.derivative(f, y[batch].unsqueeze(1)) if active else None
                sums = prod.gradient(d_loss)                                     # K x len(cols), candidate-major
                buffered += 1
                if buffered >= window_size or t + 1 == max_iter:
                    with fed.phase(f"{fed.current_phase}/deal"):
                        window.flush()
                    buffered, window_size = 0, min(2 * window_size, DEALER_WINDOW)
            else:
                phi = fmap.features(Xb, blocks)                                  # B x D at A
                sums = None
                if active:
                    phi = phi.to(torch.float64)
                    f = torch.stack([phi[:, k * half:(k + 1) * half] @ opt.alpha for k, opt in enumerate(opts)], 1)
                    d_loss = cfg.loss.derivative(f, y[batch].unsqueeze(1))
                    sums = torch.cat([phi[:, k * half + cols].T @ d_loss[:, k] for k in range(K)])
        if active:
            for k, opt in enumerate(opts):
                opt.step(t, cols, sums[k * len(cols):(k + 1) * len(cols)], B)
    if window is not None:
        window.drain()
    return ([opt.model for opt in opts] if active else None), max_iter


def select_width(fed: Federation, make_map, X: torch.Tensor, y: torch.Tensor | None, make_cfg, *, grid,
                 n_blocks: int, seed: int, dealer: int | None, table, task: str) -> tuple[int, list | None, float]:
    """Train the candidates of ``grid`` in lockstep and return (index of the best, the active party's scores or None
    elsewhere, seconds). SPMD over the parties and (shared protocol) the dealer.

    ``make_map(1.0)``: a fresh ``FederatedFeatureMap`` of the median width (stacked here, ``stacked_map``);
    ``n_blocks``: blocks per candidate; ``make_cfg(rows)``: the training config for ``rows`` rows (its epochs are
    replaced by ``SELECT_EPOCHS``).
    """
    started = time.perf_counter()
    rows, held = selection_rows(X.shape[0], seed)
    cfg = make_cfg(len(rows))
    cfg.epochs, cfg.max_time, cfg.log_every = SELECT_EPOCHS, None, None
    if SELECT_BATCH is not None:
        cfg.batch_size = int(SELECT_BATCH)
    active = fed.is_active
    K = len(grid)
    fmap = stacked_map(make_map(1.0), grid, n_blocks)
    alphas, _ = train_lockstep(fed, fmap, X[rows.to(X.device)], y[rows] if active else None, cfg, K=K,
                               dealer=dealer, table=table)
    half = fmap.n_features // K
    coef = None
    if active:
        # (where the candidates' coefficients are: the host under the shared protocol, else the party's device)
        coef = torch.zeros(fmap.n_features, K, dtype=torch.float64, device=alphas[0].device)
        for k, a in enumerate(alphas):
            coef[k * half:(k + 1) * half, k] = a
    X_held = X[held.to(X.device)]
    with fed.phase(f"{SELECT_PHASE}/held-out"):
        if dealer is not None:
            f = shared_decision_values(fed, fmap, X_held, coef, dealer=dealer, table=table,
                                       max_elements=cfg.max_elements, classes=K)
        else:
            phi = fmap.features(X_held, range(fmap.n_blocks))
            f = None if phi is None else phi.to(torch.float64) @ coef
    return _pick(fed, f, y[held] if active else None, grid, cfg.loss, task, dealer, started)


def _pick(fed: Federation, f, y_held, grid, loss_fn, task: str, dealer: int | None, started: float
          ) -> tuple[int, list | None, float]:
    """Step 4: the active party scores the K candidates' held-out f (rows x K) and broadcasts the best index to
    every rank (the dealer too); returns (index, the active party's scores or None elsewhere, seconds)."""
    scores = None
    pick = None
    if fed.is_active:
        scores = []
        y_held = to_host(y_held, torch.float64)          # (a score: on the host, one copy of f)
        f = to_host(f, torch.float64)
        for k, c in enumerate(grid):
            fk = f[:, k]
            loss = float(loss_fn.value(fk, y_held).mean())
            if not math.isfinite(loss):
                loss = float("inf")
            if task == "binary":
                acc = float(((fk >= 0).to(torch.float64) * 2 - 1 == y_held).to(torch.float64).mean())
                scores.append({"multiplier": float(c), "accuracy": acc, "loss": loss})
            else:
                scores.append({"multiplier": float(c), "mse": float(((fk - y_held) ** 2).mean()), "loss": loss})
        key = (lambda s: (-s["accuracy"], s["loss"])) if task == "binary" else (lambda s: (s["mse"],))
        pick = {"index": min(range(len(scores)), key=lambda i: key(scores[i]))}
    ranks = fed.parties + ([dealer] if dealer is not None else [])
    with fed.phase(SELECT_PHASE):
        pick = fed.broadcast_json(pick, fed.active, ranks=ranks)
    return int(pick["index"]), scores, time.perf_counter() - started


def select_width_sealed(fed: Federation, make_map, X: torch.Tensor, y: torch.Tensor | None, make_cfg, *, grid,
                        n_blocks: int, seed: int, dealer: int, table, task: str, progress: bool = False
                        ) -> tuple[int, list | None, float]:
    """The width selection under ``protocol='sealed'``: the same split, candidates, epochs and choice as
    ``select_width``, each candidate trained by ``sealed.train_sealed`` on S, one after the other (the sealed
    protocol sums f over all of a model's features: K candidates are K runs), with fresh secrets each. A candidate's
    coefficients stay in H's and D's shares and are dropped: the active party is opened f on the candidate's batch
    rows (as in training) and f of its averaged model on H once, nothing else; the other ranks learn the index.

    ``make_map(c)``: a fresh ``FederatedFeatureMap`` of width c x the median width; ``make_cfg(rows)``: the sealed
    training config of a candidate (its rate for ``n_blocks`` blocks; epochs replaced by ``SELECT_EPOCHS``).
    ``progress``: the active party prints the selection's bytes first (``traffic.announce_selection``)."""
    started = time.perf_counter()
    rows, held = selection_rows(X.shape[0], seed)
    cfg = make_cfg(len(rows))
    cfg.epochs, cfg.max_time, cfg.log_every = SELECT_EPOCHS, None, None
    active = fed.is_active
    X_fit, X_held = X[rows.to(X.device)], X[held.to(X.device)]
    maps = [make_map(float(c)) for c in grid]
    if progress and active:
        D = n_blocks * maps[0].block_size
        B = min(cfg.batch_size, len(rows))
        line = announce_selection(sealed_selection_bytes(
            fed.num_parties, D, len(rows), len(held), B, steps_of(len(rows), B, SELECT_EPOCHS),
            setup_rows(D, cfg.max_elements), max(1, cfg.max_elements // D), len(grid)), len(grid))
        if line:
            print(line, file=sys.stderr, flush=True)
    f = []
    for k, fmap in enumerate(maps):
        result = train_sealed(fed, fmap, X_fit, y[rows] if active else None, cfg, n_blocks=n_blocks,
                              dealer=dealer, table=table, held_out=X_held, phase=f"{SELECT_PHASE}/{k}")
        f.append(result.held_out_f)
    return _pick(fed, torch.stack(f, 1) if active else None, y[held] if active else None, grid, cfg.loss, task,
                 dealer, started)
