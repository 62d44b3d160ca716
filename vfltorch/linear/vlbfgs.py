"""Vector-free L-BFGS (Chen, Wang, Zhou, NIPS 2014): the two-loop recursion on a table of dot products.

The two-loop recursion (``lbfgs.two_loop``) only ever forms linear
combinations of the basis vectors b = (s_1, ..., s_m, v_1, ..., v_m, g) and
their dot products. So H g = sum_j delta_j b_j, and the coefficients delta
follow from the (2m + 1) x (2m + 1) table T = B B^T alone: represent every
intermediate vector by its coefficients c over the basis, then
x^T y = c_x^T T c_y. Whoever holds T can compute delta without seeing a
single vector; whoever holds the vectors (here: additive shares of them)
forms p = delta^T B locally. ``direction_coefficients`` returns exactly the
coefficients that reproduce ``two_loop`` (tests/test_hetero_lr_shared.py
checks it against the dense formula).
"""

from __future__ import annotations

import torch


def direction_coefficients(table: torch.Tensor, m: int) -> torch.Tensor:
    """delta with H g = delta^T B for B = (s_1..s_m, v_1..v_m, g), oldest pair first; T = B B^T.

    With m = 0 the direction is g itself (delta = (1,)). H_0 = gamma I with
    gamma = s_m^T v_m / v_m^T v_m (the newest pair), as ``lbfgs.CurvatureMemory``.
    """
    T = table.to(torch.float64)
    size = 2 * m + 1
    if T.shape != (size, size):
        raise ValueError(f"a table for {m} pairs is {size} x {size}, got {tuple(T.shape)}")

    def e(j):
        c = torch.zeros(size, dtype=torch.float64)
        c[j] = 1.0
        return c

    q = e(2 * m)
    if m == 0:
        return q
    s_idx, v_idx = list(range(m)), list(range(m, 2 * m))
    rhos = [1.0 / float(T[v_idx[i], s_idx[i]]) for i in range(m)]
    alphas = [0.0] * m
    for i in reversed(range(m)):                      # newest to oldest
        alphas[i] = rhos[i] * float(T[s_idx[i]] @ q)
        q = q - alphas[i] * e(v_idx[i])
    gamma = float(T[s_idx[-1], v_idx[-1]]) / float(T[v_idx[-1], v_idx[-1]])
    r = gamma * q
    for i in range(m):                                # oldest to newest
        beta = rhos[i] * float(T[v_idx[i]] @ r)
        r = r + (alphas[i] - beta) * e(s_idx[i])
    return r


__all__ = ["direction_coefficients"]
