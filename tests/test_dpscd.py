"""DP-SCD and its variants at one party: optimum of non-private SCD, clipping, calibrated noise, bad input."""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.preprocessing import MaxAbsScaler, normalize
from sklearn.svm import LinearSVC

from vfltorch.comm import Federation
from vfltorch.data import VFLInputError
from vfltorch.privacy import DPSCD, DPSCDConfig, PrivacyBudgetError, fit_glm
from vfltorch.privacy.accountant import calibrate_sigma, epsilon_spent
from vfltorch.privacy.glm import dual_objective, make_glm, primal_objective

LAM = 1e-3
# SDCA converges linearly for the smooth losses but only sublinearly for the hinge: a larger lambda keeps the
# SVM test short (at lambda = 1e-3 it needs ~600 epochs for 1e-6; at 1e-2, 60).
TASK_LAM = {"ridge": 1e-3, "logistic": 1e-3, "svm": 1e-2}


@pytest.fixture(scope="module")
def paper_data():
    """breast_cancer with the paper's preprocessing: max-abs columns, unit rows; labels -1 / +1."""
    bc = load_breast_cancer()
    X = normalize(MaxAbsScaler().fit_transform(bc.data))
    y = np.where(bc.target == 0, 1.0, -1.0)
    return X, y


def P(task, X, y, theta, lam=LAM):
    glm = make_glm(task)
    return primal_objective(glm, torch.as_tensor(X @ theta), torch.as_tensor(y), float(theta @ theta), lam)


def reference_optimum(task, X, y, lam=LAM):
    """The minimum of P from scikit-learn, each solver's objective rescaled to ours (N = rows).

    Ridge:    ||y - X w||^2 + a ||w||^2           = 2 N P  with a = lambda N
    Logistic: (1/2)||w||^2 + c sum log(1 + e^-ym) = P / lambda with c = 1 / (lambda N)  (l2 penalty)
    L2-SVM:   (1/2)||w||^2 + c sum max(0, 1 - ym) = P / lambda with c = 1 / (lambda N)  (LinearSVC, hinge)
    No intercept anywhere: P has none. The solvers run to tight tolerances; we evaluate P at their
    solutions ourselves rather than trusting their stopping criteria.
    """
    n = X.shape[0]
    if task == "ridge":
        w = Ridge(alpha=lam * n, fit_intercept=False, solver="cholesky").fit(X, y).coef_
    elif task == "logistic":
        w = LogisticRegression(C=1 / (lam * n), fit_intercept=False, tol=1e-12, max_iter=100000).fit(X, y).coef_
    else:
        # liblinear warns that it did not meet tol=1e-12; its objective is stable to 1e-15 across max_iter.
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        w = LinearSVC(loss="hinge", C=1 / (lam * n), fit_intercept=False, dual=True, tol=1e-12,
                      max_iter=1_000_000).fit(X, y).coef_
    return P(task, X, y, np.ravel(w), lam)


@pytest.mark.parametrize("task", ["ridge", "logistic", "svm"])
def test_nonprivate_scd_reaches_the_scikit_learn_optimum(paper_data, task):
    X, y = paper_data
    lam = TASK_LAM[task]
    ref = reference_optimum(task, X, y, lam)
    model = DPSCD(task=task, variant="nonprivate", C=math.inf, lam=lam, epochs=60, L=50, monitor_every=0).fit(X, y)
    ours = P(task, X, y, model.coef_, lam)
    assert ours <= ref * (1 + 1e-4), (ours, ref)
    # The duality gap certifies it independently of scikit-learn.
    glm = make_glm(task)
    alpha = torch.as_tensor(model.dual_coef_)
    v = X.T @ model.dual_coef_
    gap = ours - dual_objective(glm, alpha, torch.as_tensor(y), float(v @ v), lam)
    assert -1e-12 <= gap <= 1e-4 * ours
    # theta = X^T alpha / (lambda N): the shared vector stayed consistent with alpha.
    np.testing.assert_allclose(model.coef_, v / (lam * len(y)), rtol=1e-9, atol=1e-12)


def unit_columns(X):
    return X / np.linalg.norm(X, axis=0, keepdims=True)


@pytest.mark.parametrize("variant", ["primal", "primal-rows"])
def test_primal_coordinate_descent_reaches_the_ridge_optimum(paper_data, variant):
    X, y = paper_data
    # No noise, no effective clipping: exact primal coordinate descent. Algorithm 2 (primal): all examples,
    # L = d coordinates per step, unit-norm columns (Lemma 4). primal-rows: full batches of examples (L = N).
    if variant == "primal":
        X = unit_columns(X)
    L = X.shape[1] if variant == "primal" else len(y)
    model = DPSCD(task="ridge", variant=variant, sigma=0.0, C=1e6, L=L, lam=1e-2, epochs=200,
                  monitor_every=0).fit(X, y)
    assert P("ridge", X, y, model.coef_, 1e-2) <= reference_optimum("ridge", X, y, 1e-2) * (1 + 1e-4)


def test_primal_needs_unit_norm_columns(paper_data):
    X, y = paper_data
    with pytest.raises(VFLInputError, match="every feature column to have L2 norm at most 1"):
        DPSCD(task="logistic", variant="primal", L=5, accountant="rdp").fit(X, y)


@pytest.mark.parametrize("variant", ["dual", "seq", "primal", "primal-rows"])
def test_clipped_steps_never_exceed_C(paper_data, variant):
    X, y = paper_data
    if variant == "primal":
        X = unit_columns(X)
    C = 0.02
    seen = []
    DPSCD(task="svm", variant=variant, epsilon=1.0, C=C, L=25, lam=LAM, epochs=2, accountant="rdp",
          monitor_every=0).fit(X, y, on_step=lambda t, batch, zeta, state: seen.append(zeta.abs().max().item()
                                                                                       if len(zeta) else 0.0))
    assert max(seen) <= C * (1 + 1e-12)
    assert max(seen) == pytest.approx(C)          # the bound binds: the check can fail


@pytest.mark.parametrize("variant", ["dual", "seq"])
def test_noise_added_has_the_calibrated_variance(paper_data, variant):
    X, y = paper_data
    n, d = X.shape
    eps, delta, L, C, epochs = 1.0, 1e-3, 25, 0.05, 6
    Xt = torch.as_tensor(X)
    noise_v, noise_a = [], []
    prev = {"v": torch.zeros(d), "alpha": torch.zeros(n, dtype=torch.float64)}

    def record(t, batch, zeta, state):
        # What was added beyond the clipped steps is the noise: v' - v - X_B^T zeta, alpha'_B - alpha_B - zeta.
        noise_v.append(state.v - prev["v"] - Xt[batch].T @ zeta)
        noise_a.append(state.alpha[batch] - prev["alpha"][batch] - zeta)
        prev["v"], prev["alpha"] = state.v.clone(), state.alpha.clone()

    model = seeded(lambda: DPSCD(task="logistic", variant=variant, epsilon=eps, delta=delta, L=L, C=C, lam=LAM,
                                 epochs=epochs, accountant="rdp", monitor_every=0,
                                 simulation_seed=21).fit(X, y, on_step=record))
    S = math.sqrt(2) * C if variant == "dual" else 2 * C * math.sqrt(L * (L + 1))
    assert model.sensitivity_ == pytest.approx(S)
    # Poisson batches: amplification at q = L / N over T steps. Fixed-size lots (seq): no amplification claimed,
    # one composition per epoch (each row is in one lot per epoch).
    q, T = (model.sample_rate_, model.steps_) if variant == "dual" else (1.0, epochs)
    sigma = calibrate_sigma(eps, delta, q, T, "rdp")
    assert model.sigma_ == sigma and model.noise_std_ == pytest.approx(sigma * S)
    assert epsilon_spent(sigma, q, T, delta, "rdp") <= eps
    for sample in (torch.cat(noise_v), torch.cat(noise_a)):
        assert_standard_normal((sample / model.noise_std_).numpy())


def seeded(fit):
    """A noise calibration test's fit with a fixed simulation seed (its draws repeat): the checks below hold for
    that one sample or never, instead of failing once in 10^4 runs by chance (a KS p-value of 8.4e-5 failed a
    clean-clone CI run on 2026-11-29). The seed changes where the noise comes from, not its distribution."""
    with pytest.warns(UserWarning, match="guarantee is VOID"):
        return fit()


def assert_standard_normal(z):
    k = len(z)
    # Sample variance of k standard normals: mean 1, sd sqrt(2 / k); allow 5 sd.
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / k), (z.var(), k)
    assert abs(z.mean()) < 5 / math.sqrt(k)
    assert stats.kstest(z, "norm").pvalue > 1e-4


def test_primal_noise_has_the_calibrated_variance(paper_data):
    X, y = paper_data
    X = unit_columns(X)
    eps, delta, L, C, epochs = 1.0, 1e-3, 5, 0.05, 20
    noise = []
    prev = {"theta": torch.zeros(X.shape[1], dtype=torch.float64)}

    def record(t, coords, zeta, state):
        # Algorithm 2: theta_B' = theta_B + zeta_B + noise on the L chosen coordinates, nothing elsewhere.
        delta_theta = state.v - prev["theta"]
        noise.append(delta_theta[coords] - zeta)
        others = torch.ones(len(delta_theta), dtype=torch.bool)
        others[coords] = False
        assert (delta_theta[others] == 0).all()
        prev["theta"] = state.v.clone()

    model = seeded(lambda: DPSCD(task="logistic", variant="primal", epsilon=eps, delta=delta, L=L, C=C, lam=LAM,
                                 epochs=epochs, accountant="rdp", monitor_every=0,
                                 simulation_seed=22).fit(X, y, on_step=record))
    S = 2 * C * math.sqrt(L * (L + 1))                       # Lemma 4
    assert model.sensitivity_ == pytest.approx(S) and model.sample_rate_ == 1.0
    assert model.steps_ == round(epochs * X.shape[1] / L)
    sigma = calibrate_sigma(eps, delta, 1.0, model.steps_, "rdp")    # every example in every step
    assert model.sigma_ == sigma and model.noise_std_ == pytest.approx(sigma * S)
    assert_standard_normal((torch.cat(noise) / model.noise_std_).numpy())


def test_dpsgd_noise_has_the_calibrated_variance():
    from vfltorch.privacy import DPSGD

    # Zero rows: every per-example gradient is 0, so theta moves by the noise (and the weight decay) alone:
    # theta_T = -(lr / B) sum_t (1 - lr lam)^(T - 1 - t) noise_t, noise_t ~ N(0, sigma^2 C^2 I_d).
    n, d, B, lr, lam, C = 200, 4000, 50, 0.5, 1e-3, 2.0
    X, y = np.zeros((n, d)), np.where(np.arange(n) % 2, 1.0, -1.0)
    model = seeded(lambda: DPSGD(task="logistic", epsilon=1.0, delta=1e-3, batch_size=B, C=C, lr=lr, lam=lam,
                                 epochs=1, accountant="rdp", monitor_every=0, simulation_seed=23).fit(X, y))
    T = model.steps_
    assert T == n // B and model.sigma_ == calibrate_sigma(1.0, 1e-3, 1 / T, T, "rdp")
    scale = (lr / B) * model.sigma_ * C * math.sqrt(sum((1 - lr * lam) ** (2 * k) for k in range(T)))
    assert_standard_normal(model.coef_ / scale)


def test_dp_scd_learns_and_reports_its_budget(paper_data):
    X, y = paper_data
    # 569 rows are few for DP: a loose budget, and the mean accuracy of twenty noise draws (majority: 0.63). 200
    # draws with OS-entropy noise (2026-11-29): mean 0.860, sd 0.039 (min 0.73), so a mean of twenty has sd 0.009
    # and 0.8 lies 6.9 sd below it (means of five failed: 0.790 in a full-suite run; their sd is 0.021). About 1.5 s.
    models = [DPSCD(task="logistic", epsilon=10.0, L=20, C=0.2, lam=1e-2, epochs=10, accountant="rdp").fit(X, y)
              for s in range(20)]
    assert np.mean([m.score(X, y) for m in models]) > 0.8
    model = models[0]
    assert 9.9 < model.epsilon_ <= 10.0
    assert [h["epoch"] for h in model.history_] == list(range(1, 11))
    eps = [h["epsilon"] for h in model.history_]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(model.epsilon_)
    # Only private outputs: no training objective, no dual variables, unless asked for / not private.
    assert all("objective" not in h for h in model.history_) and not hasattr(model, "dual_coef_")
    assert model.guarantee_void_ is False
    assert model.observers_["outsider"]["epsilon"] == model.epsilon_
    assert model.observers_["schedule_aware"]["epsilon"] > model.epsilon_     # no amplification for it


def test_secret_randomness_differs_between_runs_and_simulation_replays(paper_data):
    X, y = paper_data
    kw = dict(task="logistic", epsilon=1.0, L=20, C=0.1, lam=1e-2, epochs=2, accountant="rdp", monitor_every=0)
    batches = [[], []]
    a = DPSCD(**kw).fit(X, y, on_step=lambda t, b, z, s: batches[0].append(b.tolist()))
    b = DPSCD(**kw).fit(X, y, on_step=lambda t, b, z, s: batches[1].append(b.tolist()))
    assert (a.coef_ != b.coef_).all() and batches[0] != batches[1]          # schedule and noise: fresh
    with pytest.warns(UserWarning, match="guarantee is VOID"):
        c = DPSCD(**kw, simulation_seed=5).fit(X, y)
    with pytest.warns(UserWarning, match="guarantee is VOID"):
        d = DPSCD(**kw, simulation_seed=5).fit(X, y)
    np.testing.assert_array_equal(c.coef_, d.coef_)
    assert c.guarantee_void_ is True


@pytest.mark.parametrize("kwargs,message", [
    (dict(epsilon=0), "epsilon must be a positive number"),
    (dict(epsilon=-0.5), "epsilon must be a positive number"),
    (dict(delta=0), "delta must lie strictly between 0 and 1"),
    (dict(delta=1.5), "delta must lie strictly between 0 and 1"),
    (dict(L=0), "mini-batch size L must be a positive integer"),
    (dict(C=0), "clipping bound C must be a positive number"),
    (dict(C=-1.0), "clipping bound C must be a positive number"),
    (dict(lam=0), "regularisation lambda must be positive"),
    (dict(task="lasso"), "unknown task 'lasso'"),
    (dict(variant="fast"), "unknown variant 'fast'"),
    (dict(variant="seq", sampling="poisson"), "seqDP-SCD needs fixed-size lots"),
    (dict(accountant="moments"), "unknown accountant 'moments'"),
])
def test_bad_input_is_explained(paper_data, kwargs, message):
    X, y = paper_data
    with pytest.raises(VFLInputError, match=message):
        DPSCD(**{"task": "logistic", **kwargs}).fit(X, y)


def test_rows_that_are_not_normalised_are_refused_with_the_fix(paper_data):
    X, y = paper_data
    with pytest.raises(VFLInputError, match=r"norm at most 1.*--normalize-rows.*normalize_rows=True"):
        DPSCD(normalize_rows=False).fit(X * 3, y)
    # The default (as `vfl dpscd`) divides each row by its norm: the bound holds and fit_glm still checks it.
    model = DPSCD(epochs=1, accountant="rdp").fit(X * 3, y)
    assert model.epsilon_ <= 1.0 and model._unit_rows()
    np.testing.assert_allclose(model.decision_function(X * 3), model.decision_function(X), atol=1e-12)
    DPSCD(variant="nonprivate", epochs=1, normalize_rows=False).fit(X * 3, y)      # no sensitivity bound


def test_a_mini_batch_above_the_training_rows_is_clipped_with_a_warning(paper_data):
    X, y = paper_data
    with pytest.warns(UserWarning, match="L=10000 exceeds the 569 training rows; it is clipped to 569"):
        model = DPSCD(L=10_000, epochs=1, accountant="rdp").fit(X, y)
    assert model.L_ == 569 and model.sample_rate_ == 1.0 and model.epsilon_ <= 1.0
    unit_columns = X / np.linalg.norm(X, axis=0)      # primal DP-SCD bounds column norms (rows stay as given)
    with pytest.warns(UserWarning, match="L=100 exceeds the 30 features"):
        assert DPSCD(variant="primal", L=100, epochs=1, accountant="rdp").fit(unit_columns, y).L_ == 30


def test_an_unreachable_budget_is_explained(paper_data):
    X, y = paper_data
    with pytest.raises(PrivacyBudgetError, match="cannot be reached"):
        DPSCD(epsilon=1e-6, delta=1e-12, L=len(y), epochs=2000).fit(X, y)


def test_fit_glm_refuses_labels_that_do_not_fit_the_task(paper_data):
    X, _ = paper_data
    fed = Federation.local()
    with pytest.raises(VFLInputError, match="needs binary labels -1 / \\+1"):
        fit_glm(fed, torch.as_tensor(X), torch.arange(len(X), dtype=torch.float64), DPSCDConfig(task="svm"))
