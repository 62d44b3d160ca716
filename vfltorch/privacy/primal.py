"""Primal DP-SCD: coordinate steps on theta. Two variants.

``primal`` - the paper's Algorithm 2. Every step uses *all* N examples and L of the d coordinates
(secretly drawn, ``sampling.CoordinateSampler``); the auxiliary vector is w = X theta (the N margins):

    for k in the L coordinates, in order:
        zeta_k = clip(argmin_zeta h_k(zeta), C)     (h_k in ``glm.py``: the mean loss over all N rows)
        theta_k += zeta_k;   w += zeta_k X_{:,k}
    theta_B += N(0, sigma^2 S^2 I_L);   w += N(0, sigma^2 S^2 I_N)     (both are released)

Lemma 4: with feature *columns* of L2 norm <= 1, replacing one example moves each of the L
sequential clipped steps by at most 2C, so ||Delta theta_B||^2 <= 4 C^2 L and ||Delta w||^2 <=
(2 C L)^2:

    S = 2 C sqrt(L (L + 1)).

No example is subsampled: the accountant composes T Gaussian mechanisms at sampling rate 1.

``primal-rows`` - the variant this file held before (kept, honestly named): a Poisson batch of
*examples*, margins w_B = X_B theta from the released theta, a sweep over all d coordinates in a
secret random order, then theta += N(0, sigma^2 S^2 I_d). One example can move all d clipped
steps, each by at most 2C: S = 2 C sqrt(d).

Both are centralised only: in a federation every coordinate step would hand the active party
zeta_k X_{:,k} (or X_{B,k}), a scaled slice of a raw column of another party, which vfltorch never
lets leave its owner.
"""

from __future__ import annotations

import math

import torch

from ..data import VFLInputError
from .config import check_primal_parties
from .dpscd import clip


COLUMN_NORM_SLACK = 1e-6


def sensitivity(C: float, L: int) -> float:
    """L2 sensitivity of one step of Algorithm 2 (L coordinates, theta_B and w released): 2 C sqrt(L (L + 1))."""
    return 2.0 * C * math.sqrt(L * (L + 1))


def rows_sensitivity(C: float, d: int) -> float:
    """L2 sensitivity of one ``primal-rows`` step over d coordinates: 2 C sqrt(d)."""
    return 2.0 * C * math.sqrt(d)


def check_columns(X) -> None:
    norms = (X.to(torch.float64) ** 2).sum(dim=0).sqrt()
    if norms.numel() and float(norms.max()) > 1.0 + COLUMN_NORM_SLACK:
        k = int(torch.argmax(norms))
        raise VFLInputError(
            f"primal DP-SCD (Algorithm 2) needs every feature column to have L2 norm at most 1 (its sensitivity, "
            f"Lemma 4), but column {k} has norm {float(norms[k]):.4g}: divide each column by its norm first, or use "
            f"--variant primal-rows (unit rows) or dual")


def check_centralised(fed) -> None:
    check_primal_parties(fed.num_parties)


def primal_steps(ctx):
    """Run Algorithm 2 (one party); yield (t, the L coordinates, their clipped steps) after every step."""
    check_centralised(ctx.fed)
    X, st = ctx.X, ctx.state
    theta = st.v
    n = X.shape[0]
    w = X.new_zeros(n)                       # w = X theta, released with its noise: the paper's v
    for t, coords in enumerate(ctx.sampler):
        zeta = X.new_zeros(len(coords))
        for i, k in enumerate(coords.tolist()):
            xk = X[:, k]
            z = clip(ctx.glm.primal_step(theta[k], w, ctx.y, xk, ctx.lam, n), ctx.C)
            theta[k] += z
            w += z * xk
            zeta[i] = z
        if ctx.noise_std > 0:
            # theta_B's noise from this party's v/<block> stream (theta lives where v lives in the dual), w's
            # from the per-example stream (w is indexed by examples, like alpha).
            idx = coords.to(X.device)
            theta[idx] += ctx.v_streams.blocks[0][0].normal(len(coords), ctx.noise_std, device=X.device,
                                                             dtype=X.dtype)
            w += ctx.alpha_noise(n)
        yield t, coords, zeta


def row_primal_steps(ctx):
    """Run the ``primal-rows`` variant (one party); yield (t, batch, zeta over the d coordinates) after every step."""
    check_centralised(ctx.fed)
    X, st = ctx.X, ctx.state
    theta = st.v
    d = X.shape[1]
    coords = ctx.randomness.torch("primal-rows/coordinate-order")
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
