"""FDSKL Figure 3: test error against training time, per dataset.

Curves: FDSKL with Q = 4 parties (four single-threaded processes) and the
centralised DSG (Q = 1, the same code with one party, one torch thread; see
``fdskl_common.run_fdskl``), each with its held-out error measured every few
iterations on the whole test set (monitoring time excluded from the
training clock). Points: scikit-learn SVC with an RBF kernel (the LIBSVM
oracle) and logistic regression (the linear model), at their total training
time. The same split, scaling and random seed for all.

    python -m experiments.fdskl_figure3 --output-dir results/fdskl           # all four datasets
    python -m experiments.fdskl_figure3 --datasets a9a --quick               # 2 epochs, SVC on 5000 rows

writes ``figure3.json``, ``figure3.csv`` (one row per curve point) and
``figure3.png`` to the output directory. Full settings: the defaults (5
epochs; SVC on all training rows except Give Me Some Credit, subsampled to
20,000 rows). On this 2-core machine the default run takes about 10-20
minutes, most of it SVC (about 150 s on a9a, longer on credit_default).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .fdskl_common import DATASETS, FDSKL_SETTINGS, run_fdskl, run_linear, run_svc
from .outputs import machine_note, pyplot, write_outputs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 epochs and SVC on at most 5000 rows")
    p.add_argument("--no-svc", action="store_true", help="skip SVC (the slowest baseline)")
    p.add_argument("--output-dir", default="results/fdskl")
    args = p.parse_args(argv)
    out = Path(args.output_dir)

    record = {"experiment": "FDSKL Figure 3: test error vs training time", "machine": machine_note(),
              "parties": args.parties, "quick": args.quick, "datasets": {}}
    rows = []
    for ds in args.datasets:
        settings = dict(FDSKL_SETTINGS[ds], **({"epochs": 2.0} if args.quick else {}))
        entry = {"settings": settings}
        for label, q in ((f"FDSKL (Q={args.parties})", args.parties), ("DSG (Q=1, centralised)", 1)):
            run = run_fdskl(ds, q, seed=args.seed, settings=settings, monitor=True)
            entry[label] = run
            for pt in run["history"]:
                rows.append({"dataset": ds, "method": label, "train_seconds": pt["train_seconds"],
                             "test_error": pt["test_error"], "iteration": pt["iteration"],
                             "features": pt["features"], "bytes": pt["bytes"]})
            print(f"{ds:>20} {label:<24} error {run['test_error']:.4f}  train {run['train_seconds']:.1f} s  "
                  f"{run['iterations']} iterations, {run['random_features']} features", flush=True)
        baselines = [run_linear(ds, args.seed)]
        if not args.no_svc:
            baselines.append(run_svc(ds, args.seed, max_rows=5000 if args.quick else None))
        for b in baselines:
            entry[b["method"]] = b
            rows.append({"dataset": ds, "method": b["method"], "train_seconds": b["train_seconds"],
                         "test_error": b["test_error"], "train_rows": b["train_rows"]})
            print(f"{ds:>20} {b['method']:<24} error {b['test_error']:.4f}  train {b['train_seconds']:.1f} s "
                  f"on {b['train_rows']} rows", flush=True)
        record["datasets"][ds] = entry
    write_outputs(out, "figure3", record, rows)
    plot(record, out / "figure3.png")
    print(f"wrote {out / 'figure3.json'}, figure3.csv, figure3.png")


def plot(record, path):
    plt = pyplot()
    names = list(record["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], names):
        entry = record["datasets"][ds]
        for label, style in ((k, "-") for k in entry if k.startswith(("FDSKL", "DSG"))):
            h = entry[label]["history"]
            ax.plot([p["train_seconds"] for p in h], [p["test_error"] for p in h], style, label=label)
        for label, marker in (("SVC (RBF, LIBSVM)", "*"), ("logistic regression (linear)", "s")):
            if label in entry:
                b = entry[label]
                note = f" ({b['train_rows']} rows)" if b.get("subsampled") else ""
                ax.plot([b["train_seconds"]], [b["test_error"]], marker, markersize=10, label=label + note)
        ax.set_xscale("log")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test error")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        lo = min(p["test_error"] for k in entry if k.startswith(("FDSKL", "DSG")) for p in entry[k]["history"])
        ax.set_ylim(lo - 0.01, lo + 0.08)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
