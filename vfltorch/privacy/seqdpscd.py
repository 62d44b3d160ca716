"""seqDP-SCD (the paper's Algorithm 3) and plain SCD: sequential coordinate steps inside a mini-batch.

Each step of a lot B (exactly L examples, see ``sampling.py``) is the exact
coordinate minimiser (the L = 1 form of g_j in ``glm.py``) at the *current*
v, which already contains the earlier steps of the lot:

    for j in B, in order:  zeta_j = clip(argmin g_j),  alpha_j += zeta_j,  v += zeta_j x_j
    after the lot:         alpha_B += N(0, sigma^2 S^2),  v += N(0, sigma^2 S^2 I_d)

Sensitivity. Replacing one example of the lot changes its own step and, through
v, every later one; each clipped step moves by at most 2C, in alpha and (rows
of norm <= 1) in v, so ||Delta alpha||^2 <= 4 C^2 L and ||Delta v||^2 <=
(2 C L)^2:

    S = 2 C sqrt(L (L + 1)),

the constant the issue gives. The authors' code uses sqrt(4 L^2 - 2) C, the
add-or-remove version (the removed example's own step moves by C, not 2C);
it is smaller by a factor of about 1 - 1/(2L). We keep the larger, safe one.

With C = inf and sigma = 0 this is plain stochastic (dual) coordinate descent,
SDCA: the non-private baseline.

At a single party the lot's Gram matrix G = X_B X_B^T turns the L sequential
inner products into scalar recurrences m_j = x_j^T v + sum_{i<j} zeta_i G_ij
on the CPU (the iterates are the same). In a federation each step's x_j^T v
is a sum over parties, so a lot costs L round trips to the active party: the
price of sequential updates, and the reason the paper parallelises them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..devices import to_host, to_numpy

from .dpscd import clip


def sensitivity(C: float, L: int) -> float:
    """L2 sensitivity of one seqDP-SCD lot of L sequential steps: 2 C sqrt(L (L + 1))."""
    return 2.0 * C * math.sqrt(L * (L + 1))


def seq_steps(ctx):
    """Run Algorithm 3 at this party; yield (t, lot, zeta_lot) after every lot."""
    fed, X, st = ctx.fed, ctx.X, ctx.state
    lam_n = ctx.lam * ctx.n
    for t, batch in enumerate(ctx.sampler, ctx.sampler.start):
        rows = batch.to(X.device)
        XB = X.index_select(0, rows)
        if ctx.link.single:
            zeta = _lot_centralised(ctx, rows, XB, lam_n)
        else:
            zeta = _lot_federated(ctx, rows, XB, lam_n)
        if fed.is_active:
            st.alpha[rows] += zeta + ctx.alpha_noise(len(batch))
        st.v += ctx.v_noise()
        yield t, batch, zeta


def _lot_centralised(ctx, rows, XB, lam_n):
    st = ctx.state
    # (the lot's steps are sequential scalar work: on the host, one copy each)
    gram = to_numpy(XB @ XB.T)
    m0 = to_host(XB @ st.v).tolist()
    alpha = to_host(st.alpha[rows]).tolist()
    y = to_host(ctx.y[rows]).tolist()
    s = to_host(ctx.sqnorms[rows] / lam_n).tolist()
    zeta = np.zeros(len(rows))
    step, C = ctx.glm.dual_step_scalar, ctx.C
    for j in range(len(rows)):
        margin = m0[j] + float(gram[j, :j] @ zeta[:j])
        z = step(alpha[j], y[j], margin / lam_n, s[j])
        zeta[j] = z if z <= C and z >= -C else (C if z > C else -C)
    zeta = torch.from_numpy(zeta).to(device=XB.device, dtype=XB.dtype)
    st.v += XB.T @ zeta
    return zeta


def _lot_federated(ctx, rows, XB, lam_n):
    fed, st = ctx.fed, ctx.state
    zeta = XB.new_zeros(len(rows))
    for j in range(len(rows)):
        with fed.phase("dpscd/margins"):
            margin = ctx.link.sum_at_active(XB[j:j + 1] @ st.v)
        z = None
        if fed.is_active:
            r = rows[j:j + 1]
            z = clip(ctx.glm.dual_step(st.alpha[r], ctx.y[r], margin / lam_n, ctx.sqnorms[r] / lam_n), ctx.C)
        with fed.phase("dpscd/steps"):
            z = ctx.link.from_active(z, (1,), XB.dtype)
        st.v += z[0] * XB[j]
        zeta[j] = z[0]
    return zeta


def model_block(ctx) -> torch.Tensor:
    return ctx.state.v / (ctx.lam * ctx.n)
