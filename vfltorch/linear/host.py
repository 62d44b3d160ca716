"""A host A: features only. Its margins reach the guest encrypted, along a chain of hosts.

With several hosts h_1, ..., h_m (FATE's multi-host set-up) the guest needs
the sum U = sum_j u_{h_j} of the hosts' margins and, for the loss, the sum
of squares sum_i U_i^2, which contains the host-host cross terms
u_{h_a,i} u_{h_b,i}. Neither may be formed in the clear. The hosts pass two
ciphertexts along a chain, in rank order, to the guest (m messages per
iteration, the same count as a star):

    h_1:            [[U_1]] = [[u_1]],               [[Q_1]] = [[sum_i u_{1,i}^2]]
    h_j (j > 1):    [[U_j]] = [[U_{j-1}]] + u_j,     [[Q_j]] = [[Q_{j-1}]] + 2 [[U_{j-1}]]^T u_j + sum_i u_{j,i}^2

so that [[Q_m]] = [[sum_i (sum_j u_{j,i})^2]]: host j multiplies the running
encrypted sum by its own plaintext margins. Every ciphertext that leaves a
host is re-randomised (``send_encrypted``), so the next host cannot relate it
to what it saw before. With one host (Q = 2, the paper) this is Hardy's
message: [[u_A]] and [[sum_i u_{A,i}^2]] (a single ciphertext; FATE sends the
same scalar) to the guest.

The curvature round uses the same chain for [[Z]] = [[sum_j X_{h_j} s_{h_j}]]
over S_H (no squares needed).

A host learns: its own gradient block g_A (after unmasking) in SGD steps,
its block p_A = (H g)_A of the direction in SQN steps, the public schedule,
and whether training stops. It receives [[d]] and [[h]] only under the
coordinator's key: no label, residual or other party's margin in the clear.
"""

from __future__ import annotations

import torch

from .bounds import F_M, F_U, MARGIN_MAX, quantize
from .party import DataParty
from .session import PHASE_CURVATURE, PHASE_GRADIENT, PHASE_MARGINS


class Host(DataParty):
    role = "host"

    @property
    def position(self) -> int:
        return self.s.hosts.index(self.fed.rank)

    @property
    def previous(self) -> int | None:
        return self.s.hosts[self.position - 1] if self.position > 0 else None

    @property
    def next(self) -> int:
        hosts = self.s.hosts
        return hosts[self.position + 1] if self.position + 1 < len(hosts) else self.s.guest

    def _chain(self, u: torch.Tensor, with_squares: bool) -> None:
        """Pass [[U_j]] (and [[Q_j]]) on to the next host, or to the guest."""
        s, scheme, j = self.s, self.s.scheme, self.position + 1
        rows = u.numel()
        if self.previous is None:
            with s.clock("encrypt"):
                enc_u = scheme.encrypt(u, F_U, max_abs=MARGIN_MAX)
                enc_q = (scheme.encrypt((u * u).sum(), s.bounds.F_Q, max_abs=rows * MARGIN_MAX ** 2)
                         if with_squares else None)
        else:
            with s.clock("recv"):
                prev_u = scheme.recv(self.fed, self.previous)
                prev_q = scheme.recv(self.fed, self.previous) if with_squares else None
            with s.clock("he"):
                enc_u = prev_u + u
                enc_q = None
                if with_squares:
                    two_u = quantize(2.0 * u, F_M)
                    enc_q = prev_q + scheme.matmul(prev_u, two_u, F_M) + (u * u).sum()
        with s.clock("send"):
            scheme.send(self.fed, enc_u, self.next, s.bounds.margin_sum_bits(j))
            if with_squares:
                scheme.send(self.fed, enc_q, self.next, s.bounds.square_sum_bits(j))

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        u = self.local_margins(rows)
        with self.fed.phase(PHASE_MARGINS):
            self._chain(u, with_squares=True)
        with self.fed.phase(PHASE_GRADIENT), self.s.clock("recv"):
            enc_d = self.s.scheme.recv(self.fed, self.s.guest)
        self.gradient_step(enc_d, rows, eta, quasi_newton)

    def curvature(self, rows_H, s_l: torch.Tensor) -> None:
        z = self.local_margins(rows_H, s_l)
        with self.fed.phase(PHASE_CURVATURE):
            self._chain(z, with_squares=False)
            with self.s.clock("recv"):
                enc_h = self.s.scheme.recv(self.fed, self.s.guest)
        self.curvature_block(enc_h, rows_H, s_l)

    def obfuscators_per_iteration(self, rows: int) -> int:
        return rows + 1 + self.X.shape[1]

    def obfuscators_per_curvature(self, rows: int) -> int:
        return rows + self.X.shape[1]


__all__ = ["Host"]
