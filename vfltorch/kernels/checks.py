"""Input validation for FDSKL: hyperparameters, each party's columns, the labels; one verdict for all.

Each party checks what it holds (its columns, and at the active party the
labels) and reports only problems, its row and column counts and a
fingerprint of its hyperparameters to the active party, which sends the
verdict back. Every party then raises the same ``VFLInputError``, so a bad
input at one party stops the whole federation with one clear message instead
of leaving the others waiting for messages that never come.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import numpy as np
import torch

from ..comm import Federation
from ..data.validation import VFLInputError

# The largest bounded model (random features D) the options may ask for: 2^20 coefficients and 8 MiB of directions
# per owned column, far beyond what a kernel approximation of any dataset here needs (issue 36: 10^9 was accepted
# and ran for minutes on 3.6 GB before its first step).
MAX_COMPONENTS = 1 << 20

# Columns beyond this magnitude are "not normalised": one shared kernel width cannot suit them and [0, 1] columns.
SCALE_LIMIT = 10.0


class ScalingWarning(UserWarning):
    """A party's columns look unscaled: the kernel will be dominated by them."""


def check_hyperparameters(est) -> None:
    """The estimator's hyperparameters, with a message that says what to choose instead."""
    from .losses import LOSSES
    from .random_features import KERNELS

    bits = getattr(est, "product_bits", 20)
    if bits not in (20, 32) or isinstance(bits, bool):
        raise VFLInputError(f"product_bits must be 20 (f in Z_2^20 and the gradient sums in Z_2^16: fewer bytes, "
                            f"reproducible to about 3% of alpha) or 32 (both in Z_2^32: about 0.1%), got {bits!r}")
    f_delay = getattr(est, "f_delay", "auto")
    if not ((isinstance(f_delay, str) and f_delay == "auto")
            or (isinstance(f_delay, (int, np.integer)) and not isinstance(f_delay, bool) and f_delay in (0, 1))):
        raise VFLInputError(f"f_delay must be 'auto' (estimator.SHARED_F_DELAY under the shared protocol's bounded model, now 0), 0 (f from "
                            f"the coefficients after the last step: the paper's algorithm) or 1 (before it: the "
                            f"shared iteration is pipelined, one message each way at Q = 2); got {f_delay!r}")
    if f_delay == 1 and getattr(est, "n_components", 1) is None:
        raise VFLInputError("f_delay=1 applies to the bounded model; the growing model (n_components=None) has "
                            "f_delay 0")
    n_components = getattr(est, "n_components", None)
    if n_components is not None and not (isinstance(n_components, (int, np.integer))
                                         and not isinstance(n_components, bool) and n_components >= 1):
        raise VFLInputError(f"n_components (the number D of random features of the bounded model) must be a "
                            f"positive integer, or None for the paper's model that grows by r features per "
                            f"iteration; got {n_components!r}")
    if n_components is not None and n_components > MAX_COMPONENTS:
        raise VFLInputError(f"n_components {n_components} is beyond the {MAX_COMPONENTS} random features a bounded "
                            f"model may have: each party would hold D coefficients and d_P x D directions "
                            f"({8 * n_components / 2 ** 30:.3g} GiB per column it owns) and every step would work "
                            f"on all of them; the default 1536 serves 10^4-10^5 rows, give at most {MAX_COMPONENTS}")
    compress_to = getattr(est, "compress_to", None)
    if not (compress_to is None or (isinstance(compress_to, str) and _compress_word(compress_to))
            or (isinstance(compress_to, (int, np.integer)) and not isinstance(compress_to, bool) and compress_to >= 1)):
        raise VFLInputError(f"compress_to (the random features D' kept for prediction) must be 'if-faithful' (the "
                            f"default: 'auto''s D', kept only if as good as the full model on check rows; "
                            f"'if-faithful:N': N features, checked), 'auto' "
                            f"(544, 496 or 432 at predict_bits 20, 24 or 32, from 2 D training rows on), a positive "
                            f"integer or None (predict with all D); got {compress_to!r}")
    if getattr(est, "compress_support", "public") not in ("public", "alpha"):
        raise VFLInputError(f"compress_support must be 'public' (the kept features drawn from the public seed: "
                            f"label-independent, the default) or 'alpha' (the largest |alpha_j|: every party learns "
                            f"which); got {est.compress_support!r}")
    predict_bits = getattr(est, "predict_bits", 24)
    if predict_bits not in (20, 24, 32) or isinstance(predict_bits, bool):
        raise VFLInputError(f"predict_bits (the shared protocol's ring for f at prediction) must be 20, 24 or 32; "
                            f"got {predict_bits!r}")
    compress_epochs = getattr(est, "compress_epochs", 1.0)
    if not (isinstance(compress_epochs, (int, float, np.integer, np.floating)) and not isinstance(compress_epochs, bool)
            and 0 <= compress_epochs < math.inf):
        raise VFLInputError(f"compress_epochs must be a number >= 0; got {compress_epochs!r}")
    solver = getattr(est, "solver", "adam")
    if solver not in ("adam", "dsg"):
        raise VFLInputError(f"solver must be 'adam' (the default: Adam steps on all D coefficients, averaged "
                            f"iterates) or 'dsg' (the paper's constant-step doubly stochastic step on one block of "
                            f"r features); got {solver!r}")
    if est.kernel not in KERNELS:
        raise VFLInputError(f"kernel={est.kernel!r} is not supported: choose one of {', '.join(KERNELS)}")
    if not (isinstance(est.sigma, str) and est.sigma == "median"):
        try:
            sigma = float(est.sigma)
        except (TypeError, ValueError):
            raise VFLInputError(f"sigma must be a positive number or 'median', got {est.sigma!r}") from None
        if not (math.isfinite(sigma) and sigma > 0):
            raise VFLInputError(f"sigma must be > 0 (the kernel width), got {est.sigma!r}; pass a positive "
                                f"value or 'median' for the median heuristic")
    grid = getattr(est, "sigma_grid", (1.0,))
    try:
        values = [float(c) for c in grid]
    except (TypeError, ValueError):
        values = []
    if not values or not all(math.isfinite(c) and c > 0 for c in values):
        raise VFLInputError(f"sigma_grid (multipliers of the median width tried on a held-out split) must be a "
                            f"non-empty sequence of positive numbers, e.g. (1.0, 2.0), or (1.0,) for the median "
                            f"width alone; got {grid!r}")
    if est.loss is not None and est.loss not in LOSSES:
        raise VFLInputError(f"loss={est.loss!r} is not supported: choose one of {', '.join(LOSSES)}")
    try:
        est._loss()
    except ValueError as exc:
        raise VFLInputError(str(exc)) from None
    if not isinstance(est.random_state, (int, np.integer)) or isinstance(est.random_state, bool):
        raise VFLInputError(f"random_state must be an integer (the public seed), got {est.random_state!r}")
    auto_lam = isinstance(est.lam, str) and est.lam == "auto"
    number = isinstance(est.lam, (int, float, np.floating, np.integer)) and not isinstance(est.lam, bool)
    if not auto_lam and not (number and est.lam >= 0 and math.isfinite(est.lam)):
        raise VFLInputError(f"lam (the regularisation lambda) must be >= 0, got {est.lam!r} (or 'auto', the default: "
                            f"D / (30 n) under 5,000 training rows, else 1e-5)")
    if est.gamma is not None and not (est.gamma > 0 and math.isfinite(est.gamma)):
        raise VFLInputError(f"gamma (the step size) must be > 0, got {est.gamma!r}")
    gamma = est._step_size()
    if not auto_lam and gamma * est.lam >= 1:       # ('auto' stays below it by construction: small_data.py)
        raise VFLInputError(f"gamma * lambda = {gamma:g} * {est.lam:g} = {gamma * est.lam:g} must be < 1: every "
                            f"iteration shrinks the old coefficients by (1 - gamma * lambda), which must stay in "
                            f"(0, 1). Lower the step size (gamma < {1 / est.lam if est.lam else float('inf'):g}) "
                            f"or lambda.")
    for name in ("batch_size", "features_per_step", "prefetch"):
        value = getattr(est, name)
        if name == "batch_size" and value is None:
            continue
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise VFLInputError(f"{name} must be a positive integer, got {value!r}")
    if est.epochs is None and est.max_time is None:
        raise VFLInputError("give a number of epochs, a time budget (max_time seconds), or both")
    numeric = isinstance(est.epochs, (int, float, np.floating, np.integer)) and not isinstance(est.epochs, bool)
    if est.epochs is not None and not (est.epochs == "auto" or (numeric and est.epochs > 0)):
        raise VFLInputError(f"epochs must be > 0, got {est.epochs!r} (or 'auto', the default: 16 under 5,000 "
                            f"training rows, else 4)")
    if numeric and not math.isfinite(est.epochs):
        raise VFLInputError(f"epochs must be a finite number, got {est.epochs!r} (for a run bounded by time only, "
                            f"give the time budget and no epochs)")
    if est.max_time is not None and not est.max_time > 0:
        raise VFLInputError(f"max_time (the time budget in seconds) must be > 0, got {est.max_time!r}")
    if est.max_time is not None and not math.isfinite(est.max_time):
        raise VFLInputError(f"max_time (the time budget in seconds) must be a finite number, got {est.max_time!r}")
    if est.schedule not in ("cached", "paper"):
        raise VFLInputError(f"schedule must be 'cached' or 'paper', got {est.schedule!r}")
    if est.angle_bits not in (16, 32, 64):
        raise VFLInputError(f"angle_bits must be 16, 32 or 64, got {est.angle_bits!r}")
    if est.protocol not in ("shared", "sealed", "paper"):
        raise VFLInputError(f"protocol must be 'sealed' (the default: the active party learns f on its batch rows "
                            f"and, once, the trained coefficients), 'shared' (it learns f on its batch rows and "
                            f"gradient sums, which give it passive columns: issue 35) or 'paper' (Gu et al.'s "
                            f"masked phases, which leak the passive columns), got {est.protocol!r}")
    if not (est.mask_seed in ("random", "seed") or (isinstance(est.mask_seed, (int, np.integer))
                                                    and not isinstance(est.mask_seed, bool))):
        raise VFLInputError(f"mask_seed must be 'random' (private masks from the OS, the default), 'seed' "
                            f"(derived from random_state: a reproducible simulation) or an integer, "
                            f"got {est.mask_seed!r}")


def check_shared(est) -> None:
    """Options the shared protocol (Q > 1) cannot run with."""
    if est.protocol == "shared" and est.schedule != "cached" and getattr(est, "n_components", None) is None:
        raise VFLInputError("protocol='shared' runs the cached schedule only (f kept as shares for every "
                            "training row); schedule='paper' needs protocol='paper'")
    if est.protocol == "sealed":
        if getattr(est, "n_components", None) is None:
            raise VFLInputError("protocol='sealed' (the default) trains the bounded model: pass n_components "
                                "(default 1536); the growing model (n_components=None) runs under protocol='shared' "
                                "or 'paper', which leak passive columns to the label holder (docs/fdskl.md)")
    if est.protocol in ("shared", "sealed") and est.angle_bits != 16:
        raise VFLInputError(f"protocol='shared' uses 16-bit angles (its dealt masks index a 2**16-entry cosine "
                            f"table), got angle_bits={est.angle_bits}; 32 and 64 are for protocol='paper'")


def fingerprint(params: dict) -> str:
    """A short hash of the hyperparameters that every party must share (mask seeds are per party)."""
    shared = {k: v for k, v in sorted(params.items()) if k not in ("fed", "mask_seed", "device", "verbose")}
    return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()[:16]


def scaling_problem(X: torch.Tensor, party: int, names=None) -> str | None:
    """A warning text if this party's columns are far outside the normalised range, else None."""
    if X.numel() == 0:
        return None
    peak = X.abs().amax(dim=0)
    bad = torch.nonzero(peak > SCALE_LIMIT).reshape(-1).tolist()
    if not bad:
        return None
    shown = ", ".join(str(names[c]) if names is not None else f"#{c}" for c in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return (f"party {party}: {len(bad)} column(s) ({shown}{more}) reach |x| = {float(peak.max()):.4g}, far outside "
            f"the normalised range FDSKL assumes: one kernel width is shared by all columns, so these would "
            f"dominate the kernel. Normalise each party's columns: `vfl fdskl --scale minmax` (or standard), or "
            f"vfltorch.data.scale_columns(X_train, X_test, 'minmax') before fit.")


def label_problem(y, task: str, n: int) -> str | None:
    if y is None:
        return "the active party must pass the training labels y to fit"
    y = torch.as_tensor(y)
    if y.dim() != 1 or y.shape[0] != n:
        return f"y must be a vector with one label per training row ({n}), got shape {tuple(y.shape)}"
    if not torch.isfinite(y.to(torch.float64)).all():
        return "the labels contain NaN or infinite values: drop those rows or fix the label column"
    if task == "binary":
        values = set(torch.unique(y.to(torch.float64)).tolist())
        if not values <= {-1.0, 1.0}:
            shown = sorted(values)[:6]
            return (f"FDSKL's classification losses need labels -1 and +1, got {shown}"
                    f"{'...' if len(values) > 6 else ''}. Map the negative class to -1 and the positive class to +1 "
                    f"(for 0/1 labels: y = 2 * y - 1); `vfl` does this on load (--positive-label for your own file).")
    return None


def agree(fed: Federation, *, rows: int, cols: int, params: dict, problems: list[str],
          columns: list[int] | None, dealer: int | None = None, monitor_rows: int | None = None,
          step: float | None = None) -> dict:
    """Every party reports; the active party checks and broadcasts the plan; all raise the same error.

    Returns ``{"n_features": ..., "columns": [this party's global column indices], "rows": n,
    "monitor_rows": m or None}``. A ``dealer`` (the shared protocol's) reports nothing and gets
    the plan too (row counts only: it holds no data).
    """
    report = {"rows": int(rows), "cols": int(cols), "params": fingerprint(params), "problems": problems,
              "columns": columns}
    ranks = fed.parties + ([dealer] if dealer is not None else [])
    with fed.phase("fdskl/setup"):
        reports = fed.gather_json(report, fed.active, ranks=fed.parties) if fed.rank in fed.parties else None
        plan = None
        if fed.is_active:
            plan = _verdict(fed, reports)
            plan["rows"] = int(rows)
            plan["monitor_rows"] = monitor_rows
            plan["step"] = step
        plan = fed.broadcast_json(plan, fed.active, ranks=ranks)
    if plan["error"]:
        raise VFLInputError(plan["error"])
    mine = plan["columns"][fed.parties.index(fed.rank)] if fed.rank in fed.parties else []
    active_cols = len(plan["columns"][fed.parties.index(fed.active)]) if plan["columns"] else 0
    return {"n_features": plan["n_features"], "columns": mine, "rows": plan["rows"], "active_cols": active_cols,
            "monitor_rows": plan["monitor_rows"], "step": plan["step"]}


def _verdict(fed: Federation, reports: list[dict]) -> dict:
    names = [fed.name(p) for p in fed.parties]
    errors = [f"{names[i]}: {p}" for i, r in enumerate(reports) for p in r["problems"]]
    for i, r in enumerate(reports):
        if r["cols"] == 0:
            errors.append(f"{names[i]} has no columns: every party needs at least one feature column "
                          f"(choose fewer parties or give it columns)")
    rows = {r["rows"] for r in reports}
    if len(rows) > 1:
        listing = ", ".join(f"{names[i]}: {r['rows']}" for i, r in enumerate(reports))
        errors.append(f"the parties hold different numbers of rows ({listing}): every party must pass the "
                      f"same rows, in the same order")
    if len({r["params"] for r in reports}) > 1:
        errors.append("the parties were given different hyperparameters: construct the estimator with the same "
                      "settings at every party (only mask_seed may differ)")
    given = [r["columns"] is not None for r in reports]
    columns = None
    if any(given) and not all(given):
        errors.append("columns= was passed at some parties but not at others: pass it everywhere or nowhere")
    elif all(given):
        columns = [list(map(int, r["columns"])) for r in reports]
        flat = [c for cs in columns for c in cs]
        if len(set(flat)) != len(flat) or any(c < 0 for c in flat):
            errors.append("the parties' global column indices (columns=) must be distinct, non-negative integers")
        for i, (cs, r) in enumerate(zip(columns, reports)):
            if len(cs) != r["cols"]:
                errors.append(f"{names[i]} passed {len(cs)} column indices for {r['cols']} columns")
    else:
        offsets = np.cumsum([0] + [r["cols"] for r in reports])
        columns = [list(range(int(offsets[i]), int(offsets[i + 1]))) for i in range(len(reports))]
    if errors:
        return {"error": "; ".join(errors), "n_features": 0, "columns": None}
    n_features = max((c for cs in columns for c in cs), default=-1) + 1
    return {"error": None, "n_features": int(n_features), "columns": columns}


def warn_scaling(text: str | None) -> None:
    if text:
        warnings.warn(text, ScalingWarning, stacklevel=3)


def _compress_word(text: str) -> bool:
    """'auto', 'if-faithful' or 'if-faithful:N' (N >= 1): compress_to's string values (compress.parse_compress_to)."""
    if text in ("auto", "if-faithful"):
        return True
    head, _, tail = text.partition(":")
    return head == "if-faithful" and tail.isdigit() and int(tail) >= 1
