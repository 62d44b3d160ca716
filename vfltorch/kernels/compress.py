"""Compressing a trained bounded FDSKL model into fewer random features, once, so that prediction costs less.

Scoring m rows costs m D phases and (under ``shared``) one product of m x 2D
ring words: bytes proportional to D, whatever the training length. After
training the D-feature model (the teacher, alpha), the model keeps D' of its
features (the *support*, known to every rank) and distils the teacher into
them. Which D' (``support``):

* ``"public"`` (default): a seeded random subset of the D features, drawn
  from the public seed (``public_support``) by every rank on its own, with no
  message. It depends on (seed, D, D') only, not on the data or the labels:
  the random features are i.i.d., so this is a fresh random-feature model of
  D' features, fitted to the teacher.
* ``"alpha"``: the D' features with the largest |alpha_j| (phi_j has unit
  mean square, so |alpha_j| is feature j's weight in f), chosen by the active
  party and broadcast to every rank: every party and the dealer then learn
  which public features the labels made important (``SUPPORT_LEAK``).

Distillation: ``epochs``
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

Why distil (the first round, |alpha| support, D = 1024 teacher 84.77% on a9a): keeping the 384 largest
coefficients alone gave 84.42%, fine-tuning them on the training loss for an epoch 84.3-84.6%, a
least-squares fit of the teacher's f on the training rows 84.79%, and this distillation 84.81%.
At the defaults (D = 1536, ``benchmarks/fdskl_compress.py``, centralised): the public support with
D' = 496 keeps a9a, credit_default and give_me_some_credit within 0.35 point of the teacher but loses
2.2 points on the hard synthetic case and 1.3 on phishing; the |alpha| support loses 0.3 on hard
(docs/fdskl.md, *Compressed model*). Hence compression is not the default.

What it reveals (on top of training): with the public support, nothing new
to the passive parties and the dealer (they receive seeds and uniform values,
as in a training iteration); with ``support="alpha"`` every party and the
dealer learn the support, i.e. *which* D' of the D public random features the
model weights most (not the coefficients, their signs or any per-row value),
a function of the labels. Per
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
# compress_to="auto": the largest multiple of 16 for which scoring a9a's 16,281 test rows under shared at Q = 4 stays
# under 100 MB, per prediction ring width (bytes per row and feature: 6 of phases + 8, 6 or 5 of the product).
AUTO_COMPRESS = {32: 432, 24: 496, 20: 544}
SUPPORTS = ("public", "alpha")
SUPPORT_LEAK = ("compress_support='alpha' keeps the D' features with the largest |alpha_j| and tells every party and "
                "the dealer which ones: a function of the labels (which public random features matter for them). "
                "compress_support='public' (the default) draws the kept features from the public seed instead.")
MIN_STEPS = 100          # small data: an epoch is a few steps, too few to pull the pruned model back to the teacher


def public_support(D: int, keep: int, seed: int) -> torch.Tensor:
    """``keep`` of the D features (indices ascending), a seeded random subset: a function of (seed, D, keep) only."""
    g = torch.Generator().manual_seed(int(seed) & (2 ** 63 - 1))
    return torch.sort(torch.randperm(D, generator=g)[:keep]).values


def choose_support(alpha: torch.Tensor, keep: int) -> torch.Tensor:
    """The indices (ascending) of the ``keep`` largest |alpha_j| (rows of alpha summed for one-vs-rest)."""
    weight = alpha.abs() if alpha.dim() == 1 else alpha.abs().sum(dim=1)
    top = torch.topk(weight.to(torch.float64).cpu(), keep).indices
    return torch.sort(top).values


def compress_budget(fed: Federation, fmap, X: torch.Tensor, cfg, alpha, *, keep: int,
                    epochs: float, trained: int, dealer: int | None = None, table=None,
                    support: str = "public", support_seed: int = 0):
    """Prune to ``keep`` features and refit (module docstring); SPMD over the parties (and the dealer).

    ``alpha``: the trained D coefficients at the active party (None elsewhere);
    ``trained``: training's iteration count (the refit's rate starts where
    training's ended; under ``shared`` its equations count against the leak
    limit). ``support``: ``"public"`` (``public_support`` from ``support_seed``, every rank on
    its own) or ``"alpha"`` (the largest |alpha_j|, broadcast by the active party; see
    ``SUPPORT_LEAK``). Returns ``(support, alpha, result)``: the support (every rank), a
    D-vector of coefficients that is zero off the support (active party), and
    the refit's ``TrainResult`` (seconds, iterations, bytes of this party).
    """
    D = fmap.n_features
    n = X.shape[0]
    everyone = sorted(set(fed.parties) | ({dealer} if dealer is not None else set()))
    started = time.perf_counter()
    meter_before = _sent(fed)
    rule = support
    if rule not in SUPPORTS:
        raise ValueError(f"support must be one of {SUPPORTS}, got {rule!r}")
    with fed.phase(COMPRESS_PHASE):
        if rule == "public":
            support = public_support(D, keep, support_seed)
        else:
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
            # The largest |alpha_j| are a near-copy of the teacher: go on at the rate where training's schedule
            # ended. A public subset starts far from it (the dropped features' weight must move onto the kept
            # ones): restart training's schedule. Centralised, 1 pass, D' = 496, mean of 5 public subsets, ended
            # -> restarted: phishing 94.44 -> 94.75%, hard 93.79 -> 93.92%, a9a 85.11 -> 85.05%.
            done = trained if rule == "alpha" else 0
            rate = cfg.gamma / math.sqrt(1.0 + done / sampler.per_epoch)
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
