"""FDSKL's width selection and epoch curve, centralised (issue 16's fit-time round; docs/fdskl.md).

* default: the held-out scores of the width candidates (``selection.py``) per dataset, for each
  ``--select-epochs`` value (and ``--select-batch``, default the model's rule), with the multiplier chosen;
  the final model is not trained (``epochs=0.01``, no compression), so this times the selection alone;
* ``--curves``: the default model's test accuracy at the end of each epoch (the monitor is the test set,
  ``history_``; no compression), the data behind "stopping on a held-out curve".

    python -m benchmarks.fdskl_selection --select-epochs 2 1.5 1
    python -m benchmarks.fdskl_selection --select-epochs 1.5 2 3 --select-batch 92
    python -m benchmarks.fdskl_selection --curves --datasets hard a9a phishing credit_default give_me_some_credit

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
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor, selection

    data = {}
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


if __name__ == "__main__":
    raise SystemExit(main())
