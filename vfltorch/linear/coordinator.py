"""The coordinator C: holds the Paillier private key and no data.

Per iteration it decrypts the batch loss (from the guest) and every data
party's gradient block. In an SGD step the blocks arrive masked and go back
as they are (C sees G_l + r_l, statistically close to uniform); in a
quasi-Newton step (SQN, k > 2L) it assembles g = (g_B, g_{A_1}, ...) and
returns each party its block of p = H_t g, computed by the L-BFGS two-loop
recursion over the last M curvature pairs (``lbfgs.py``). Every L iterations
(t >= 2) it receives the parties' blocks of s_t in the clear and decrypts
v_t = (1/|S_H|) sum_{i in S_H} (1/4) (s_t^T x_i) x_i + lambda s_t (eq. 7).
At the end of each epoch it applies the stopping rule (``stopping.py``) and
tells every party whether to stop (and the guest the epoch loss).

What C learns (semi-honest, not colluding): the loss of every mini-batch;
the gradient g_k of every quasi-Newton iteration (k > 2L) and the direction
it computes from it; the curvature pairs (s_t, v_t), so the updates
w_{k+1} - w_k = -eta p_k of those iterations and the differences of
averaged iterates (but not w itself: it never sees the first 2L updates nor
w_0 + ... in the clear); the public schedule, the row count and each party's
number of columns. What it does not learn: any feature, label, margin or
residual - it never receives a per-row quantity, only d_l-long blocks and
scalars - nor the gradients of the masked (SGD) steps.
"""

from __future__ import annotations

import torch

from ..crypto.encoding import from_fixed
from .lbfgs import CurvatureMemory
from .session import PHASE_CURVATURE, PHASE_EPOCH, PHASE_GRADIENT, PHASE_LOSS, Session
from .stopping import LossTracker


class Coordinator:
    role = "coordinator"

    def __init__(self, session: Session, memory: CurvatureMemory, tracker: LossTracker):
        self.s = session
        self.memory = memory
        self.tracker = tracker

    @property
    def fed(self):
        return self.s.fed

    def _open(self, src: int) -> torch.Tensor:
        """Receive a fixed-point block from ``src`` and decrypt it to float64."""
        s = self.s
        with s.clock("recv"):
            enc = s.scheme.recv(self.fed, src, fixed=True)
        with s.clock("decrypt"):
            ints, frac_bits = s.scheme.open(enc)
        return ints, frac_bits

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, n_rows = self.s, len(rows)
        with self.fed.phase(PHASE_LOSS):
            ints, f = self._open(s.guest)
            self.tracker.add_batch(float(from_fixed(ints, f, ())) / 8.0, n_rows)
        with self.fed.phase(PHASE_GRADIENT):
            blocks = [self._open(party) for party in s.data_parties]
            if not quasi_newton:
                with s.clock("send"):
                    for party, (ints, _) in zip(s.data_parties, blocks):
                        self.fed.send_json(ints, party)
                return
            with s.clock("plain"):
                g = torch.cat([from_fixed(ints, f, (len(ints),)) for ints, f in blocks]) / n_rows
                p = self.memory.direction(g)
            with s.clock("send"):
                for party, p_l in zip(s.data_parties, torch.split(p, s.n_features)):
                    self.fed.send_tensor(p_l.contiguous(), party)

    def close_window(self, k: int) -> None:
        s = self.s
        if not s.plan.pair_due(k):
            return
        rows_H = len(s.batches.hessian_rows(k // s.plan.L))
        with self.fed.phase(PHASE_CURVATURE):
            with s.clock("recv"):
                s_blocks = [self.fed.recv_tensor(party, device="cpu").to(torch.float64) for party in s.data_parties]
            v = self._curvature_v(rows_H)
        with s.clock("plain"):
            self.memory.push(torch.cat(s_blocks), v)

    def _curvature_v(self, rows_H: int) -> torch.Tensor:
        """v = (1/|H|) X_H^T z / 4 over every party's block, opened from the parties' masked blocks."""
        v_blocks = [self._open(party) for party in self.s.data_parties]
        with self.s.clock("plain"):
            return torch.cat([from_fixed(ints, f, (len(ints),)) for ints, f in v_blocks]) / rows_H

    def end_epoch(self) -> dict:
        loss, stop, converged = self.tracker.end_epoch()
        decision = {"stop": stop, "converged": converged}
        with self.fed.phase(PHASE_EPOCH):
            self.fed.send_json({**decision, "loss": loss}, self.s.guest)
            for host in self.s.hosts:
                self.fed.send_json(decision, host)
        return {**decision, "loss": loss}

    def prepare(self, batches, k: int) -> float:
        return 0.0


__all__ = ["Coordinator"]
