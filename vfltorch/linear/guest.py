"""The guest B: features and labels. It forms the encrypted residuals and the encrypted loss.

Per iteration over a mini-batch S (Hardy et al., steps 1-2 of the gradient
round), with [[U]] = [[sum of the hosts' margins]] and [[Q]] =
[[sum_i U_i^2]] from the host chain (``host.py``) and u_B = X_B[S] w_B:

    [[d]]          = (1/4) [[U]] + ((1/4) u_B - (1/2) y)                    (multiplying by 1/4 is free)
    [[8 sum_i l_i]] = [[Q]] + [[U]]^T (2 u_B - 4 y) + sum_i (u_B,i^2 - 4 y_i u_B,i) + 8 |S| log 2

using 8 l_i = 8 log 2 - 4 y_i u_i + u_i^2 with u = U + u_B. [[d]] goes to
every host (re-randomised per host, so that a host cannot divide it by its
own [[u_A]] and read (1/4) u_B - (1/2) y), [[8 sum l]] to the coordinator,
and the guest computes its own gradient block like every data party.

In a curvature round the guest forms [[h]] = (1/4) [[Z]] + (1/4) X_B[S_H] s_B
from the hosts' [[Z]] and sends it to the hosts.

The guest learns: its own gradient block g_B in SGD steps (as Hardy's
protocol reveals it: d_B-dimensional aggregates (1/|S|) X_B^T d, which mix the
hosts' margins into |S|-row sums), its block of the direction in SQN steps,
the epoch losses (sent by the coordinator for the stopping rule and the
logs), and the scores u of the rows it predicts (``estimator.py``). It
never sees a host's margin, feature or coefficient in the clear during
training.
"""

from __future__ import annotations

import torch

from .bounds import F_D, F_M, MARGIN_MAX, quantize
from .party import DataParty
from .session import PHASE_CURVATURE, PHASE_GRADIENT, PHASE_LOSS, PHASE_MARGINS, Session
from .taylor import LOG2


class Guest(DataParty):
    role = "guest"

    def __init__(self, session: Session, X: torch.Tensor, y: torch.Tensor, penalized: torch.Tensor):
        super().__init__(session, X, penalized)
        self.y = y.detach().to("cpu", torch.float64)

    def _from_hosts(self, with_squares: bool):
        last = self.s.hosts[-1]
        with self.s.clock("recv"):
            enc_u = self.s.scheme.recv(self.fed, last)
            enc_q = self.s.scheme.recv(self.fed, last) if with_squares else None
        return enc_u, enc_q

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, scheme = self.s, self.s.scheme
        u_b = self.local_margins(rows)
        y = self.y[torch.as_tensor(rows)]
        n_rows = len(rows)
        if s.hosts:
            with self.fed.phase(PHASE_MARGINS):
                enc_u, enc_q = self._from_hosts(with_squares=True)
        plain_d = 0.25 * u_b - 0.5 * y
        loss_plain = (u_b * u_b - 4.0 * y * u_b).sum() + 8.0 * n_rows * LOG2
        if s.hosts:
            with s.clock("he"):
                enc_d = 0.25 * enc_u + plain_d
                multiplier = quantize(2.0 * u_b - 4.0 * y, F_M)
                enc_loss = enc_q + scheme.matmul(enc_u, multiplier, F_M) + loss_plain
        else:   # no host: the guest alone with the coordinator (kept for completeness)
            with s.clock("encrypt"):
                enc_d = scheme.encrypt(plain_d, F_D, max_abs=0.25 * MARGIN_MAX + 0.5)
                enc_loss = scheme.encrypt(loss_plain, s.bounds.F_Q,
                                          max_abs=n_rows * (MARGIN_MAX ** 2 + 4 * MARGIN_MAX + 8))
        enc_loss = scheme.fixed(enc_loss, s.bounds.F_Q)
        with self.fed.phase(PHASE_GRADIENT), s.clock("send"):
            for host in s.hosts:
                scheme.send(self.fed, enc_d, host, s.bounds.residual_bits())
        with self.fed.phase(PHASE_LOSS), s.clock("send"):
            scheme.send(self.fed, enc_loss, s.coordinator, s.bounds.loss_bits())
        self.gradient_step(enc_d, rows, eta, quasi_newton)

    def curvature(self, rows_H, s_l: torch.Tensor) -> None:
        s, scheme = self.s, self.s.scheme
        z_b = self.local_margins(rows_H, s_l)
        with self.fed.phase(PHASE_CURVATURE):
            if s.hosts:
                enc_z, _ = self._from_hosts(with_squares=False)
                with s.clock("he"):
                    enc_h = 0.25 * enc_z + 0.25 * z_b
            else:
                with s.clock("encrypt"):
                    enc_h = scheme.encrypt(0.25 * z_b, F_D, max_abs=0.25 * MARGIN_MAX + 0.5)
            with s.clock("send"):
                for host in s.hosts:
                    scheme.send(self.fed, enc_h, host, s.bounds.residual_bits())
        self.curvature_block(enc_h, rows_H, s_l)

    def obfuscators_per_iteration(self, rows: int) -> int:
        return max(len(self.s.hosts), 1) * rows + 1 + self.X.shape[1]

    def obfuscators_per_curvature(self, rows: int) -> int:
        return max(len(self.s.hosts), 1) * rows + self.X.shape[1]


__all__ = ["Guest"]
