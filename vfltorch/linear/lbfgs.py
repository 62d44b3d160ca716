"""L-BFGS at the coordinator: the last M curvature pairs and the two-loop recursion.

SQN (Byrd, Hansen, Nocedal, Singer 2016; Yang et al.'s eqs. 5-8) keeps the
M most recent pairs (s_j, v_j), s_j a difference of averaged iterates and
v_j = (sub-sampled Hessian) s_j, and applies the inverse-Hessian
approximation H_t that the BFGS update builds from them,

    H <- (I - rho s v^T) H (I - rho v s^T) + rho s s^T,   rho = 1 / (v^T s),

starting from H_0 = gamma I with gamma = s^T v / v^T v of the newest pair
(Nocedal and Wright, eq. 7.20). H is never formed: ``two_loop`` computes
H g in O(M d) by the two-loop recursion (Nocedal and Wright, Algorithm 7.4),
which gives exactly the vector the dense update would (``tests/test_lbfgs.py``
checks this against the d x d formula).

A pair is kept only if it has positive curvature, v^T s > eps |s| |v|
(the Taylor loss is convex, so this only drops pairs whose s is numerically
zero or whose v lost its sign to fixed-point error); BFGS needs v^T s > 0 to
keep H positive definite.
"""

from __future__ import annotations

from collections import deque

import torch

CURVATURE_EPS = 1e-10


def initial_scale(pairs, rule: str = "newest") -> float:
    """gamma of H_0 = gamma I: s^T v / v^T v of the newest pair, or the smallest over the stored pairs."""
    gammas = [float(s @ v) / float(v @ v) for s, v in pairs]
    return gammas[-1] if rule == "newest" else min(gammas)


def two_loop(g: torch.Tensor, pairs, gamma: float | None = None) -> torch.Tensor:
    """H g for the L-BFGS matrix of ``pairs`` (oldest first), H_0 = gamma I (default: the newest pair's).

    With no pairs H is the identity (an SGD step).
    """
    pairs = list(pairs)
    if not pairs:
        return g.clone()
    q = g.clone()
    alphas = []
    rhos = [1.0 / float(v @ s) for s, v in pairs]
    for (s, v), rho in zip(reversed(pairs), reversed(rhos)):       # newest to oldest
        a = rho * float(s @ q)
        alphas.append(a)
        q = q - a * v
    r = (initial_scale(pairs) if gamma is None else gamma) * q     # H_0 q
    for (s, v), rho, a in zip(pairs, rhos, reversed(alphas)):       # oldest to newest
        b = rho * float(v @ r)
        r = r + (a - b) * s
    return r


class CurvatureMemory:
    """The last ``M`` curvature pairs (s, v), with the positive-curvature test."""

    def __init__(self, memory: int, h0: str = "newest"):
        if int(memory) < 1:
            raise ValueError(f"the L-BFGS memory M must be at least 1, got {memory}")
        self.memory = int(memory)
        self.h0 = h0
        self.pairs: deque = deque(maxlen=self.memory)
        self.accepted = 0
        self.rejected = 0

    def push(self, s: torch.Tensor, v: torch.Tensor) -> bool:
        """Keep (s, v) if v^T s > eps |s| |v|; returns whether it was kept."""
        s = s.to(torch.float64)
        v = v.to(torch.float64)
        curvature = float(s @ v)
        if not curvature > CURVATURE_EPS * float(s.norm()) * float(v.norm()):
            self.rejected += 1
            return False
        self.pairs.append((s, v))
        self.accepted += 1
        return True

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """H_t g (the gradient itself while no pair is stored)."""
        if not self.pairs:
            return g.to(torch.float64).clone()
        return two_loop(g.to(torch.float64), self.pairs, initial_scale(self.pairs, self.h0))

    def __len__(self) -> int:
        return len(self.pairs)


__all__ = ["CURVATURE_EPS", "CurvatureMemory", "two_loop"]
