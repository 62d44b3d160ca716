"""Noise calibration and privacy bookkeeping on opacus' accountants.

Every DP method in this package is a *Poisson-subsampled Gaussian mechanism*
repeated T times: at each step a batch is drawn with sampling rate q, an
update with L2 sensitivity S is computed, and Gaussian noise of standard
deviation sigma * S is added. The privacy of such a run depends only on the
noise multiplier sigma, q and T; opacus' accountants turn (sigma, q, T, delta)
into epsilon:

* ``prv`` (default): numerical composition of privacy loss random variables
  (Gopi et al.); opacus returns an upper bound on epsilon, within
  ``eps_error``. It is tighter than RDP: at the paper's setting (N = 6218,
  L = 100, 10 epochs, delta = 1e-3) RDP needs 10-16 % more noise.
* ``rdp``: Renyi DP of the subsampled Gaussian (Mironov et al.),
  converted to (epsilon, delta). We pass orders up to 1024 instead of opacus'
  default (<= 63): with epsilon near 0.1 the optimal order lies beyond 63 and
  the default orders overstate epsilon by up to a third.
* ``gdp``: the Gaussian-DP central limit approximation. opacus itself warns
  that it can *under*estimate epsilon; it is here for comparison only.

This module does the one thing opacus does not: the inverse map. opacus'
``get_noise_multiplier`` stops when epsilon is within an absolute 0.01 of the
target, which at epsilon = 0.1 is 10 %; ``calibrate_sigma`` bisects on sigma
instead and returns the smallest sigma (to a relative ``rtol``, default 1e-3)
whose epsilon does not exceed the target.
"""

from __future__ import annotations

import functools
import math
import warnings

from opacus.accountants import create_accountant
from opacus.accountants.rdp import RDPAccountant
from opacus.accountants.utils import MAX_SIGMA

from ..data import VFLInputError
from .config import DEFAULT_MECHANISM, MECHANISMS, check_budget, check_mechanism  # noqa: F401  (the library's)


# opacus' default orders, then sparser large orders for the small-epsilon regime.
RDP_ORDERS = tuple(RDPAccountant.DEFAULT_ALPHAS) + tuple(range(64, 257, 8)) + (320, 384, 512, 768, 1024)

# The smallest noise multiplier the calibration will return: below it a run is not private in any useful sense.
MIN_SIGMA = 1e-3


class PrivacyBudgetError(VFLInputError):
    """The requested (epsilon, delta) cannot be met with any noise multiplier the accountant supports."""




def epsilon_spent(sigma: float, sample_rate: float, steps: int, delta: float, mechanism: str = DEFAULT_MECHANISM
                  ) -> float:
    """epsilon after ``steps`` Poisson-subsampled Gaussian steps, as opacus' ``mechanism`` accountant computes it."""
    if steps <= 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    return _epsilon(float(sigma), float(sample_rate), int(steps), float(delta), check_mechanism(mechanism))


@functools.lru_cache(maxsize=4096)
def _epsilon(sigma: float, sample_rate: float, steps: int, delta: float, mechanism: str) -> float:
    with warnings.catch_warnings():
        # rdp: "optimal order is the largest alpha" (we already pass large orders);
        # gdp: "experimental", documented above; prv at q = 1: log(0) inside opacus, harmless.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        if mechanism == "rdp":
            # RDP composes by addition: T steps cost T times one step's RDP, which depends on (sigma, q) only. opacus
            # recomputes it at every call (0.2 s for our 160 orders), so the per-epoch epsilon of a run re-did it for
            # every epoch; the same numbers (sum over one history entry = that entry), computed once.
            from opacus.accountants.analysis.rdp import get_privacy_spent

            eps, _ = get_privacy_spent(orders=list(RDP_ORDERS), rdp=_rdp_one_step(sigma, sample_rate) * steps,
                                       delta=delta)
            return float(eps)
        accountant = create_accountant(mechanism)
        accountant.history = [(sigma, sample_rate, steps)]
        if mechanism == "prv":
            # opacus' default eps_error (0.01) is 10 % of epsilon = 0.1.
            try:
                return float(accountant.get_epsilon(delta, eps_error=_prv_eps_error(sigma, sample_rate, steps, delta)))
            except ValueError:
                # "Floating point errors will dominate" (delta ~ 1e-12): RDP's bound is valid there, if looser.
                return _epsilon(sigma, sample_rate, steps, delta, "rdp")
        return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def _rdp_one_step(sigma: float, sample_rate: float):
    """One Poisson-subsampled Gaussian step's RDP at every order of ``RDP_ORDERS`` (read-only: callers scale it)."""
    from opacus.accountants.analysis.rdp import compute_rdp

    rdp = compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=1, orders=list(RDP_ORDERS))
    rdp.setflags(write=False)
    return rdp


def _prv_eps_error(sigma, sample_rate, steps, delta) -> float:
    # A coarse RDP estimate sets the scale; PRV's cost grows as 1 / eps_error.
    rough = _epsilon(sigma, sample_rate, steps, delta, "rdp")
    return float(min(0.01, max(1e-3, 0.005 * rough)))


@functools.lru_cache(maxsize=1024)
def calibrate_sigma(epsilon: float, delta: float, sample_rate: float, steps: int, mechanism: str = DEFAULT_MECHANISM,
                    rtol: float = 1e-3) -> float:
    """The smallest noise multiplier sigma with epsilon_spent(sigma, q, steps, delta) <= epsilon.

    Returns ``sigma_high`` from a bisection that keeps
    ``eps(sigma_high) <= epsilon < eps(sigma_low)`` and stops when
    ``sigma_high / sigma_low <= 1 + rtol``; the answer is therefore within a
    relative ``rtol`` of the smallest admissible sigma (epsilon decreases
    monotonically in sigma). Raises ``PrivacyBudgetError`` when even opacus'
    largest noise multiplier (``MAX_SIGMA`` = 1e6) does not reach the budget.
    """
    check_budget(epsilon, delta)
    check_mechanism(mechanism)
    if not 0 < sample_rate <= 1:
        raise VFLInputError(f"the sampling rate q = L / N must be in (0, 1], got {sample_rate:g}")
    if steps < 1:
        raise VFLInputError(f"a private run needs at least one step, got {steps}")

    def eps(s):
        return epsilon_spent(s, sample_rate, steps, delta, mechanism)

    def unreachable():
        return PrivacyBudgetError(
            f"(epsilon={epsilon:g}, delta={delta:g}) cannot be reached: even the noise multiplier "
            f"sigma={MAX_SIGMA:g} (the largest opacus supports) spends epsilon={eps(MAX_SIGMA):.4g} over "
            f"{steps} steps at sampling rate q={sample_rate:.4g} ({mechanism} accountant). Raise --epsilon "
            f"or --delta, train fewer --epochs, or use a smaller mini-batch L (a smaller q).")

    if mechanism == "prv":
        # PRV evaluations are slow: bracket with RDP (fast, looser: its sigma is enough for PRV too), refine with PRV.
        # A budget RDP cannot reach at sigma = 1e6 is refused (refusing is always safe; PRV there is very slow).
        high = calibrate_sigma(epsilon, delta, sample_rate, steps, "rdp", rtol)
    else:
        high = 1.0
    while eps(high) > epsilon:
        high *= 2.0
        if high > MAX_SIGMA:
            raise unreachable()
    low = high / 2.0
    while eps(low) <= epsilon:
        high = low
        low /= 2.0
        if low < MIN_SIGMA:
            return high
    while high / low > 1.0 + rtol:
        mid = math.sqrt(low * high)
        if eps(mid) <= epsilon:
            high = mid
        else:
            low = mid
    return high


class PrivacyAccountant:
    """The epsilon spent by a run so far: one opacus accountant fed one step at a time.

    ``step(noise_multiplier, sample_rate)`` is what a training loop calls after
    each noisy update; ``epsilon(delta)`` asks opacus for the spend so far.
    """

    def __init__(self, mechanism: str = DEFAULT_MECHANISM):
        self.mechanism = check_mechanism(mechanism)
        self.history: list[tuple[float, float, int]] = []

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            s, q, n = self.history[-1]
            self.history[-1] = (s, q, n + steps)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self.history)

    def epsilon(self, delta: float) -> float:
        if not self.history:
            return 0.0
        if len(self.history) == 1:
            return epsilon_spent(*self.history[0], delta, self.mechanism)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            accountant = create_accountant(self.mechanism)
            accountant.history = list(self.history)
            if self.mechanism == "rdp":
                return float(accountant.get_epsilon(delta, alphas=list(RDP_ORDERS)))
            return float(accountant.get_epsilon(delta))
