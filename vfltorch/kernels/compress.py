"""Compressing a trained bounded FDSKL model into fewer random features, once, so that prediction costs less.

Scoring m rows costs m D phases and (under ``shared``) one product of m x 2D
ring words: bytes proportional to D, whatever the training length. After
training the D-feature model (the teacher, alpha), the active party keeps the
D' features with the largest |alpha_j| (phi_j has unit mean square, so
|alpha_j| is feature j's weight in f), announces their indices (the
*support*) to every rank, and distils the teacher into them: ``epochs``
passes of mini-batches (B rows, as in training) in which the parties evaluate
all D features on the batch rows (the same protocol as a training iteration:
``shared.star_phases`` + ``StarProducts`` under ``shared``, the phase star of
``FederatedFeatureMap.star_phases`` under ``paper``), the active party gets the
residual r_i = f_student(x_i) - f_teacher(x_i) (one product with coefficients
alpha' - alpha, alpha' zero off the support) and the D' gradient sums
sum_i r_i phi_j(x_i), and takes Adam steps on alpha' (warm-started from the
pruned alpha, at the rate where training's schedule ended, iterates averaged
over the second half; at least ``MIN_STEPS`` = 100 steps, since on small
data an epoch is too few). Prediction then evaluates the D' kept features: D / D'
times fewer bytes. Only the Adam solver is compressed (``dsg`` models predict
with all D features).

Why distil: on a9a (centralised, seed 0; D = 1024 teacher 84.77%), keeping the
384 largest coefficients alone gave 84.42%, fine-tuning them on the training
loss for an epoch 84.3-84.6%, a least-squares fit of the teacher's f on the
training rows 84.79%, and this distillation 84.81% (D' = 256: 84.76%). On the
hard synthetic case (teacher 95.91%): D' = 384 95.41%, 432 95.54% (3 epochs:
95.62%), 512 95.66% (docs/fdskl.md, *Prediction bytes*).

What it reveals (on top of training): every party and the dealer learn the
support, i.e. *which* D' of the D public random features the model weights
most (not the coefficients, their signs or any per-row value); per
distillation step the active party learns B residuals and D' gradient sums,
linear in the unknown feature values like training's f values and gradient
sums, and under ``shared`` they count against the same budget
(``budget.leak_limit``): distillation stops before training's and its
equations together reach half the n D unknowns. Passive parties and the dealer
receive what a training iteration gives them (seeds and uniform values).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from ..comm import Federation
from .budget import _Optimizer
from .shared import StarProducts, star_phases
from .trainer import BatchSampler, TrainResult

COMPRESS_PHASE = "fdskl/compress"
AUTO_COMPRESS = 432     # compress_to="auto": a9a's test rows under 100 MB at Q = 4 under shared
MIN_STEPS = 100          # small data: an epoch is a few steps, too few to pull the pruned model back to the teacher


def choose_support(alpha: torch.Tensor, keep: int) -> torch.Tensor:
    """The indices (ascending) of the ``keep`` largest |alpha_j| (rows of alpha summed for one-vs-rest)."""
    weight = alpha.abs() if alpha.dim() == 1 else alpha.abs().sum(dim=1)
    top = torch.topk(weight.to(torch.float64).cpu(), keep).indices
    return torch.sort(top).values


def compress_budget(fed: Federation, fmap, X: torch.Tensor, cfg, alpha, *, keep: int,
                    epochs: float, trained: int, dealer: int | None = None, table=None):
    """Prune to ``keep`` features and refit (module docstring); SPMD over the parties (and the dealer).

    ``alpha``: the trained D coefficients at the active party (None elsewhere);
    ``trained``: training's iteration count (the refit's rate starts where
    training's ended; under ``shared`` its equations count against the leak
    limit). Returns ``(support, alpha, result)``: the support (every rank), a
    D-vector of coefficients that is zero off the support (active party), and
    the refit's ``TrainResult`` (seconds, iterations, bytes of this party).
    """
    D = fmap.n_features
    n = X.shape[0]
    everyone = sorted(set(fed.parties) | ({dealer} if dealer is not None else set()))
    started = time.perf_counter()
    meter_before = _sent(fed)
    with fed.phase(COMPRESS_PHASE):
        chosen = choose_support(alpha, keep).tolist() if fed.is_active else None
        support = torch.tensor(fed.broadcast_json(chosen, fed.active, ranks=everyone), dtype=torch.int64)
        sampler = BatchSampler(n, cfg.batch_size, cfg.seed ^ 0xC0411)
        B = sampler.batch_size
        iters = max(MIN_STEPS, math.ceil(epochs * sampler.per_epoch - 1e-9)) if epochs > 0 else 0
        if dealer is not None:
            # The equations the active party holds after training: trained (B + G); each refit step adds
            # B + D' (the residual on the batch rows, the D' gradient sums); all below n D / 2.
            G = D if cfg.solver == "adam" else fmap.block_size
            iters = max(0, min(iters, (n * D // 2 - trained * (B + G)) // (B + keep)))
        opt = None
        if fed.is_active:
            rate = cfg.gamma / math.sqrt(1.0 + trained / sampler.per_epoch)   # where training's schedule ended
            opt = _Optimizer(replace(cfg, gamma=rate, solver="adam"), keep, keep, sampler.per_epoch, iters)
            opt.alpha = alpha.to(torch.float64).cpu()[support].clone()
        cols = torch.arange(keep)
        teacher = alpha.to(torch.float64).cpu() if fed.is_active else None
        every = torch.arange(D)
        for t in range(iters):
            batch = sampler.next()
            Xb = X[batch.to(X.device)]
            coef = None
            if opt is not None:
                coef = -teacher                                   # student minus teacher, on all D features
                coef[support] += opt.alpha
            if dealer is not None:
                # All D features' phases (the teacher needs them), the residual f_student - f_teacher on the
                # batch rows as one product, then the gradient sums over the kept features only.
                ph = star_phases(fmap, Xb, range(fmap.n_blocks), dealer, fmap.keeper_of(trained + t))
                prod = StarProducts(fed, ph, table, dealer, B, grad_cols=support)
                sums = prod.gradient(prod.forward(coef))
            else:
                theta = fmap.star_phases(Xb, every)
                sums = None
                if opt is not None:
                    phi = fmap.circle.decode(theta, torch.float64).cos_().mul_(math.sqrt(2.0)).cpu()
                    sums = phi[:, support].T @ (phi @ coef)
            if opt is not None:
                opt.step(t, cols, sums, B)
    out = None
    if fed.is_active:
        out = torch.zeros(D, dtype=torch.float64)
        out[support] = opt.model if iters else opt.alpha
        out = out.to(alpha.dtype)
    sent, messages = _sent(fed)
    result = TrainResult(alpha=out, iterations=iters, train_seconds=time.perf_counter() - started,
                         bytes_sent=sent - meter_before[0], messages_sent=messages - meter_before[1])
    return support, out, result


def _sent(fed: Federation) -> tuple[int, int]:
    from .trainer import phase_totals

    totals = phase_totals(fed, COMPRESS_PHASE)
    return int(totals["bytes_sent"]), int(totals.get("messages_sent", 0))
