"""FDSKL's compressed model (compress.py) against its teacher, and prediction's ring width, centralised.

Per dataset (``benchmarks.fdskl_accuracy``'s five: ``hard`` and the shared binary sets, and its two
regression sets), in this process:

* the teacher: ``FDSKLClassifier()`` / ``FDSKLRegressor()`` with every default but ``compress_to=None`` (D = 1536),
  centralised (Q = 1; the federated model is the same to the angle and product rounding, tested);
* students: the teacher distilled into D' of its features (``compress.compress_budget``, the code the
  estimator runs; with one party it is the same computation as federated, tested), per ``--variants``
  ``SUPPORT:D'[:EPOCHS[:ROWS]]`` (``public``: a seeded random subset of the D features, label-independent;
  ``alpha``: the D' largest |alpha_j|, the label-dependent support; ROWS: distil on that many training rows
  drawn from the public seed instead of all);
* each student's check: both models' f on the check rows of ``compress_to='if-faithful'`` (the default) and
  the decision ``compress.faithful`` takes from them, with the test score of the model the default keeps;
* prediction's ring: the shared protocol's product for f (``StarProducts`` in Z_2^bits) reproduced
  exactly (A's per-row scales and rounding, the keeper's rounded [cos beta, sin beta] for fresh uniform
  beta, the integer row sums; no message is needed to know what the two shares add up to) for each
  ``--bits``, against the float f on the same 16-bit phases: max and RMS error relative to max |f|,
  the fraction of rows whose sign flips, and the test accuracy.

    python -m benchmarks.fdskl_compress --output-dir results/fdskl_compress

writes ``fdskl_compress.json`` and ``fdskl_compress.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.fdskl_accuracy import DATASETS, REGRESSION, load

SVC = {"hard": 96.47, "a9a": 85.06, "phishing": 95.88, "credit_default": 81.56, "give_me_some_credit": 93.32}
LOGISTIC = {"hard": 89.94, "a9a": 84.95, "phishing": 94.28, "credit_default": 80.81, "give_me_some_credit": 93.31}


def ring_f(fmap, X: torch.Tensor, coef: torch.Tensor, feats: torch.Tensor, bits: int, seed: int,
           chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(f as the shared protocol opens it in Z_2^bits, the float f on the same phases) for the rows of X."""
    from vfltorch.comm.sharing import from_ring, rowdot_scales
    from vfltorch.kernels.shared import (REAL_PAIRS, REAL_PAIRS32, cos_sin, cosine_table, narrow_table,
                                         pair_table, y_frac_bits)

    table = pair_table(cosine_table().to(torch.int64))
    F = y_frac_bits(2 * len(feats), bits)
    ys = narrow_table(table, F).to(torch.int64)
    c = math.sqrt(2.0) * coef.to(torch.float32).cpu()
    gen = torch.Generator().manual_seed(seed)
    ring, exact = [], []
    for start in range(0, X.shape[0], chunk):
        theta = fmap.star_phases(X[start:start + chunk], feats).cpu()          # 16-bit angle words
        beta = torch.randint(-2 ** 15, 2 ** 15, theta.shape, generator=gen, dtype=torch.int32).to(theta.dtype)
        S = theta + beta                                                       # wraps mod 2**16, as on the wire
        x = cos_sin(REAL_PAIRS32, S) * c.repeat_interleave(2)
        s = rowdot_scales(x, bits, F)
        xe = (x * s.unsqueeze(-1).to(x.dtype)).round().to(torch.int64)
        v = (xe * cos_sin(ys, beta)).sum(-1)
        assert bool((from_ring(v, bits) == v).all()), "the row dot wrapped"       # rowdot_scales' guarantee
        ring.append(v.to(torch.float64) / (s * 2.0 ** F))
        exact.append(cos_sin(REAL_PAIRS, theta)[:, 0::2] @ (c.to(torch.float64)))
    return torch.cat(ring), torch.cat(exact)


def least_squares(fmap, X: torch.Tensor, teacher: torch.Tensor, feats: torch.Tensor, ridge: float = 1e-3,
                  chunk: int = 4096) -> torch.Tensor:
    """Coefficients on ``feats`` fitting the teacher's f on the rows of X by ridge least squares (centralised
    only: an upper bound for what the distillation's gradient steps can reach on these features)."""
    every = torch.arange(fmap.n_features)
    G = torch.zeros(len(feats), len(feats), dtype=torch.float64)
    b = torch.zeros(len(feats), dtype=torch.float64)
    for start in range(0, X.shape[0], chunk):
        phi = fmap.circle.decode(fmap.star_phases(X[start:start + chunk], every), torch.float64).cos_().mul_(
            math.sqrt(2.0))
        P = phi[:, feats]
        G += P.T @ P
        b += P.T @ (phi @ teacher.to(torch.float64))
    return torch.linalg.solve(G + ridge * X.shape[0] * torch.eye(len(feats), dtype=torch.float64), b)


def acc(f, y) -> float:
    return 100.0 * float(np.mean(np.where(np.asarray(f) >= 0, 1.0, -1.0) == np.asarray(y)))


def r2(f, y) -> float:
    f, y = np.asarray(f, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(1.0 - np.mean((f - y) ** 2) / np.var(y))


def run(name: str, variants, bits_list, seed: int, least_squares_fit: bool = False) -> dict:
    from vfltorch.comm import Federation
    from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor
    from vfltorch.kernels.compress import compress_budget, compress_rows, faithful
    from vfltorch.kernels.random_features import derive_key

    torch.set_num_threads(1)
    regression = name in REGRESSION
    Xtr, ytr, Xte, yte = load(name)
    Xtr, Xte = torch.as_tensor(Xtr, dtype=torch.float32), torch.as_tensor(Xte, dtype=torch.float32)
    started = time.perf_counter()
    # The teacher: every default but compression (compress_to=None), then each student distilled from it.
    est = (FDSKLRegressor if regression else FDSKLClassifier)(random_state=seed, compress_to=None).fit(Xtr, ytr)
    fit_s = time.perf_counter() - started
    fmap, D = est.feature_map_, est.feature_map_.n_features
    teacher_f = torch.as_tensor(est.decision_function(Xte))
    score = r2 if regression else acc
    rec = {"dataset": name, "task": "regression" if regression else "binary", "train_rows": int(Xtr.shape[0]),
           "test_rows": int(Xte.shape[0]), "D": D, "sigma_multiplier": est.sigma_multiplier_,
           "teacher_accuracy": score(teacher_f, yte), "fit_seconds": fit_s,
           "svc": SVC.get(name), "logistic": LOGISTIC.get(name), "students": [], "rings": [],
           "load_average": os.getloadavg()}
    print(json.dumps({k: rec[k] for k in ("dataset", "teacher_accuracy", "fit_seconds", "sigma_multiplier")}),
          flush=True)
    cfg = est._config(est._loss(), Xtr.shape[0])
    # The targets as the model is trained on them (the regressor's normalised y; the classifier's -1 / +1).
    y_fit = (est._prepare_targets(torch.as_tensor(np.asarray(ytr), dtype=torch.float64)) if regression
             else torch.as_tensor(est._encode_targets(ytr, len(ytr)), dtype=torch.float64))
    models = [("teacher", torch.arange(D), est.alpha_)]
    for spec in variants:
        parts = spec.split(":")
        rule, keep = parts[0], int(parts[1])
        epochs = float(parts[2]) if len(parts) > 2 else 1.0
        distil = int(parts[3]) if len(parts) > 3 else None
        check, rows = compress_rows(Xtr.shape[0], derive_key(seed, 0xC4EC), distil)
        started = time.perf_counter()
        support, alpha, refit = compress_budget(Federation.local(), fmap, Xtr if rows is None else Xtr[rows], cfg,
                                                est.alpha_, keep=keep, epochs=epochs, trained=est.n_iter_,
                                                support=rule, support_seed=derive_key(seed, 0xC0DE5),
                                                n_total=Xtr.shape[0])
        refit_s = time.perf_counter() - started
        f = fmap.decision_values(Xte, alpha, support=support)
        f_out = est._untransform(f)
        decision = faithful(fmap.decision_values(Xtr[check], est.alpha_), fmap.decision_values(Xtr[check], alpha),
                            y_fit[check], est._loss(), rec["task"])
        s = {"variant": spec, "support": rule, "features": keep, "epochs": epochs, "distil_rows": distil,
             "accuracy": score(f_out, yte), "refit_iterations": refit.iterations, "refit_seconds": refit_s,
             "agree_with_teacher": float(np.mean(np.sign(np.asarray(f)) == np.sign(np.asarray(teacher_f)))),
             "check": decision}
        if least_squares_fit:
            coef = least_squares(fmap, Xtr, est.alpha_, support)
            full = torch.zeros(D, dtype=torch.float64)
            full[support] = coef
            s["least_squares_accuracy"] = acc(fmap.decision_values(Xte, full.to(est.alpha_.dtype), support=support),
                                              yte)
        rec["students"].append(s)
        print(json.dumps({"dataset": name, **s}), flush=True)
        models.append((spec, support, alpha[support]))
    for label, feats, coef in models:
        for bits in bits_list:
            ring, exact = ring_f(fmap, Xte, coef, feats, bits, seed=derive_key(seed, bits))
            scale = float(exact.abs().max())
            err = (ring - exact).abs()
            r = {"model": label, "bits": bits, "max_error_rel": float(err.max()) / scale,
                 "rms_error_rel": float(err.pow(2).mean().sqrt()) / scale,
                 "sign_flips": float(np.mean(np.sign(ring.numpy()) != np.sign(exact.numpy()))),
                 "accuracy": acc(ring, yte), "float_accuracy": acc(exact, yte)}
            rec["rings"].append(r)
            print(json.dumps({"dataset": name, **r}), flush=True)
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="*", default=DATASETS + REGRESSION)
    p.add_argument("--variants", nargs="*", default=["public:496", "public:496:1:8000", "alpha:496"],
                   help="SUPPORT:D'[:EPOCHS[:ROWS]] students of the default teacher (ROWS: distil on that many "
                        "training rows drawn from the public seed, compress.compress_rows)")
    p.add_argument("--bits", type=int, nargs="*", default=[32, 24, 20])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--least-squares", action="store_true",
                   help="also fit each student's features to the teacher's f by ridge least squares (a bound)")
    p.add_argument("--output-dir", type=Path, default=Path("results/fdskl_compress"))
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    recs = []
    for name in args.datasets:
        recs.append(run(name, args.variants, args.bits, args.seed, args.least_squares))
        (args.output_dir / "fdskl_compress.json").write_text(json.dumps(recs, indent=2))
    lines = ["| dataset | teacher (D = 1536) | " + " | ".join(s["variant"] for s in recs[0]["students"])
             + " | SVC - 0.5 | logistic |", "|---" * (4 + len(recs[0]["students"])) + "|"]
    for r in recs:
        lines.append(f"| {r['dataset']} | {r['teacher_accuracy']:.4g} | "
                     + " | ".join(f"{s['accuracy']:.4g}" + (f" (LS {s['least_squares_accuracy']:.2f})"
                                                             if "least_squares_accuracy" in s else "")
                                  + f" ({s['refit_seconds']:.1f} s)"
                                  for s in r["students"])
                     + (f" | {r['svc'] - 0.5:.2f} | {r['logistic']:.2f} |" if r["svc"] else " | | |"))
    lines += ["", "Check rows (training rows from the public seed): teacher vs student, the decision "
              "(compress.faithful)", "", "| dataset | variant | accuracy or MSE | loss | keep (the default's test score) |", "|---|---|---|---|---|"]
    for r in recs:
        for s in r["students"]:
            c = s["check"]
            key = "accuracy" if r["task"] == "binary" else "mse"
            lines.append(f"| {r['dataset']} | {s['variant']} | {c['teacher_' + key]:.4f} -> {c['student_' + key]:.4f} "
                         f"| {c['teacher_loss']:.5f} -> {c['student_loss']:.5f} "
                         f"({100 * (c['student_loss'] / c['teacher_loss'] - 1):+.2f}%) | {c['keep']} "
                         f"(test: {s['accuracy'] if c['keep'] else r['teacher_accuracy']:.4g}) |")
    lines += ["", "| dataset | model | bits | max err / max|f| | rms err / max|f| | sign flips | accuracy (float) |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        for g in r["rings"]:
            lines.append(f"| {r['dataset']} | {g['model']} | {g['bits']} | {g['max_error_rel']:.2e} | "
                         f"{g['rms_error_rel']:.2e} | {100 * g['sign_flips']:.3f}% | {g['accuracy']:.2f} "
                         f"({g['float_accuracy']:.2f}) |")
    (args.output_dir / "fdskl_compress.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
