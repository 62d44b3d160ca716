"""The default hetero-LR protocol: the whole model kept as additive shares between the guest and the host.

Why. In the paper's protocol (``guest.py``, ``host.py``, ``coordinator.py``)
the host unmasks its gradient block g_A = (1/|S|) X_A[S]^T d at every step.
At the first step w = 0, so d = -y/2 and g_A is a known linear map of the
batch's labels (a 0/1 program recovers them); stacked over an epoch, least
squares recovers a per-row residual that ranks the labels far better than
the host's own columns can (docs/hetero_lr.md, tests/test_hetero_lr_attacks.py).
The coordinator of SQN sees gradients and curvature pairs in the clear.

What. Every block w_P of the model (the guest's, with the intercept, and the
host's) is split into additive shares <w_P>_g + <w_P>_h on Z_2^64 in fixed
point (``vfltorch.comm.sharing``: F = 16 fractional bits). Per mini-batch S:

1. margins: u = sum_P X_P[S] w_P = sum_P (X_P <w_P>_own + X_P <w_P>_other): the
   owner computes the first term; the second is ``mul_private`` (X_P held by
   its owner, the other share by the other party; a Beaver triple from the
   coordinator). Shares of d = u / 4 - y / 2 follow locally (the guest
   subtracts y / 2).
2. gradient: g_P = (1/|S|) X_P[S]^T d + lambda w_P, again one ``mul_private``
   per block (X_P^T / |S| times the other party's share of d) plus local terms.
3. direction: SGD p = g; quasi-Newton (vector-free L-BFGS, ``vlbfgs.py``): the
   (2m + 1)^2 table of dot products of (s_1..s_m, v_1..v_m, g) is computed under
   sharing (``mul_shared``) and opened to the two data parties, which derive
   the same coefficients delta and form shares of p = delta^T B locally.
4. update: <w> <- <w> - eta <p>, on shares.

Every L updates the window averages of the shares give shares of s_t; v_t =
(1/|S_H|) X_H^T (X_H s_t / 4) + lambda s_t is computed like steps 1-2; the pair
is kept if s^T v > eps |s| |v| (three dot products opened to the data
parties). The batch losses are accumulated as shares of sum_i d_i^2
(sum l = |S| log 2 + 2 sum d^2 - |S| / 2) and opened to the guest once per
epoch, for the stopping rule. At the end each owner receives the other share
of its block: the host learns its final w_A and nothing per batch.

What each role receives: Beaver openings X_P - a, <v>_other - b (uniform on
Z_2^64), the dot-product tables, the accept bits, the stop decisions; the
guest also the epoch losses. The coordinator only deals triples (it sends
seeds and c_1, receives the accept bits and stop decisions): it sees no
gradient, curvature pair or loss. Security model: semi-honest, no collusion
of the coordinator with a data party (the same as the paper's key holder).

Fixed point. X enters the products with ``feature_frac_bits`` (10 by default in
this protocol) fractional bits; each product is truncated by the two-holder
rule, which fails (a wildly wrong share) with probability about
|value| 2^(bits - 64) per element: about 2^-31 for a margin and 2^-26 for a
gradient entry at the default settings. A failure shows as a huge epoch loss
or coefficient and stops training with ``DivergenceError``.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from ..comm.masking import FixedPoint
from ..comm.sharing import mul_private, mul_shared, open_value, truncate
from .bounds import COEF_MAX, DivergenceError
from .lbfgs import CURVATURE_EPS
from .session import PHASE_CURVATURE, PHASE_EPOCH, PHASE_GRADIENT, PHASE_LOSS, PHASE_MARGINS, Session
from .stopping import LossTracker
from .taylor import LOG2
from .vlbfgs import direction_coefficients

FRAC_BITS = 16              # F: weights, margins, residuals, gradients, s, v
CONST_BITS = 16             # public real multipliers (eta, 1/L, the L-BFGS coefficients)
DEFAULT_FEATURE_BITS = 10   # X in this protocol's products (keeps truncation failures rare)
FP = FixedPoint(FRAC_BITS)
FP2 = FixedPoint(2 * FRAC_BITS)


class PairCount:
    def __init__(self):
        self.accepted = 0
        self.rejected = 0


class SharedRole:
    """One of the guest, the host or the coordinator (the dealer) in the shared-model protocol (SPMD)."""

    def __init__(self, session: Session, X: torch.Tensor | None, y: torch.Tensor | None, *, fit_intercept: bool,
                 memory: int, tracker: LossTracker):
        fed = session.fed
        if len(session.hosts) != 1:
            raise ValueError("the shared protocol runs between one guest and one host")
        self.s = session
        self.guest, self.host = session.guest, session.hosts[0]
        self.dealer = session.coordinator
        self.owners = [self.guest, self.host]
        self.dims = list(session.n_features)
        self.index = {self.guest: 0, self.host: 1}.get(fed.rank)
        self.role = "guest" if self.index == 0 else ("host" if self.index == 1 else "coordinator")
        self.tracker = tracker
        self.M = int(memory)
        self.pairs: deque = deque(maxlen=self.M)     # (s shares, v shares) as full-length vectors
        self.memory = PairCount()
        self.loss_share = torch.zeros((1, 1), dtype=torch.int64)
        self.rows_in_epoch = 0
        self.w = None                                 # this owner's block, opened at the end
        self.fx = session.feature_frac_bits
        self.fit_intercept = bool(fit_intercept)
        if self.index is not None:
            self.X = X.detach().to("cpu", torch.float64)
            self.device = X.device
            self.y = None if y is None else y.detach().to("cpu", torch.float64)
            self.shares = [torch.zeros(d, dtype=torch.int64) for d in self.dims]
            self.window = None
            self.window_count = 0
            self.previous = None

    @property
    def fed(self):
        return self.s.fed

    @property
    def holders(self):
        return (self.guest, self.host)

    # ------------------------------------------------------------ primitives
    def _trunc(self, z: torch.Tensor, bits: int) -> torch.Tensor:
        return truncate(z, self.index, bits)

    def _scale(self, shares: torch.Tensor, c: float) -> torch.Tensor:
        """Shares of c * x for a public real c."""
        return self._trunc(shares * int(round(c * 2 ** CONST_BITS)), CONST_BITS)

    def _x_times(self, P: int, rows, vec, bits: int, transpose: bool, scale: float = 1.0):
        """Untruncated shares of (scale X_P[rows])^T vec or X_P[rows] vec (X at ``bits`` fractional bits).

        ``vec`` is this party's share; X_P is known to its owner only, the other share enters by ``mul_private``.
        """
        owner = self.owners[P]
        other = self.host if owner == self.guest else self.guest
        n, d = len(rows), self.dims[P]
        shape_x, shape_y = ((d, n), (n,)) if transpose else ((n, d), (d,))
        Xi = None
        if self.fed.rank == owner:
            Xr = self.X[torch.as_tensor(rows)] * scale
            Xi = FixedPoint(bits).encode(Xr.T.contiguous() if transpose else Xr)      # raises on overflow
        z = mul_private(self.fed, Xi, vec if self.fed.rank == other else None, holders=(owner, other),
                        dealer=self.dealer, kind="matmul", shape_x=shape_x, shape_y=shape_y)
        if self.fed.rank == owner:
            z = z + Xi @ vec
        return z

    def _quarter_margins(self, rows, vecs):
        """Shares of (1/4) sum_P X_P[rows] vec_P at F bits (vecs: this party's shares of each block)."""
        total = None
        for P in range(2):
            z = self._x_times(P, rows, None if vecs is None else vecs[P], self.fx, transpose=False)
            total = z if total is None else (None if z is None else total + z)
        return None if total is None else self._trunc(total, self.fx + 2)

    def _block_gradients(self, rows, h, vecs):
        """Shares of (1/|rows|) X_P[rows]^T h + lambda penalized_P vec_P for both blocks P, at F bits."""
        n = len(rows)
        bits = self.fx + max(0, math.ceil(math.log2(n)))
        out = []
        for P in range(2):
            z = self._x_times(P, rows, h, bits, transpose=True, scale=1.0 / n)
            if z is None:
                out.append(None)
                continue
            if self.s.l2:
                pen = self._penalty_mask(P)
                z = z + torch.round(self.s.l2 * pen * 2.0 ** bits).to(torch.int64) * vecs[P]
            out.append(self._trunc(z, bits))
        return out

    def _penalty_mask(self, P: int) -> torch.Tensor:
        # Only the guest's block carries an unpenalised intercept (its last column); the mask is public.
        if P == 0 and self.fit_intercept:
            mask = torch.ones(self.dims[0], dtype=torch.float64)
            mask[-1] = 0.0
            return mask
        return torch.ones(self.dims[P], dtype=torch.float64)

    def _open_table(self, rows_share, count: int) -> torch.Tensor | None:
        """The count x count table B B^T of shared vectors (rows of ``rows_share``), opened to both data parties."""
        d = sum(self.dims)
        t = mul_shared(self.fed, rows_share, None if rows_share is None else rows_share.T.contiguous(),
                       holders=self.holders, dealer=self.dealer, kind="matmul", shape_x=(count, d),
                       shape_y=(d, count))
        if self.index is None:
            return None
        return open_value(self.fed, t, holders=self.holders, fp=FP2)

    # ------------------------------------------------------------- the loop
    def prepare(self, batches, k: int) -> float:
        return 0.0

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, n = self.s, len(rows)
        with self.fed.phase(PHASE_MARGINS), s.clock("shared"):
            d = self._quarter_margins(rows, self.shares if self.index is not None else None)
            if self.index == 0:
                d = d - FP.encode(0.5 * self.y[torch.as_tensor(rows)])
        with self.fed.phase(PHASE_LOSS), s.clock("shared"):
            sq = mul_shared(self.fed, None if d is None else d.view(1, n), None if d is None else d.view(n, 1),
                            holders=self.holders, dealer=self.dealer, kind="matmul", shape_x=(1, n), shape_y=(n, 1))
            if sq is not None:
                self.loss_share = self.loss_share + sq
            self.rows_in_epoch += n
        with self.fed.phase(PHASE_GRADIENT), s.clock("shared"):
            g = self._block_gradients(rows, d, self.shares if self.index is not None else None)
            p = self._direction(g) if quasi_newton else g
            if self.index is not None:
                self.shares = [w - self._scale(pb, eta) for w, pb in zip(self.shares, p)]
        if self.index is not None and s.plan.optimizer == "sqn":
            full = torch.cat(self.shares)
            self.window = full.clone() if self.window is None else self.window + full
            self.window_count += 1

    def _direction(self, g):
        """Shares of H g by vector-free L-BFGS (the gradient itself while no pair is stored)."""
        m = len(self.pairs)
        if m == 0:
            return g
        B = None
        if self.index is not None:
            B = torch.stack([sv[0] for sv in self.pairs] + [sv[1] for sv in self.pairs] + [torch.cat(g)])
        table = self._open_table(B, 2 * m + 1)
        if self.index is None:
            return g
        delta = direction_coefficients(table, m)
        p = self._trunc(torch.round(delta * 2.0 ** CONST_BITS).to(torch.int64) @ B, CONST_BITS)
        return list(torch.split(p, self.dims))

    def close_window(self, k: int) -> None:
        s_share = None
        if self.index is not None:
            if self.window_count != self.s.plan.L:
                raise RuntimeError(f"closing an averaging window of {self.window_count} iterates")
            average = self._scale(self.window, 1.0 / self.s.plan.L)
            if self.previous is not None:
                s_share = average - self.previous
            self.previous = average
            self.window, self.window_count = None, 0
        if not self.s.plan.pair_due(k):
            return
        rows_H = self.s.batches.hessian_rows(k // self.s.plan.L)
        with self.fed.phase(PHASE_CURVATURE), self.s.clock("shared"):
            blocks = None if s_share is None else list(torch.split(s_share, self.dims))
            h = self._quarter_margins(rows_H, blocks)
            v = self._block_gradients(rows_H, h, blocks)
            pair = None if s_share is None else torch.stack([s_share, torch.cat(v)])
            table = self._open_table(pair, 2)
            if self.index is not None:
                sv, ss, vv = float(table[0, 1]), float(table[0, 0]), float(table[1, 1])
                keep = sv > CURVATURE_EPS * math.sqrt(max(ss, 0.0) * max(vv, 0.0)) and sv > 0
                if self.index == 0:
                    self.fed.send_json(bool(keep), self.dealer)
            else:
                keep = bool(self.fed.recv_json(self.guest))
        if keep:
            self.pairs.append((s_share, None if s_share is None else torch.cat(v)))
            self.memory.accepted += 1
        else:
            self.memory.rejected += 1

    def end_epoch(self) -> dict:
        with self.fed.phase(PHASE_EPOCH):
            total = open_value(self.fed, self.loss_share if self.index is not None else None,
                               holders=self.holders, fp=FP2, to=self.guest)
            n, self.rows_in_epoch = self.rows_in_epoch, 0
            self.loss_share = torch.zeros((1, 1), dtype=torch.int64)
            if self.index == 0:
                loss_sum = n * LOG2 + 2.0 * float(total.reshape(())) - 0.5 * n
                if not loss_sum < 1e12:
                    raise DivergenceError("the shared epoch loss is out of range: a truncation failed or the model "
                                          "diverged; lower the learning rate")
                self.tracker.add_batch(loss_sum, n)
                loss, stop, converged = self.tracker.end_epoch()
                decision = {"stop": stop, "converged": converged}
                for r in (self.host, self.dealer):
                    self.fed.send_json(decision, r)
                return {**decision, "loss": loss}
            return self.fed.recv_json(self.guest)

    def finish(self) -> None:
        """Open each block to its owner: the only time a party learns model values."""
        with self.fed.phase(PHASE_EPOCH):
            for P in range(2):
                opened = open_value(self.fed, self.shares[P] if self.index is not None else None,
                                    holders=self.holders, fp=FP, to=self.owners[P])
                if opened is not None:
                    self.w = opened.to(self.device, torch.float64)
        if self.w is not None:
            peak = float(self.w.abs().max()) if self.w.numel() else 0.0
            if not peak <= COEF_MAX:
                raise DivergenceError(f"{self.fed.name()}: a coefficient reached |w| = {peak:.4g}: the model "
                                      f"diverged (or a fixed-point truncation failed); lower the learning rate")


__all__ = ["DEFAULT_FEATURE_BITS", "FRAC_BITS", "SharedRole"]
