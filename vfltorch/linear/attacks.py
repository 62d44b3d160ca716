"""The attacks that the hetero-LR protocols are audited with (tests/test_hetero_lr_attacks.py, experiments).

Each attack is run by the party with most to gain, on everything that party
holds at the end of a run: what it received, the public schedule (which rows
form each batch, the step sizes) and its own data.

* Host label inference. In the paper's protocol the host knows its block w_A
  after every step, hence its gradient g_k = (w_{k-1} - w_k) / eta - lambda w_{k-1}
  = (1/|S|) X_A[S_k]^T d_{S_k}. ``first_batch_labels``: at k = 1, w = 0 and
  d = -y/2, so X_A[S_1]^T y = -2 |S_1| g_1, a 0/1 program in |S_1| unknowns
  (HiGHS solves it in milliseconds for |S| = 50). ``stacked_residuals``: one
  residual r_i per row, least squares over every step's equations
  (1/|S|) X_A[S_k]^T r_{S_k} = g_k; -r ranks the labels (d = u/4 - y/2).
  Against the shared protocol the same code gets the host's *share* of w_A
  after every step, which is uniform: it learns nothing.
* Own-columns baseline (``own_columns_auc``): the best the host can do
  legitimately, a logistic regression fitted on its own columns with every
  true label, scored in-sample.
* Coordinator Hessian fit (``hessian_fit``): from curvature pairs (s_t, v_t)
  with v_t = H s_t, least squares for H; its cross-party block is
  (1/4) X_B^T X_A / n, the correlations between the parties' columns.
* Guest feature reconstruction (``r_squared``): regress each host column on
  the per-row values the guest received (e.g. per-epoch test scores minus its
  own part).
"""

from __future__ import annotations

import numpy as np
import torch

from ..devices import to_numpy

def gradients_from_trajectory(weights, etas, l2: float, penalized=None) -> list[np.ndarray]:
    """g_k = (w_{k-1} - w_k) / eta_k - lambda w_{k-1} from the iterates w_1, w_2, ... (w_0 = 0)."""
    out = []
    prev = np.zeros_like(np.asarray(weights[0], dtype=np.float64))
    pen = np.ones_like(prev) if penalized is None else np.asarray(penalized, dtype=np.float64)
    for w, eta in zip(weights, etas):
        w = np.asarray(w, dtype=np.float64)
        out.append((prev - w) / eta - l2 * pen * prev)
        prev = w
    return out


def first_batch_labels(X_rows, g1, time_limit: float = 20.0):
    """Labels in {-1, +1} of the first batch from X_A[S]^T y = -2 |S| g_1 (a 0/1 program); None if none fits."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    A = np.asarray(X_rows, dtype=np.float64)
    n = A.shape[0]
    rhs = -2.0 * n * np.asarray(g1, dtype=np.float64) + A.sum(axis=0)       # y = 2b - 1
    tol = 1e-6 * max(1.0, float(np.abs(rhs).max()))
    if not np.all(np.isfinite(rhs)):
        return None
    res = milp(c=np.zeros(n), constraints=LinearConstraint(2.0 * A.T, rhs - tol, rhs + tol),
               integrality=np.ones(n), bounds=Bounds(0, 1), options={"time_limit": time_limit})
    if res.x is None:
        return None
    return 2.0 * np.round(res.x) - 1.0


def stacked_residuals(X, batches, grads) -> np.ndarray:
    """Least-squares per-row residuals r from (1/|S_k|) X[S_k]^T r[S_k] = g_k over every step k."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.linalg import lsqr

    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    data, row_idx, col_idx = [], [], []
    b = np.zeros(len(batches) * d)
    for k, (rows, g) in enumerate(zip(batches, grads)):
        rows = np.asarray(rows)
        block = X[rows].T / len(rows)                       # d x |S_k|
        data.append(block.ravel())
        row_idx.append(np.repeat(np.arange(k * d, (k + 1) * d), len(rows)))
        col_idx.append(np.tile(rows, d))
        b[k * d:(k + 1) * d] = g
    A = csr_matrix((np.concatenate(data), (np.concatenate(row_idx), np.concatenate(col_idx))),
                   shape=(len(batches) * d, n))
    if not np.all(np.isfinite(b)):
        return np.zeros(n)
    if n <= 2000:
        r, *_ = np.linalg.lstsq(A.toarray(), b, rcond=None)
        return r
    return lsqr(A, b, atol=1e-10, btol=1e-10, iter_lim=5000)[0]


def auc(scores, y) -> float:
    from sklearn.metrics import roc_auc_score

    scores = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return float(roc_auc_score(np.asarray(y) > 0, scores))


def own_columns_auc(X, y) -> float:
    """In-sample AUC of a logistic regression on the host's own columns, fitted with every true label."""
    from sklearn.linear_model import LogisticRegression

    X = np.asarray(X, dtype=np.float64)
    model = LogisticRegression(C=1e4, max_iter=5000).fit(X, np.asarray(y) > 0)
    return auc(model.decision_function(X), y)


def hessian_fit(pairs, dim: int) -> np.ndarray | None:
    """Least-squares H with v_t = H s_t from the pairs (s_t, v_t); None without pairs."""
    pairs = [(np.asarray(s, dtype=np.float64), np.asarray(v, dtype=np.float64)) for s, v in pairs]
    if not pairs:
        return None
    S = np.stack([s for s, _ in pairs])
    V = np.stack([v for _, v in pairs])
    Ht, *_ = np.linalg.lstsq(S, V, rcond=None)          # S H^T = V
    H = Ht.T
    return 0.5 * (H + H.T)


def correlation(a, b) -> float:
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def r_squared(features, targets) -> np.ndarray:
    """R^2 of each column of ``targets`` regressed (with an intercept) on ``features`` (None: intercept only)."""
    T = np.asarray(targets, dtype=np.float64)
    n = T.shape[0]
    F = np.ones((n, 1))
    if features is not None and np.asarray(features).size:
        F = np.column_stack([F, np.asarray(features, dtype=np.float64).reshape(n, -1)])
    coef, *_ = np.linalg.lstsq(F, T, rcond=None)
    resid = T - F @ coef
    total = ((T - T.mean(axis=0)) ** 2).sum(axis=0)
    return 1.0 - (resid ** 2).sum(axis=0) / np.where(total > 0, total, 1.0)


def record_views(host_rank: int = 1) -> dict:
    """Install recorders in this process of what each role holds; returns the dict they fill.

    ``trajectory``: at the host, (its block of w, eta) after every step under the paper protocol, or
    (its *share* of its block, eta) under the shared one; ``scores``: at the guest, every per-row score
    vector it received with its own part X_B w_B + b; ``pairs``: at the paper coordinator, every curvature
    pair (s, v) it decrypted. Call it once per process (a test or experiment job), before training.
    """
    from . import estimator, lbfgs, party, shared

    views = {"trajectory": [], "scores": [], "pairs": []}
    original_update = party.DataParty.update

    def update(self, p, eta):
        original_update(self, p, eta)
        if self.fed.rank == host_rank:
            views["trajectory"].append((self.w.clone(), eta))

    original_iteration = shared.SharedRole.iteration

    def iteration(self, rows, k, eta, quasi_newton):
        original_iteration(self, rows, k, eta, quasi_newton)
        if self.index is not None and self.fed.rank == host_rank:
            views["trajectory"].append((shared.FP.decode(self.shares[1]), eta))

    original_push = lbfgs.CurvatureMemory.push

    def push(self, s, v):
        views["pairs"].append((s.clone(), v.clone()))
        return original_push(self, s, v)

    original_scores = estimator.HeteroLogisticRegression._scores

    def scores(self, fed, X_rows):
        u = original_scores(self, fed, X_rows)
        if u is not None:
            w = self._role_.w
            own = X_rows.to(torch.float64) @ w[:-1] + w[-1] if self.fit_intercept else X_rows.to(torch.float64) @ w
            views["scores"].append((u.clone(), own))
        return u

    party.DataParty.update = update
    shared.SharedRole.iteration = iteration
    lbfgs.CurvatureMemory.push = push
    estimator.HeteroLogisticRegression._scores = scores
    return views


def as_numpy(x) -> np.ndarray:
    return to_numpy(x)


__all__ = ["auc", "correlation", "first_batch_labels", "gradients_from_trajectory", "hessian_fit",
           "own_columns_auc", "r_squared", "record_views", "stacked_residuals"]
