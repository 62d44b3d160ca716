"""What the guest and the hosts do alike: their block of w, their gradient and curvature blocks.

A data party l holds its columns X_l (quantised to F_X fractional bits, the
values the encrypted products use), its block w_l of the model and, for SQN,
its block of the averaged iterates. Per iteration it

1. receives [[d]] (the guest forms it itself) and computes its encrypted
   gradient block [[G_l]] = [[d]]^T X_l[S] + |S| lambda w_l (at F_G bits;
   the intercept is not penalised);
2. in an SGD step masks it, [[G_l + r_l]], so that the coordinator learns
   nothing, gets G_l + r_l back and unmasks: g_l = G_l / |S|; in a
   quasi-Newton step sends [[G_l]] unmasked (the coordinator needs g to apply
   H_t) and receives its block p_l of the direction H_t g;
3. updates w_l <- w_l - eta p_l (p_l = g_l in an SGD step).

Curvature pairs (SQN, every L iterations from t = 2 on): the party sends
its block s_l to the coordinator in the clear, helps form [[h]] =
[[(1/4) s^T x_i]] over S_H, and sends [[V_l]] = [[h]]^T X_l[S_H] + |S_H|
lambda s_l, which the coordinator decrypts: v_l = V_l / |S_H|.
"""

from __future__ import annotations

import torch

from ..crypto.encoding import from_fixed
from .bounds import COEF_MAX, MARGIN_MAX, DivergenceError
from .masks import unmask
from .optimizers import IterateAverager
from .session import PHASE_CURVATURE, PHASE_EPOCH, PHASE_GRADIENT, Session


class DataParty:
    role = "data party"

    def __init__(self, session: Session, X: torch.Tensor, penalized: torch.Tensor):
        self.s = session
        self.X = X
        self.X_cpu = X.detach().to("cpu", torch.float64)
        self.penalized = penalized.to(torch.float64)
        self.w = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
        self.averager = IterateAverager(session.plan.L)
        self.last_gradient: torch.Tensor | None = None

    @property
    def fed(self):
        return self.s.fed

    # ------------------------------------------------------------ local maths
    def local_margins(self, rows, v: torch.Tensor | None = None) -> torch.Tensor:
        """X_l[rows] v (default v = w_l) on the CPU, checked against the public margin cap."""
        with self.s.clock("plain"):
            u = (self.X[torch.as_tensor(rows, device=self.X.device)] @ (self.w if v is None else v)).to("cpu")
        peak = float(u.abs().max()) if u.numel() else 0.0
        if not peak <= MARGIN_MAX:
            raise DivergenceError(
                f"{self.fed.name()}: a partial margin reached |u| = {peak:.4g}, beyond the public cap "
                f"{MARGIN_MAX:g} of the fixed-point encoding. The model diverged: lower the learning rate "
                f"(or scale the features).")
        return u

    def update(self, p: torch.Tensor, eta: float) -> None:
        """w_l <- w_l - eta p_l, then record the iterate for SQN's averages."""
        with self.s.clock("plain"):
            self.w = self.w - eta * p.to(self.w.device, torch.float64)
            peak = float(self.w.abs().max()) if self.w.numel() else 0.0
            if not peak <= COEF_MAX:
                raise DivergenceError(f"{self.fed.name()}: a coefficient reached |w| = {peak:.4g} (cap {COEF_MAX:g}): "
                                      f"the model diverged; lower the learning rate")
            if self.s.plan.optimizer == "sqn":
                self.averager.add(self.w)

    # ------------------------------------------------------ gradient blocks
    def _send_block(self, enc_weights, rows, vector: torch.Tensor, *, masked: bool, bits: int):
        """[[weights^T X_l[rows] + |rows| lambda vector]] (masked or not) to the coordinator; returns the masks."""
        s = self.s
        with s.clock("he"):
            X_rows = self.X_cpu[torch.as_tensor(rows)]
            enc = s.scheme.fixed(s.scheme.matmul(enc_weights, X_rows, s.feature_frac_bits), s.bounds.F_G)
            if s.l2:
                enc = enc + (len(rows) * s.l2) * (self.penalized * vector.to("cpu", torch.float64))
            masks = None
            if masked:
                masks = s.masks.draw(X_rows.shape[1], s.bounds.mask_range_bits())
                enc = s.scheme.add_fixed(enc, masks)
        with s.clock("send"):
            s.scheme.send(self.fed, enc, s.coordinator, bits)
        return masks

    def gradient_step(self, enc_d, rows, eta: float, quasi_newton: bool) -> None:
        """Steps 2-3 above: the gradient block, then the update."""
        s = self.s
        with self.fed.phase(PHASE_GRADIENT):
            masked = not quasi_newton
            bits = s.bounds.masked_gradient_bits() if masked else s.bounds.gradient_bits()
            masks = self._send_block(enc_d, rows, self.w, masked=masked, bits=bits)
            with s.clock("recv"):
                if masked:
                    reply = self.fed.recv_json(s.coordinator)
                else:
                    p = self.fed.recv_tensor(s.coordinator, device="cpu").to(torch.float64)
        if masked:
            with s.clock("plain"):
                ints = unmask(reply, masks)
                p = from_fixed(ints, s.bounds.F_G, (len(ints),)) / len(rows)
            self.last_gradient = p
        self.update(p, eta)

    def curvature_block(self, enc_h, rows_H, s_l: torch.Tensor) -> None:
        """[[V_l]] = [[h]]^T X_l[S_H] + |S_H| lambda s_l to the coordinator (unmasked: it learns v)."""
        with self.fed.phase(PHASE_CURVATURE):
            self._send_block(enc_h, rows_H, s_l, masked=False, bits=self.s.bounds.hvp_bits())

    def send_s(self, s_l: torch.Tensor) -> None:
        peak = float(s_l.abs().max()) if s_l.numel() else 0.0
        if not peak <= COEF_MAX:
            raise DivergenceError(f"{self.fed.name()}: |s| = {peak:.4g} passed the cap {COEF_MAX:g}: the model diverged")
        with self.fed.phase(PHASE_CURVATURE), self.s.clock("send"):
            self.fed.send_tensor(s_l.to("cpu", torch.float64), self.s.coordinator)

    def close_window(self, k: int) -> None:
        """After update k = tL: close the averaging window; from t = 2 on, run a curvature round."""
        s_l = self.averager.close()
        if s_l is None:
            return
        rows_H = self.s.batches.hessian_rows(k // self.s.plan.L)
        self.send_s(s_l)
        self.curvature(rows_H, s_l)

    def curvature(self, rows_H, s_l: torch.Tensor) -> None:
        raise NotImplementedError

    def end_epoch(self) -> dict:
        """The coordinator's verdict: stop or go on (and, at the guest, the epoch loss)."""
        with self.fed.phase(PHASE_EPOCH), self.s.clock("recv"):
            return self.fed.recv_json(self.s.coordinator)

    def prepare(self, batches, k: int) -> float:
        """Fill the obfuscator pool for the coming epoch (iterations k + 1 ...); returns the offline seconds."""
        plan = self.s.plan
        count = sum(self.obfuscators_per_iteration(len(rows)) for rows in batches)
        pairs = sum(plan.pair_due(j) for j in range(k + 1, k + len(batches) + 1))
        count += pairs * self.obfuscators_per_curvature(self.s.bounds.hessian_batch)
        seconds = self.s.scheme.prepare(count)
        self.s.clock.add("offline", seconds)
        return seconds

    def obfuscators_per_iteration(self, rows: int) -> int:
        raise NotImplementedError

    def obfuscators_per_curvature(self, rows: int) -> int:
        raise NotImplementedError


__all__ = ["DataParty"]
