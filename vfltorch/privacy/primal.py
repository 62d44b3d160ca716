"""Primal DP-SCD (the paper's Algorithm 2, in the form implemented here): coordinate steps on theta.

The coordinates are now the d features. One step:

    B: a Poisson batch (rate q = L / N);  w_B = X_B theta (the batch's margins)
    for k in a random order of the d coordinates:
        zeta_k = clip(argmin_zeta h_k(zeta), C)     (h_k in ``glm.py``: the batch's loss along coordinate k)
        theta_k += zeta_k;   w_B += zeta_k X_{B,k}
    theta += N(0, sigma^2 S^2 I_d)

Every coordinate step depends on every example of the batch, so one example
can move all d clipped steps, each by at most 2C; w_B is recomputed from the
released theta at every step and never released. The L2 sensitivity of the
step is therefore

    S = 2 C sqrt(d).

The issue states 2 C sqrt(L (L + 1)) for the primal variant, the seqDP-SCD
constant: that bound fits a variant that makes L coordinate steps per batch
and also releases a noisy auxiliary vector of the L batch margins (4 C^2 L
from theta, 4 C^2 L^2 from w_B with unit-norm rows). We could not read the
paper's appendix to settle which; the constant here is the one that is
correct for the algorithm in this file (and smaller whenever d < L (L + 1)).

Centralised only: in a federation every coordinate step would hand the
active party w_B before and after zeta_k X_{B,k}, i.e. a scaled slice of a
raw column of another party, which vfltorch never lets leave its owner.
"""

from __future__ import annotations

import math

import torch

from ..data import VFLInputError
from .dpscd import clip


def sensitivity(C: float, d: int) -> float:
    """L2 sensitivity of one primal DP-SCD step over d coordinates: 2 C sqrt(d)."""
    return 2.0 * C * math.sqrt(d)


def check_centralised(fed) -> None:
    if fed.num_parties > 1:
        raise VFLInputError(
            "primal DP-SCD cannot run across parties: each coordinate step would show the active party "
            "a scaled slice of another party's raw column. Use --variant dual (DP-SCD, the paper's method), "
            "or --parties 1 for the centralised primal baseline.")


def primal_steps(ctx):
    """Run the primal variant (one party); yield (t, batch, zeta over the d coordinates) after every step."""
    check_centralised(ctx.fed)
    X, st = ctx.X, ctx.state
    theta = st.v
    d = X.shape[1]
    coords = ctx.randomness.torch("primal/coordinate-order")
    for t, batch in enumerate(ctx.sampler):
        rows = batch.to(X.device)
        XB = X.index_select(0, rows)
        yB = ctx.y[rows]
        w = XB @ theta
        zeta = X.new_zeros(d)
        for k in torch.randperm(d, generator=coords).tolist():
            xk = XB[:, k]
            z = clip(ctx.glm.primal_step(theta[k], w, yB, xk, ctx.lam, ctx.L), ctx.C)
            theta[k] += z
            w += z * xk
            zeta[k] = z
        theta += ctx.v_noise()
        yield t, batch, zeta


def model_block(ctx) -> torch.Tensor:
    return ctx.state.v
