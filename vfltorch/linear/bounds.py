"""Public fixed-point scales and magnitude bounds of every encrypted message.

Paillier works on integers: a real x travels as m = round(x 2^f). The scales
f used here are fixed public constants, so the headers of encrypted messages
(``vfltorch.crypto.transport``) carry no data-dependent scale:

==========  =====================================================  ==========
name        what                                                   f (bits)
==========  =====================================================  ==========
F_U         margins u_l = X_l w_l, their encrypted sums, z_l = X_l s_l   40
F_D         residuals d = u/4 - y/2, curvature weights h = s^T x / 4    42
F_X         features, the multipliers of [[d]]^T X and [[h]]^T X        16 (``feature_frac_bits``)
F_M         margins as multipliers in the loss ([[U]]^T (2 u_B - 4y))   16
F_Q = F_L   sum of squared margins, 8 x the batch loss                  F_U + F_M
F_G         gradient and Hessian-vector blocks                          F_D + F_X
==========  =====================================================  ==========

Magnitude bounds. Every encrypted tensor carries a bound B >= |m| that the
crypto module tracks and checks before any operation could wrap around the
plaintext ring; the bound also travels in the message header as a bit
count. A tracked bound depends on the data (e.g. sum_i |x_ij| over a batch),
so the header would leak its order of magnitude. Instead each message is sent
with a *public* bound computed here from public caps only:

* |u_l| <= MARGIN_MAX and |X_l s_l| <= MARGIN_MAX at every party (a party whose
  margins pass the cap stops with ``DivergenceError``: the model diverged),
* |x| <= FEATURE_MAX for every feature after preprocessing (checked at fit),
* |w_j|, |s_j| <= COEF_MAX,
* batch sizes, the number of parties and lambda (public hyperparameters).

The formulas below mirror the crypto module's bound rules on the worst case
(a receiver tracks 2^bits - 1 for a header of ``bits``), so the public bound
always covers the tracked one; ``send_encrypted`` refuses it otherwise.

Masks. A gradient block G (bound 2^b) is masked by r uniform in
[0, 2^(b + sigma)): the masked value m + r is within statistical distance
2^-sigma of uniform on that range, whatever m is (sigma = ``mask_bits``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

F_U = 40
F_D = F_U + 2        # 0.25 * [[U]] costs nothing but two fractional bits
F_M = 16             # one multiplier column per iteration: precision is cheap here, unlike F_X
MARGIN_MAX = 2.0 ** 20
FEATURE_MAX = 2.0 ** 20
COEF_MAX = 2.0 ** 20


class DivergenceError(RuntimeError):
    """The model's margins or coefficients left the public range of the fixed-point encoding."""


def fixed(value: float, frac_bits: int) -> int:
    """ceil(value 2^frac_bits) for a non-negative public value."""
    return math.ceil(value * (1 << frac_bits))


def quantize(x, frac_bits: int):
    """round(x 2^f) / 2^f: the value a plaintext multiplier has once encoded with f fractional bits.

    Scaling by a power of two is exact and ``torch.round`` rounds half to even,
    as the crypto module's encoder does, so encoding a quantised tensor again
    gives the same integers.
    """
    return torch.round(x * 2.0 ** frac_bits) / 2.0 ** frac_bits


def received(bits: int) -> int:
    """The bound a receiver tracks for a header declaring ``bits``."""
    return (1 << bits) - 1


@dataclass(frozen=True)
class PublicBounds:
    """Bit counts of every message, from public quantities only."""

    parties: int              # data parties Q (the guest and Q - 1 hosts)
    batch: int                # rows per mini-batch |S| (the largest batch)
    hessian_batch: int        # |S_H|
    l2: float
    feature_frac_bits: int    # F_X
    mask_bits: int            # sigma

    @property
    def F_X(self) -> int:
        return self.feature_frac_bits

    @property
    def F_Q(self) -> int:
        return F_U + F_M

    @property
    def F_G(self) -> int:
        return F_D + self.feature_frac_bits

    # ---------------------------------------------------------------- margins
    def margin_sum_bits(self, hosts: int) -> int:
        """[[U_j]], the encrypted sum of the first j hosts' margins (also [[Z_j]] for s^T x)."""
        bound = fixed(MARGIN_MAX, F_U)
        for _ in range(1, hosts):
            bound = received(bound.bit_length()) + fixed(MARGIN_MAX, F_U)
        return bound.bit_length()

    def square_sum_bits(self, hosts: int) -> int:
        """[[Q_j]] = [[sum_i U_{j,i}^2]] along the host chain (at F_Q)."""
        bound = fixed(self.batch * MARGIN_MAX ** 2, self.F_Q)
        for j in range(1, hosts):
            bound = (received(bound.bit_length())
                     + received(self.margin_sum_bits(j)) * self.batch * fixed(2 * MARGIN_MAX, F_M)
                     + fixed(self.batch * MARGIN_MAX ** 2, self.F_Q))
        return bound.bit_length()

    # -------------------------------------------------------------- residuals
    def residual_bits(self) -> int:
        """[[d]] = 0.25 [[U]] + (0.25 u_B - 0.5 y) at F_D; also [[h]] = 0.25 ([[Z]] + z_B)."""
        plain = fixed(0.25 * MARGIN_MAX + 0.5, F_D)
        hosts = self.parties - 1
        if hosts == 0:
            return plain.bit_length()
        return (received(self.margin_sum_bits(hosts)) + plain).bit_length()

    def loss_bits(self) -> int:
        """[[8 sum_i l_i]] = [[Q]] + [[U]] @ (2 u_B - 4 y) + plain, at F_Q."""
        plain = fixed(self.batch * (MARGIN_MAX ** 2 + 4 * MARGIN_MAX + 8), self.F_Q)
        hosts = self.parties - 1
        if hosts == 0:
            return plain.bit_length()
        return (received(self.square_sum_bits(hosts))
                + received(self.margin_sum_bits(hosts)) * self.batch * fixed(2 * MARGIN_MAX + 4, F_M)
                + plain).bit_length()

    # ------------------------------------------------------- gradient blocks
    def block_bits(self, rows: int) -> int:
        """[[G_l]] = [[d]]^T X_l + |S| lambda w_l (or [[h]]^T X_l + |S_H| lambda s_l) at F_G."""
        return (received(self.residual_bits()) * rows * fixed(FEATURE_MAX, self.F_X)
                + fixed(rows * self.l2 * COEF_MAX, self.F_G)).bit_length()

    def gradient_bits(self) -> int:
        return self.block_bits(self.batch)

    def hvp_bits(self) -> int:
        return self.block_bits(self.hessian_batch)

    def mask_range_bits(self) -> int:
        """Masks r are uniform in [0, 2^this)."""
        return self.gradient_bits() + self.mask_bits

    def masked_gradient_bits(self) -> int:
        return self.mask_range_bits() + 1

    def total_bits(self) -> int:
        """The largest header bound of the protocol: the key must leave room above it."""
        return max(self.masked_gradient_bits(), self.hvp_bits(), self.loss_bits())


__all__ = ["COEF_MAX", "DivergenceError", "FEATURE_MAX", "F_D", "F_M", "F_U", "MARGIN_MAX", "PublicBounds",
           "fixed", "quantize", "received"]
