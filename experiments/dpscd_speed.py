"""DP-SCD's epoch time against opacus DP-SGD's, on the same data and batch size, in the same process.

For each dataset and batch size L: DP-SCD (Algorithm 1, one party) and DP-SGD
(opacus PrivacyEngine, Poisson sampling, per-example clipping) train for a few
epochs at epsilon = 1; we time the training loops only (not the noise
calibration or data loading), alternate the two ``--repeats`` times and report
the median seconds per epoch and the ratio DP-SGD / DP-SCD (> 1: DP-SCD is
faster). The vertical DP-SCD over 3 gloo processes on this machine is timed
too, for the cost of the messages. The machine is shared: compare ratios, not
absolute times.

    python -m experiments.dpscd_speed --output-dir results/dpscd
    python -m experiments.dpscd_speed --quick

writes ``speed.json`` and ``speed.csv``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.privacy import DPSCD, DPSCDConfig, DPSGD, fit_glm

from .dpscd_common import TASKS, load_split
from .outputs import machine_note, write_csv, write_json


def _vertical_job(fed, dataset, task, L, epochs, lam):
    cfg = DPSCDConfig(task=task, variant="dual", epsilon=1.0, L=L, C=0.01, lam=lam, epochs=epochs)
    if fed.is_coordinator:                 # the default vertical protocol's dealer: no data, no clock of its own
        fit_glm(fed, None, None, cfg)
        return 0.0
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="maxabs", normalize_rows=True, seed=0))
    res = fit_glm(fed, data.X_train, data.y_train, cfg, monitor_every=0)
    return res.train_seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["logistic", "svm"], choices=list(TASKS))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[100, 1000])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parties", type=int, default=3, help="parties of the vertical run (0: skip it)")
    p.add_argument("--quick", action="store_true", help="logistic only, one batch size, 1 epoch")
    p.add_argument("--output-dir", default="results/dpscd")
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.batch_sizes, args.epochs, args.repeats = ["logistic"], [100], 1, 2
    out = Path(args.output_dir)
    rows = []
    for task in args.tasks:
        split = load_split(task)
        X = np.concatenate([split.X_fit, split.X_val])
        y = np.concatenate([split.y_fit, split.y_val])
        for L in args.batch_sizes:
            scd, sgd = [], []
            for r in range(args.repeats):
                m = DPSCD(task=task, epsilon=1.0, L=L, C=0.01, lam=split.lam, epochs=args.epochs,
                          monitor_every=0).fit(X, y)
                scd.append(m.train_seconds_ / args.epochs)
                g = DPSGD(task=task, epsilon=1.0, batch_size=L, C=1.0, lr=1.0, lam=split.lam, epochs=args.epochs,
                          monitor_every=0).fit(X, y)
                sgd.append(g.train_seconds_ / args.epochs)
            row = {"task": task, "dataset": TASKS[task]["dataset"], "rows": len(y), "features": X.shape[1],
                   "batch_size": L, "dpscd_epoch_s": float(np.median(scd)), "dpsgd_epoch_s": float(np.median(sgd)),
                   "ratio_dpsgd_over_dpscd": float(np.median(sgd) / np.median(scd)),
                   "dpscd_runs": scd, "dpsgd_runs": sgd}
            if args.parties > 1:
                started = time.perf_counter()
                secs = launch(_vertical_job, args.parties, coordinator=True,      # (the dealer of the default)
                              args=(TASKS[task]["dataset"], task, L, args.epochs, split.lam))
                row[f"vertical_dpscd_epoch_s_{args.parties}_parties"] = float(max(secs) / args.epochs)
                row["vertical_wall_s_incl_startup"] = time.perf_counter() - started
            rows.append(row)
            print(f"[{task}] L={L}: DP-SCD {row['dpscd_epoch_s']:.3f} s/epoch, DP-SGD {row['dpsgd_epoch_s']:.3f} "
                  f"s/epoch, ratio {row['ratio_dpsgd_over_dpscd']:.1f}"
                  + (f", vertical ({args.parties} parties) {row[f'vertical_dpscd_epoch_s_{args.parties}_parties']:.3f}"
                     f" s/epoch" if args.parties > 1 else ""), flush=True)
    record = {"experiment": "DP-SCD vs DP-SGD (opacus) epoch time", "machine": machine_note(),
              "epochs": args.epochs, "repeats": args.repeats, "rows": rows}
    write_json(out / "speed.json", record)
    write_csv(out / "speed.csv", [{k: v for k, v in r.items() if not k.endswith("_runs")} for r in rows])
    print(f"wrote {out / 'speed.json'} and speed.csv")


if __name__ == "__main__":
    main()
