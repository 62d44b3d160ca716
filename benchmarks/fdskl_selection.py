"""FDSKL's width selection and epoch curve, centralised (issue 16's fit-time round; docs/fdskl.md).

* default: the held-out scores of the width candidates (``selection.py``) per dataset, for each
  ``--select-epochs`` value (and ``--select-batch``, default the model's rule), with the multiplier chosen;
  the final model is not trained (``epochs=0.01``, no compression), so this times the selection alone;
* ``--curves``: the default model's test accuracy at the end of each epoch (the monitor is the test set,
  ``history_``; no compression), the data behind "stopping on a held-out curve";
* ``--per-width``: the default model (all defaults, compression included) trained at each multiplier of the
  default grid (sigma = the median width times it, no selection), its test accuracy, next to the selection's
  held-out scores and its picks by held-out accuracy (the default rule) and by held-out loss (issue 40; the
  sets of ``benchmarks/fdskl_unseen.py`` are accepted by name).

    python -m benchmarks.fdskl_selection --select-epochs 2 1.5 1
    python -m benchmarks.fdskl_selection --select-epochs 1.5 2 3 --select-batch 92
    python -m benchmarks.fdskl_selection --curves --datasets hard a9a phishing credit_default give_me_some_credit
    python -m benchmarks.fdskl_selection --per-width --datasets hard phishing credit_default a9a \
        clf-d10-bal-n10000-s8252 clf-d100-bal-n10000-s10830

Datasets as ``benchmarks/fdskl_accuracy.py`` (``hard`` is built there); ``cal_housing`` is the regression case.
One line of JSON per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

import numpy as np
import torch

from benchmarks.fdskl_accuracy import load

DATASETS = ["a9a", "hard", "phishing", "credit_default", "give_me_some_credit", "cal_housing"]
REGRESSION = {"cal_housing", "abalone"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="*", default=DATASETS)
    p.add_argument("--select-epochs", type=float, nargs="*", default=[1.5])
    p.add_argument("--select-batch", type=int, default=None, help="the candidates' batch (default: the model's rule)")
    p.add_argument("--curves", action="store_true", help="the default model's test accuracy at each epoch end")
    p.add_argument("--per-width", action="store_true",
                   help="test accuracy at each multiplier of the default grid, and the selection's picks")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor, selection

    data = {}
    if args.per_width:
        for name in args.datasets:
            if name not in REGRESSION:
                print(json.dumps(per_width(name)), flush=True)
        return 0
    if args.curves:
        for name in args.datasets:
            if name in REGRESSION:
                continue
            Xtr, ytr, Xte, yte = load(name)
            est = FDSKLClassifier(compress_to=None).fit(Xtr.astype(np.float32), ytr,
                                                        monitor=(Xte.astype(np.float32), yte))
            per = len(Xtr) / est._batch_size(len(Xtr))
            ends = {}
            for h in est.history_:          # the last point at or just past each epoch end
                e = h["iteration"] / per
                if abs(e - round(e)) * per < 1.5 and round(e) >= 1:
                    ends[int(round(e))] = round(100 * h["test_accuracy"], 2)
            print(json.dumps({"dataset": name, "iterations": est.n_iter_, "epoch_end_accuracy": ends,
                              "sigma_multiplier": est.sigma_multiplier_, "load": os.getloadavg()[0]}), flush=True)
        return 0
    selection.SELECT_BATCH = args.select_batch
    for epochs in args.select_epochs:
        selection.SELECT_EPOCHS = epochs
        for name in args.datasets:
            if name not in data:
                data[name] = load(name)
            Xtr, ytr, _, _ = data[name]
            cls = FDSKLRegressor if name in REGRESSION else FDSKLClassifier
            started = time.perf_counter()
            est = cls(epochs=0.01, compress_to=None).fit(Xtr.astype(np.float32), ytr)
            key = "mse" if name in REGRESSION else "accuracy"
            scores = est.sigma_scores_
            print(json.dumps({"dataset": name, "select_epochs": epochs, "select_batch": args.select_batch,
                              "multiplier": est.sigma_multiplier_,
                              key: [round(s[key], 4) for s in scores], "loss": [round(s["loss"], 4) for s in scores],
                              "selection_seconds": round(est.selection_seconds_, 2),
                              "fit_seconds": round(time.perf_counter() - started, 2),
                              "load": os.getloadavg()[0]}), flush=True)
    return 0


def per_width(name: str) -> dict:
    """``--per-width`` on one classification set (a registry name, ``hard`` or a ``fdskl_unseen`` set)."""
    from benchmarks.fdskl_unseen import family, synthetic
    from vfltorch.kernels import FDSKLClassifier
    from vfltorch.kernels.estimator import SIGMA_GRID

    Xtr, ytr, Xte, yte = synthetic(name) if name in family() else load(name)
    chosen = FDSKLClassifier().fit(Xtr, ytr)
    median = chosen.sigma_ / chosen.sigma_multiplier_
    test = [100 * float(np.mean(FDSKLClassifier(sigma=median * c, sigma_grid=(1.0,)).fit(Xtr, ytr).predict(Xte)
                                == yte)) for c in SIGMA_GRID]
    scores = chosen.sigma_scores_ or []
    by_loss = SIGMA_GRID[min(range(len(scores)), key=lambda i: scores[i]["loss"])] if scores else None
    return {"dataset": name, "grid": [round(c, 4) for c in SIGMA_GRID], "test_accuracy": [round(a, 2) for a in test],
            "held_out_accuracy": [round(100 * s["accuracy"], 2) for s in scores],
            "held_out_loss": [round(s["loss"], 4) for s in scores],
            "pick_by_accuracy": round(chosen.sigma_multiplier_, 4), "pick_by_loss": by_loss and round(by_loss, 4),
            "best": round(SIGMA_GRID[int(np.argmax(test))], 4), "load": os.getloadavg()[0]}


if __name__ == "__main__":
    raise SystemExit(main())
