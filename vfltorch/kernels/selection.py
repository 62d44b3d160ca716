"""The kernel width by a federated held-out criterion (issue 16): a small grid of multipliers of sigma.

The median heuristic fixes the scale of the RBF kernel but not which scale
suits the data: on the nearly linear a9a twice the median width gains about
0.35 point of accuracy, on the synthetic ``hard`` set (a boundary made of
many small clusters) it loses 3 points (docs/fdskl.md). So, with
``sigma='median'`` and a ``sigma_grid`` of several multipliers c, the bounded
model (``budget.py``) first

1. splits the training rows by the public seed into a held-out part H
   (n / 5 rows, at most 3,000) and a selection part S (at most 6,000 of the
   rest): every party knows the indices, as it knows the mini-batches;
2. for each multiplier c trains the default model with width c * sigma and
   half its random features (D / 2, Adam rate scaled by sqrt 2 as the default
   rate is for D / 2) on S for ``SELECT_EPOCHS`` epochs (the same protocol,
   the same messages as training; a fresh model per candidate);
3. evaluates that model on H once (``shared``: f opened to the active party
   only, the same one opening per model as the end of an epoch's monitor;
   ``paper``/Q = 1: the active party's own product);
4. the active party scores it (classification: held-out accuracy, ties broken
   by the lower held-out loss; regression: held-out squared error) and
   broadcasts the index of the best multiplier to every rank (the dealer too).

The final model is then trained from scratch on all rows with that width.
What this adds to what each party learns: the active party, f on |H| rows per
candidate and the selection runs' batch values and gradient sums (the same
kinds of value as training's, within ``budget.leak_limit`` for S rows); the
passive parties and the dealer, the index of the winning multiplier: a function
of the labels of at most log2(len(grid)) bits (1 bit for the default grid), the
only label-dependent value they receive. Pass ``sigma`` (a number) or
``sigma_grid=(1.0,)`` to skip the selection (and that bit).

The selection runs are not counted in a time budget (``max_time``), and ``train_seconds_`` is the
final training's clock; ``selection_seconds_`` holds the selection's.

Sets with fewer than ``SELECT_MIN_ROWS`` training rows skip the selection:
their held-out part would have fewer than 1,000 rows, too few to tell the
candidates apart (the standard error of an accuracy is about 1 point there).
"""

from __future__ import annotations

import math
import time

import torch

from ..comm import Federation
from .budget import train_budget
from .shared import shared_decision_values

SELECT_MIN_ROWS = 5000
SELECT_HELD_OUT = 3000
SELECT_TRAIN = 6000
SELECT_EPOCHS = 2.0
SELECT_BLOCKS = 0.5              # the candidates have half the model's random features


def selection_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(selection rows S, held-out rows H) from the public seed, the same at every party."""
    h = min(n // 5, SELECT_HELD_OUT)
    s = min(n - h, SELECT_TRAIN)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed) % (2 ** 63)))
    return perm[h:h + s], perm[:h]


def wants_selection(n: int, grid) -> bool:
    return len(grid) > 1 and n >= SELECT_MIN_ROWS


def select_width(fed: Federation, make_map, X: torch.Tensor, y: torch.Tensor | None, make_cfg, *, grid,
                 n_blocks: int, seed: int, dealer: int | None, table, task: str) -> tuple[int, list | None, float]:
    """Train one short model per multiplier in ``grid`` and return (index of the best, the active party's
    scores or None elsewhere, seconds). SPMD over the parties and (shared protocol) the dealer.

    ``make_map(c)``: a fresh ``FederatedFeatureMap`` of width c * sigma; ``make_cfg(rows)``: the training
    config for ``rows`` rows (its epochs are replaced by ``SELECT_EPOCHS``).
    """
    started = time.perf_counter()
    rows, held = selection_rows(X.shape[0], seed)
    cfg = make_cfg(len(rows))
    cfg.epochs, cfg.max_time, cfg.log_every = SELECT_EPOCHS, None, None
    active = fed.is_active
    scores = [] if active else None
    for c in grid:
        fmap = make_map(float(c))
        result = train_budget(fed, fmap, X[rows.to(X.device)], y[rows] if active else None, cfg,
                              n_blocks=n_blocks, dealer=dealer, table=table)
        X_held = X[held.to(X.device)]
        if dealer is not None:
            f = shared_decision_values(fed, fmap, X_held, result.alpha, dealer=dealer, table=table,
                                       max_elements=cfg.max_elements)
        else:
            f = fmap.decision_values(X_held, result.alpha)
        if active:
            f = f.to(torch.float64).cpu()
            y_held = y[held].to(torch.float64).cpu()
            loss = float(cfg.loss.value(f, y_held).mean())
            if not math.isfinite(loss):
                loss = float("inf")
            if task == "binary":
                acc = float(((f >= 0).to(torch.float64) * 2 - 1 == y_held).to(torch.float64).mean())
                scores.append({"multiplier": float(c), "accuracy": acc, "loss": loss})
            else:
                scores.append({"multiplier": float(c), "mse": float(((f - y_held) ** 2).mean()), "loss": loss})
    pick = None
    if active:
        key = (lambda s: (-s["accuracy"], s["loss"])) if task == "binary" else (lambda s: (s["mse"],))
        pick = {"index": min(range(len(scores)), key=lambda i: key(scores[i]))}
    ranks = fed.parties + ([dealer] if dealer is not None else [])
    with fed.phase("fdskl/select"):
        pick = fed.broadcast_json(pick, fed.active, ranks=ranks)
    return int(pick["index"]), scores, time.perf_counter() - started
