"""DP-SCD, the paper's Algorithm 1: independent, clipped, noisy dual coordinate steps per mini-batch.

One step t, at every party l (its columns X_l, its block v_l of v = X^T alpha):

  (a) B: a Poisson batch, rate q = L / N (secret; the same at every party, drawn by the active party)
  (b) zeta_j = argmin_zeta g_j(zeta) for every j in B, *independently*, with the
      L ||x_j||^2 zeta^2 / (2 lambda N) term (eq. 8, ``glm.py``); x_j^T v = sum_l x_{j,l}^T v_l
      arrives at the active party through the tree
  (c) zeta_j <- zeta_j / max(1, |zeta_j| / C)          (clip: |zeta_j| <= C)
  (d) alpha_B += zeta_B + N(0, sigma^2 S^2 I_|B|)       (active party, its own noise)
  (e) v_l += X_{l,B}^T zeta_B + N(0, sigma^2 S^2 I_{d_l}) (every party, its own noise)

with the noise multiplier sigma from the accountant and S = sqrt(2) C: the
noise is N(0, 2 sigma^2 C^2) on the touched coordinates of alpha and on every
coordinate of v, as in the paper (and the authors' code, which draws
normal(0, sigma * sqrt(2 C^2)) for both).

Lemma 1 (sensitivity). With ||x_j|| <= 1, adding or removing one example j
changes the step's output (Delta alpha, Delta v) only through zeta_j, the
other L - 1 steps being independent of it: by |zeta_j| <= C in alpha and by
||zeta_j x_j|| <= C in v, so the L2 sensitivity of the concatenated update is
sqrt(C^2 + C^2) = sqrt(2) C, whatever the batch size.

What the parties learn (vertical run): the active party learns x_j^T v for the
rows of each batch (it needs them for zeta) and keeps alpha and the labels.
The passive parties learn the batch indices and, by default (protocol
``encrypted``, ``vertical.EncryptedUpdates``), only the noisy updates
X_{l,B}^T zeta_B + noise of their blocks. Under the paper's protocol
(``paper``) they receive the clipped steps zeta_B themselves, which are
functions of the labels (for the SVM and logistic tasks, on an example's
first visit, when alpha_j = 0, a nonzero zeta_j has the sign of y_j; for
ridge zeta_j is a damped residual): the labels leak. With the plain tree, a
parent also sees its subtree's partial sums x_{j,S}^T v_S; ``secure=True``
removes that.
"""

from __future__ import annotations

import math

import torch


def sensitivity(C: float) -> float:
    """L2 sensitivity of one DP-SCD step (Lemma 1): sqrt(2) C."""
    return math.sqrt(2.0) * C


def clip(zeta, C: float):
    """zeta / max(1, |zeta| / C), i.e. zeta clamped to [-C, C] (works on tensors and numpy)."""
    if math.isinf(C):
        return zeta
    if isinstance(zeta, torch.Tensor):
        return torch.clamp(zeta, -C, C)
    if isinstance(zeta, float) or getattr(zeta, "ndim", 1) == 0:
        return min(C, max(-C, float(zeta)))
    import numpy as np

    return np.clip(zeta, -C, C)


def dual_steps(ctx):
    """Run Algorithm 1 at this party; yield (t, batch, zeta_B) after every step."""
    fed, X, st = ctx.fed, ctx.X, ctx.state
    lam_n = ctx.lam * ctx.n
    for t, batch in enumerate(ctx.sampler, ctx.sampler.start):
        b = len(batch)
        if b:
            rows = batch.to(X.device)
            XB = X.index_select(0, rows)
            with fed.phase("dpscd/margins"):
                margins = ctx.link.sum_at_active(XB @ st.v)
            zeta = None
            if fed.is_active:
                zeta = ctx.glm.dual_step(st.alpha[rows], ctx.y[rows], margins / lam_n,
                                         ctx.L * ctx.sqnorms[rows] / lam_n)
                zeta = clip(zeta, ctx.C)
                st.alpha[rows] += zeta + ctx.alpha_noise(b)
        else:
            # An empty Poisson batch: no update, but the released state still gets its noise.
            XB, zeta = X[:0], X.new_zeros(0) if fed.is_active else None
        zeta = ctx.apply_steps(XB, zeta, batch)
        yield t, batch, zeta


def model_block(ctx) -> torch.Tensor:
    """This party's block of the primal model, theta_l = v_l / (lambda N)."""
    return ctx.state.v / (ctx.lam * ctx.n)
