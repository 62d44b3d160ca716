"""What FDSKL's active party is opened during a real fit, and an attack that solves it for the passive columns.

Issue 35. Under the bounded model's default (``protocol='shared'``, ``solver='adam'``) the active party A is
opened, at every iteration t, f on its batch rows I_t (so it knows L'_t = L'(f_i, y_i)) and the D gradient sums

    g_tj = sum_{i in I_t} L'_ti sqrt2 cos(x_i^A . w_j^A + x_i^P . w_j^P + b_j).

W comes from the public seed and the broadcast width, and under ``shared`` b_j comes from a public key, so the
only unknowns are the passive columns x_i^P of the batch rows: B d_P numbers against D equations per step
(breast cancer at Q = 3: 32 x 20 = 640 against 1536), and every row comes back once per epoch.

``record_active_view`` (called inside the active party's process, before ``fit``) keeps, for the main training
run, what A holds anyway: its rows, the public width and seeds, the batches (public seed), L' and the opened
sums. It does not change what the protocol computes. ``attack_steps`` is the attacker: per step, a bounded
quasi-Newton fit of the cosine sums (low frequencies first, random starts until one reaches the quantisation
floor of the opened sums, which only the right answer reaches).

``pooled_equations`` / ``pooled_attack`` are the pooled attacker: every number A was opened in the run, modelled
exactly as a function of all n d_P passive values, solved jointly (under ``sealed``, the default: f on every step's
batch rows, with alpha_t a known combination of the features of earlier batches, the opened averaged alpha, and f
of the current iterate on the monitor rows at every epoch end, whose passive values are unknowns too).
With the width selection (sealed: ``selection.select_width_sealed``) it pools each candidate's openings too: f on
its batch rows and f of its averaged model on the held-out rows, in the same unknowns (the selection's rows are
training rows). Against ``shared`` the
first step alone suffices: at t = 0 f = 0, so |L'| = 1/2 on every row; later steps' small |L'| leave most rows of
a batch below the sums' quantisation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

SQRT2 = math.sqrt(2.0)


# --------------------------------------------------------------------------------------------- the view
def record_active_view(view: dict) -> None:
    """Patch this process's FDSKL so that the main training run (``train_budget`` called by the estimator) leaves
    A's view in ``view``: ``X`` (A's rows as trained on), ``fmap``, ``cfg``, ``steps`` = [(t, cols, sums, B)] and
    ``lprime`` = [L' of iteration 0, 1, ...]."""
    from vfltorch.kernels import budget, estimator

    original_train, original_step = estimator.train_budget, budget._Optimizer.step
    original_sealed = estimator.train_sealed
    state = {"recording": False}

    class _RecordingLoss:
        """The loss, keeping every f A was opened and its L' in ``sink`` (while ``on()``)."""

        def __init__(self, loss, sink=view, on=lambda: state["recording"]):
            self._loss, self._sink, self._on = loss, sink, on

        def __getattr__(self, name):
            return getattr(self._loss, name)

        def derivative(self, f, y):
            d = self._loss.derivative(f, y)
            if self._on():
                self._sink["lprime"].append(d.detach().to("cpu", torch.float64).clone())
                self._sink["f"].append(f.detach().to("cpu", torch.float64).clone())
            return d

    def recorded(trainer):
        def train(fed, fmap, X, y, cfg, **kw):
            first = fed.is_active and "X" not in view
            if first:
                view.update(X=X.detach().cpu().clone(), y=y.detach().cpu().clone(), fmap=fmap, cfg=cfg, steps=[],
                            lprime=[], f=[])
                cfg = dataclasses.replace(cfg, loss=_RecordingLoss(cfg.loss))
                state["recording"] = True
            try:
                result = trainer(fed, fmap, X, y, cfg, **kw)
                if first:
                    view["alpha"] = None if result.alpha is None else result.alpha.detach().cpu().clone()
                return result
            finally:
                state["recording"] = False
        return train

    def step(self, t, cols, sums, B):
        if state["recording"]:
            view["steps"].append((int(t), cols.detach().cpu().clone(), sums.detach().cpu().to(torch.float64).clone(),
                                  int(B)))
        return original_step(self, t, cols, sums, B)

    from vfltorch.kernels import sealed

    original_values = sealed.SealedMonitor.values

    def values(self, fed, share, D, **kw):
        # the held-out f A is opened at each epoch end (of the current iterate), and its own columns of those rows
        out = original_values(self, fed, share, D, **kw)
        if state["recording"] and out is not None:
            view.setdefault("monitor_f", []).append(out.detach().cpu().to(torch.float64).clone())
            view["X_mon"] = self.X.detach().cpu().to(torch.float64).clone()
        return out

    # The sealed width selection (selection.py): the split of the training rows (public seed) and, per candidate,
    # its map, config, f on its batch rows with L', and f of its averaged model on the held-out rows.
    from vfltorch.kernels import selection

    original_candidate, original_rows = selection.train_sealed, selection.selection_rows

    def selection_rows(n, seed):
        out = original_rows(n, seed)
        view["selection_rows"] = out
        return out

    def candidate(fed, fmap, X, y, cfg, **kw):
        if not fed.is_active:
            return original_candidate(fed, fmap, X, y, cfg, **kw)
        rec = {"fmap": fmap, "cfg": cfg, "lprime": [], "f": []}
        result = original_candidate(fed, fmap, X, y, dataclasses.replace(cfg, loss=_RecordingLoss(cfg.loss, rec,
                                                                                                   lambda: True)),
                                    **kw)
        rec["held_out_f"] = result.held_out_f.detach().cpu().to(torch.float64).clone()
        view.setdefault("candidates", []).append(rec)
        return result

    selection.selection_rows, selection.train_sealed = selection_rows, candidate
    estimator.train_budget = recorded(original_train)
    estimator.train_sealed = recorded(original_sealed)
    budget._Optimizer.step = step
    sealed.SealedMonitor.values = values


def public_view(view: dict, passive_columns) -> dict:
    """A's view as plain tensors: own rows and W^A, the public b and W^P (from the seed and the broadcast width,
    for the passive parties' global column indices, public in the plan), the batches, L' and the sums."""
    from vfltorch.kernels import Circle
    from vfltorch.kernels.trainer import BatchSampler

    fmap, cfg = view["fmap"], view["cfg"]
    X = view["X"]
    D = fmap.n_features
    features = torch.arange(D)
    W_A = fmap.omega.detach().cpu().to(torch.float64)
    W_P = fmap.sampler.omega(torch.as_tensor(passive_columns, dtype=torch.int64), features)
    words = torch.cat([fmap.phase_words[t].cpu() for t in range(fmap.n_blocks)])
    b = Circle(fmap.circle.bits).decode(words).to(torch.float64)
    sampler = BatchSampler(X.shape[0], cfg.batch_size, cfg.seed)
    steps = sorted(view["steps"], key=lambda s: s[0])
    batches = [sampler.next() for _ in range(len(view["lprime"]))]
    out = []
    for t, cols, sums, B in steps:
        if t >= len(view["lprime"]):
            continue
        g = torch.zeros(D, dtype=torch.float64)
        g[cols] = sums
        out.append({"rows": batches[t], "lprime": view["lprime"][t], "g": g, "cols": cols})
    # The monitor's openings (sealed: f of the current iterate on the held-out rows after the steps that end an
    # epoch, and after the last; trainer.step_marks), with how many steps had run
    from vfltorch.kernels.trainer import step_marks

    T = len(view["lprime"])
    points = [t for t in range(1, T + 1) if any(step_marks(t, T, sampler.per_epoch))]
    monitor = view.get("monitor_f", [])
    assert not monitor or len(monitor) == len(points), (len(monitor), points)
    candidates = []
    for rec in view.get("candidates", []):
        # each candidate's features as A knows them (public directions and phases), its batches over the selection
        # rows S (positions in S), and what it was opened
        cmap, ccfg = rec["fmap"], rec["cfg"]
        Dk = cmap.n_features
        rows_S, rows_H = view["selection_rows"]
        csampler = BatchSampler(len(rows_S), ccfg.batch_size, ccfg.seed)
        candidates.append({
            "W_A": cmap.omega.detach().cpu().to(torch.float64),
            "W_P": cmap.sampler.omega(torch.as_tensor(passive_columns, dtype=torch.int64),
                                      torch.arange(Dk)).to(torch.float64),
            "b": Circle(cmap.circle.bits).decode(torch.cat([cmap.phase_words[t].cpu()
                                                            for t in range(cmap.n_blocks)])).to(torch.float64),
            "S": rows_S, "H": rows_H, "batches": [csampler.next() for _ in range(len(rec["lprime"]))],
            "lprime": rec["lprime"], "f": rec["f"], "held_out_f": rec["held_out_f"], "gamma": ccfg.gamma,
            "batch_size": csampler.batch_size, "lam": ccfg.lam})
    return {"X_A": X.to(torch.float64), "W_A": W_A, "W_P": W_P.to(torch.float64), "b": b, "steps": out,
            "candidates": candidates,
            "per_epoch": sampler.per_epoch, "batches": batches, "lprime": view["lprime"], "f": view["f"],
            "alpha": view.get("alpha"), "gamma": cfg.gamma, "batch_size": sampler.batch_size, "y": view["y"],
            "lam": cfg.lam,
            "monitor": list(zip(points, monitor)), "X_A_mon": view.get("X_mon")}


# ------------------------------------------------------------------------------------------- the attack
# A start whose relative residual falls to the quantisation floor of the opened sums has found the columns (a wrong
# start stalls above it): the attacker recognises the right answer itself. Measured: the true columns leave 3e-5
# (breast cancer), 1e-4 (credit_default) and 2.2e-4 (pima); the wrong starts stalled at 1.2e-3 to 5e-3.
FLOOR = 5e-4


def _fit(Z, a, W, lprime, g, iters):
    """Bounded quasi-Newton (L-BFGS-B, Z in the min-max range [0, 1]) on sum_j (g_j - sum_i L'_i sqrt2 cos(a_ij +
    z_i . w_j))^2 / |g|^2, with its exact gradient. Returns (Z, relative residual)."""
    from scipy.optimize import minimize

    B, dP = a.shape[0], W.shape[0]
    scale = float(g @ g) + 1e-30

    def value_and_gradient(flat):
        theta = a + flat.reshape(B, dP) @ W
        r = SQRT2 * (lprime @ np.cos(theta)) - g
        grad = (-2 * SQRT2 / scale) * ((lprime[:, None] * np.sin(theta) * r) @ W.T)
        return float(r @ r) / scale, grad.ravel()

    out = minimize(value_and_gradient, Z.ravel(), jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * (B * dP),
                   options={"maxiter": iters, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-12})
    return out.x.reshape(B, dP), float(out.fun)


def solve_batch(a, W_P, lprime, g, *, starts=8, seed=0, iters=500, stages=(0.45, 0.7, 1.0), floor=FLOOR):
    """The passive columns of one batch (numpy arrays: a = x^A W^A + b on the batch rows, W^P, L', the sums g):
    from uniform random starts, fitted on the lowest-frequency features first (each stage still has more
    equations than the batch's B d_P unknowns), then on all; stops at the first start that reaches ``floor``
    (``FLOOR``: the opened sums' quantisation; unquantised sums leave the truth at 0).
    Returns (Z, relative residual, starts used)."""
    rng = np.random.default_rng(seed)
    order = np.argsort(np.linalg.norm(W_P, axis=0))
    best = (None, float("inf"))
    for used in range(1, starts + 1):
        Z = rng.uniform(0.0, 1.0, (a.shape[0], W_P.shape[0]))
        for share in stages:
            idx = order[: max(1, int(share * len(order)))]
            Z, res = _fit(Z, a[:, idx], W_P[:, idx], lprime, g[idx], iters)
        if res < best[1]:
            best = (Z, res)
        if res < floor:
            break
    return best[0], best[1], used


def attack_steps(pv: dict, steps, **kw):
    """``solve_batch`` on each of ``steps`` (indices into the view's steps): [(rows, Z, residual, starts)]."""
    base = (pv["X_A"] @ pv["W_A"] + pv["b"]).numpy()
    W_P = pv["W_P"].numpy()
    out = []
    for k in steps:
        s = pv["steps"][k]
        rows = s["rows"].numpy()
        Z, res, used = solve_batch(base[rows], W_P, s["lprime"].numpy(), s["g"].numpy(), seed=k, **kw)
        out.append((rows, Z, res, used))
    return out


def column_r2(est, truth):
    """Per column: the variance explained by the best affine map of the estimate (squared correlation)."""
    e, t = est - est.mean(0), truth - truth.mean(0)
    return (e * t).sum(0) ** 2 / ((e * e).sum(0) * (t * t).sum(0) + 1e-30)


def own_column_baseline(X_A, truth, extra=None):
    """In-sample R^2 of each passive column regressed on the attacker's own columns (and ``extra``, e.g. f): what
    it could infer without the protocol's openings (an upper bound: the fit sees the truth)."""
    F = torch.cat([X_A, torch.ones(X_A.shape[0], 1, dtype=X_A.dtype)] + ([extra] if extra is not None else []), 1)
    coef = torch.linalg.lstsq(F, truth).solution
    pred = F @ coef
    return 1 - ((truth - pred) ** 2).sum(0) / ((truth - truth.mean(0)) ** 2).sum(0)


# ------------------------------------------------------------------------------------- the pooled attack
def momentum_weights(lprime, batches, n, gamma, B, mu, lam=0.0):
    """The sealed protocol's coefficients as functions of the features (A knows its L' and the public step rule):
    returns (C_steps, C_final), T x n and n, with alpha_t = sum_i C_steps[t, i] phi(x_i) the coefficients f was
    computed with at step t, and the opened averaged alpha = sum_i C_final[i] phi(x_i).

    m_s = mu m_{s-1} + g_s + lambda B alpha_s, alpha_{s+1} = alpha_s - (gamma / B) m_s, g_u = sum_{i in I_u} L'_ui
    phi(x_i); so without the weight decay alpha_t = -(gamma / B) sum_{u < t} (1 - mu^(t - u)) / (1 - mu) g_u, averaged
    over t in [T / 2, T) after each step (with it, the same recursion on the coefficients: lambda is public).
    """
    T = len(lprime)
    G = torch.zeros(T, n, dtype=torch.float64)              # G[u]: step u's L' on its batch rows (g_u = G[u] Phi)
    for u in range(T):
        G[u].index_add_(0, batches[u], lprime[u])
    C = momentum_coefficients(G, gamma, B, mu, lam)        # C[t]: alpha before step t's update (C[T]: after all)
    t0 = T // 2
    final = C[t0 + 1:T + 1].mean(0)                         # the average of alpha after steps t0 .. T - 1
    return C[:T], final


def momentum_coefficients(G, gamma, B, mu, lam=0.0):
    """(T + 1) x n: row t the coefficients of alpha after t steps, as combinations of the rows' features (G: T x n,
    step u's L' on its batch rows; ``lam``: the weight decay lambda B alpha added to each step's sums)."""
    T = G.shape[0]
    if lam:
        C = torch.zeros(T + 1, G.shape[1], dtype=torch.float64)
        m = torch.zeros(G.shape[1], dtype=torch.float64)
        for s in range(T):
            m = mu * m + G[s] + lam * B * C[s]
            C[s + 1] = C[s] - gamma / B * m
        return C
    lag = torch.arange(T + 1, dtype=torch.float64)[:, None] - torch.arange(T, dtype=torch.float64)[None, :]
    weight = torch.where(lag > 0, -gamma / B * (1 - mu ** lag.clamp_min(0)) / (1 - mu), torch.zeros(()))
    return weight @ G


def pooled_equations(pv: dict, *, sealed: bool, mu=None):
    """Every number the active party was opened in the main training run, as equations in the passive columns:
    [(kind, rows or None, target, weights)] for ``pooled_attack``. Under ``shared``: each step's gradient sums (D per
    step) and f on its batch rows is what A computed itself from its own (clear) alpha, so only the sums count.
    Under ``sealed``: f on every step's batch rows (alpha_t a known combination of the features, above) and the
    opened averaged alpha."""
    n = pv["X_A"].shape[0]
    if not sealed:
        return {"grad": [(s["rows"], s["lprime"], s["g"]) for s in pv["steps"]]}
    C_steps, C_final = momentum_weights(pv["lprime"], pv["batches"], n, pv["gamma"], pv["batch_size"], mu,
                                        pv.get("lam", 0.0))
    f = [(pv["batches"][t], C_steps[t], pv["f"][t]) for t in range(len(pv["f"]))]
    out = {"f": f, "alpha": (C_final, pv["alpha"])}
    if pv.get("monitor"):
        # f on the monitor rows after t steps: phi(x_mon) . alpha_t, alpha_t = C[t] Phi (the training rows')
        G = torch.zeros(len(pv["lprime"]), n, dtype=torch.float64)
        for u, (rows, lp) in enumerate(zip(pv["batches"], pv["lprime"])):
            G[u].index_add_(0, rows, lp)
        C = momentum_coefficients(G, pv["gamma"], pv["batch_size"], mu, pv.get("lam", 0.0))
        out["monitor"] = [(C[t], f_mon) for t, f_mon in pv["monitor"]]
    # the width selection's candidates: f on each one's batch rows (positions in S) and, once, f of its averaged
    # model on the held-out rows H; their coefficients are never opened
    out["candidates"] = []
    for c in pv.get("candidates", []):
        C_steps, C_final = momentum_weights(c["lprime"], c["batches"], len(c["S"]), c["gamma"], c["batch_size"], mu,
                                            c.get("lam", 0.0))
        out["candidates"].append({"f": [(c["batches"][t], C_steps[t], c["f"][t]) for t in range(len(c["f"]))],
                                  "held_out": (C_final, c["held_out_f"]), "view": c})
    return out


def pooled_loss(pv: dict, equations: dict):
    """The attacker's objective: Z (n x d_P, torch; with monitor openings (n + m) x d_P, the monitor rows' after
    the training rows') -> the relative squared residual of each step's gradient sums (divided by their squared
    norm), plus that of all f values together, of the opened alpha and of all monitor f values together."""
    n = pv["X_A"].shape[0]
    X_A = pv["X_A"] if "monitor" not in equations else torch.cat([pv["X_A"], pv["X_A_mon"]])
    base = X_A @ pv["W_A"] + pv["b"]                        # rows x D, known to A
    W_P = pv["W_P"]

    def stacked(items):
        # every step's rows in one index (one gather, one scatter in the backward pass: per-step indexing costs a
        # dense n x D scatter per step), with the step each row belongs to
        rows = torch.cat([r for r, _, _ in items])
        owner = torch.repeat_interleave(torch.arange(len(items)), torch.as_tensor([len(r) for r, _, _ in items]))
        return rows, owner

    grads = equations.get("grad", [])
    if grads:
        g_rows, g_owner = stacked(grads)
        g_weight = torch.cat([lp for _, lp, _ in grads])
        g_target = torch.stack([g for _, _, g in grads])                     # T x D
    fs = equations.get("f", [])
    if fs:
        f_rows, f_owner = stacked(fs)
        f_C = torch.stack([c for _, c, _ in fs])                             # T x n
        f_target = torch.cat([f for _, _, f in fs])

    monitor = equations.get("monitor", [])
    if monitor:
        m_C = torch.stack([c for c, _ in monitor])                           # points x n
        m_target = torch.stack([f for _, f in monitor])                      # points x m

    candidates = []
    for c in equations.get("candidates", []):
        v = c["view"]
        c_rows, c_owner = stacked(c["f"])
        candidates.append((v["S"], v["H"], (pv["X_A"] @ v["W_A"] + v["b"]), v["W_P"], c_rows, c_owner,
                           torch.stack([C for _, C, _ in c["f"]]), torch.cat([f for _, _, f in c["f"]]),
                           *c["held_out"]))

    def loss(Z):
        phi_all = SQRT2 * torch.cos(base + Z @ W_P)
        phi = phi_all[:n]
        total = torch.zeros((), dtype=torch.float64)
        for S, H, base_k, W_k, rows_k, owner_k, C_k, target_k, C_final, held_f in candidates:
            phi_S = SQRT2 * torch.cos(base_k[S] + Z[S] @ W_k)
            alpha_t = C_k @ phi_S
            r = (phi_S[rows_k] * alpha_t[owner_k]).sum(1) - target_k
            total = total + (r @ r) / (target_k @ target_k + 1e-30)
            r = SQRT2 * torch.cos(base_k[H] + Z[H] @ W_k) @ (C_final @ phi_S) - held_f
            total = total + (r @ r) / (held_f @ held_f + 1e-30)
        if monitor:
            r = (m_C @ phi) @ phi_all[n:].T - m_target                         # points x m
            total = total + (r * r).sum() / ((m_target * m_target).sum() + 1e-30)
        if grads:
            pred = torch.zeros_like(g_target).index_add(0, g_owner, g_weight[:, None] * phi[g_rows])
            r = pred - g_target
            total = total + ((r * r).sum(1) / ((g_target * g_target).sum(1) + 1e-30)).sum()
        if fs:
            alpha_t = f_C @ phi                                                # T x D
            pred = (phi[f_rows] * alpha_t[f_owner]).sum(1)
            r = pred - f_target
            total = total + (r @ r) / (f_target @ f_target + 1e-30)
        if "alpha" in equations:
            C, alpha = equations["alpha"]
            r = C @ phi - alpha
            total = total + (r @ r) / (alpha @ alpha + 1e-30)
        return total

    return loss


def pooled_attack(pv: dict, equations: dict, *, starts=3, iters=400, seed=0, init=None):
    """The strongest joint solve written here: all passive values of all rows at once (bounded quasi-Newton,
    L-BFGS-B on [0, 1]^(n x d_P), the exact gradient by autograd) against every equation of ``pooled_equations``
    (``pooled_loss``); from ``starts`` uniform random starts (and ``init``, e.g. per-batch solutions, when given).
    Returns (Z, relative residual of the best start)."""
    from scipy.optimize import minimize

    loss = pooled_loss(pv, equations)
    n = pv["X_A"].shape[0] + (pv["X_A_mon"].shape[0] if "monitor" in equations else 0)
    dP = pv["W_P"].shape[0]

    def value_and_gradient(flat):
        Z = torch.from_numpy(flat).reshape(n, dP).requires_grad_(True)
        value = loss(Z)
        value.backward()
        return float(value), Z.grad.detach().numpy().ravel().copy()

    rng = np.random.default_rng(seed)
    inits = ([init] if init is not None else []) + [rng.uniform(0.0, 1.0, (n, dP)) for _ in range(starts)]
    best = (None, float("inf"))
    for Z0 in inits:
        out = minimize(value_and_gradient, np.asarray(Z0, dtype=np.float64).ravel(), jac=True, method="L-BFGS-B",
                       bounds=[(0.0, 1.0)] * (n * dP), options={"maxiter": iters, "maxcor": 30, "ftol": 1e-15,
                                                                 "gtol": 1e-12})
        if out.fun < best[1]:
            best = (out.x.reshape(n, dP), float(out.fun))
    return best
