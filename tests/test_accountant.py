"""The noise calibration against opacus: sigma meets the budget and is within 1 % of the smallest that does."""

import warnings

import pytest
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.utils import get_noise_multiplier

from vfltorch.data import VFLInputError
from vfltorch.privacy.accountant import (RDP_ORDERS, PrivacyAccountant, PrivacyBudgetError, calibrate_sigma,
                                         epsilon_spent)


def opacus_epsilon(mechanism, sigma, q, steps, delta):
    """epsilon straight from an opacus accountant fed one step at a time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = create_accountant(mechanism)
        for _ in range(steps):
            acc.step(noise_multiplier=sigma, sample_rate=q)
        if mechanism == "rdp":
            return acc.get_epsilon(delta, alphas=list(RDP_ORDERS))
        return acc.get_epsilon(delta)


# (epsilon, delta, q, steps): the paper's budgets at typical DP-SCD settings.
BUDGETS = [(0.1, 1e-3, 100 / 8291, 829), (0.5, 1e-3, 1000 / 8291, 82), (1.0, 1e-3, 100 / 24420, 2442),
           (2.0, 1e-3, 0.05, 200), (1.0, 1e-5, 1.0, 10)]


@pytest.mark.parametrize("epsilon,delta,q,steps", BUDGETS)
def test_rdp_sigma_meets_the_budget_and_is_within_one_percent_of_the_smallest(epsilon, delta, q, steps):
    sigma = calibrate_sigma(epsilon, delta, q, steps, "rdp")
    assert opacus_epsilon("rdp", sigma, q, steps, delta) <= epsilon
    assert opacus_epsilon("rdp", 0.99 * sigma, q, steps, delta) > epsilon
    # opacus' own search (epsilon tolerance, not sigma) lands on a sigma no smaller than ours.
    theirs = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps,
                                  accountant="rdp", epsilon_tolerance=1e-3 * epsilon, alphas=list(RDP_ORDERS))
    assert sigma <= theirs * (1 + 1e-3)


def test_prv_and_gdp_are_selectable_and_calibrated():
    epsilon, delta, q, steps = 1.0, 1e-3, 0.02, 250
    for mechanism in ("prv", "gdp"):
        sigma = calibrate_sigma(epsilon, delta, q, steps, mechanism)
        assert epsilon_spent(sigma, q, steps, delta, mechanism) <= epsilon
        assert epsilon_spent(0.99 * sigma, q, steps, delta, mechanism) > epsilon
    # PRV is tighter than RDP: the same budget needs less noise.
    assert calibrate_sigma(epsilon, delta, q, steps, "prv") < calibrate_sigma(epsilon, delta, q, steps, "rdp")


def test_epsilon_spent_follows_the_run_step_by_step():
    sigma, q, delta = 1.3, 0.01, 1e-3
    acc = PrivacyAccountant("rdp")
    spent = []
    for t in range(1, 301):
        acc.step(sigma, q)
        if t % 100 == 0:
            spent.append(acc.epsilon(delta))
    assert spent == sorted(spent) and len(set(spent)) == 3
    assert spent[-1] == pytest.approx(opacus_epsilon("rdp", sigma, q, 300, delta), rel=1e-12)
    assert acc.steps == 300
    # opacus' default orders (<= 63) give a larger, looser epsilon in the small-epsilon regime.
    loose = RDPAccountant()
    loose.history = [(20.0, 0.0125, 800)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert epsilon_spent(20.0, 0.0125, 800, delta) < loose.get_epsilon(delta)


@pytest.mark.parametrize("epsilon,delta,message", [
    (0.0, 1e-3, "epsilon must be a positive number"),
    (-1.0, 1e-3, "epsilon must be a positive number"),
    (float("inf"), 1e-3, "epsilon must be a positive number"),
    (1.0, 0.0, "delta must lie strictly between 0 and 1"),
    (1.0, 1.0, "delta must lie strictly between 0 and 1"),
])
def test_bad_budgets_are_explained(epsilon, delta, message):
    with pytest.raises(VFLInputError, match=message):
        calibrate_sigma(epsilon, delta, 0.01, 100)


def test_a_budget_beyond_the_accountants_range_is_explained():
    with pytest.raises(PrivacyBudgetError, match=r"cannot be reached.*largest opacus supports.*Raise --epsilon"):
        calibrate_sigma(1e-7, 1e-12, 1.0, 100000)
