"""FDSKL Figure 5: training time against training-set size.

For each dataset and each fraction of its training rows (a seeded
subsample; the test set is unchanged): FDSKL with Q = 4 parties, the
centralised DSG (Q = 1, one torch thread) and scikit-learn SVC. FDSKL's default batch is
n / 32, so an epoch is always about 32 iterations of O(n r) work: its time
grows linearly in n, SVC's (LIBSVM) roughly quadratically.

    python -m experiments.fdskl_figure5 --output-dir results/fdskl
    python -m experiments.fdskl_figure5 --datasets credit_default --fractions 0.1 0.5 1 --quick

writes ``figure5.json``, ``figure5.csv`` and ``figure5.png``. Defaults: a9a
and credit_default, fractions 0.1 0.2 0.4 0.6 0.8 1.0, 5 epochs (about 10
minutes here, most of it SVC on a9a). ``--quick``: 2 epochs, fractions
0.1 0.3 1.0, SVC on at most 10,000 rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .fdskl_common import DATASETS, FDSKL_SETTINGS, centralised_split, run_fdskl, run_svc
from .outputs import machine_note, pyplot, write_outputs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["a9a", "credit_default"], choices=DATASETS)
    p.add_argument("--fractions", nargs="+", type=float, default=None)
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-svc", action="store_true")
    p.add_argument("--output-dir", default="results/fdskl")
    args = p.parse_args(argv)
    fractions = args.fractions or ([0.1, 0.3, 1.0] if args.quick else [0.1, 0.2, 0.4, 0.6, 0.8, 1.0])
    out = Path(args.output_dir)
    record = {"experiment": "FDSKL Figure 5: training time vs training-set size", "machine": machine_note(),
              "parties": args.parties, "fractions": fractions, "datasets": {}}
    rows = []
    for ds in args.datasets:
        settings = dict(FDSKL_SETTINGS[ds], **({"epochs": 2.0} if args.quick else {}))
        full = len(centralised_split(ds, args.seed)[1])
        points = []
        for frac in fractions:
            n = max(64, int(round(frac * full)))
            fed = run_fdskl(ds, args.parties, seed=args.seed, settings=settings, monitor=False, train_rows=n)
            cen = run_fdskl(ds, 1, seed=args.seed, settings=settings, monitor=False, train_rows=n)
            pt = {"dataset": ds, "fraction": frac, "train_rows": n,
                  "fdskl_seconds": fed["train_seconds"], "fdskl_accuracy": fed["test_accuracy"],
                  "dsg_seconds": cen["train_seconds"], "dsg_accuracy": cen["test_accuracy"],
                  "fdskl_bytes_per_iteration": fed["comm"]["bytes_per_iteration"]}
            if not args.no_svc:
                svc = run_svc(ds, args.seed, max_rows=10_000 if args.quick else None, train_rows=n)
                pt.update(svc_seconds=svc["train_seconds"], svc_accuracy=svc["test_accuracy"],
                          svc_rows=svc["train_rows"])
            points.append(pt)
            rows.append(pt)
            print(f"{ds:>20} n={n:>6}: FDSKL {pt['fdskl_seconds']:.1f} s, DSG {pt['dsg_seconds']:.1f} s"
                  + (f", SVC {pt['svc_seconds']:.1f} s" if "svc_seconds" in pt else ""), flush=True)
        record["datasets"][ds] = points
    write_outputs(out, "figure5", record, rows)
    plot(record, out / "figure5.png", args.parties)
    print(f"wrote {out / 'figure5.json'}, figure5.csv, figure5.png")


def plot(record, path, q):
    plt = pyplot()
    names = list(record["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], names):
        pts = record["datasets"][ds]
        n = [p["train_rows"] for p in pts]
        ax.plot(n, [p["fdskl_seconds"] for p in pts], "o-", label=f"FDSKL (Q={q})")
        ax.plot(n, [p["dsg_seconds"] for p in pts], "s--", label="DSG (Q=1)")
        if all("svc_seconds" in p for p in pts):
            ax.plot([p["svc_rows"] for p in pts], [p["svc_seconds"] for p in pts], "*-", label="SVC (LIBSVM)")
        ax.set_xlabel("training rows")
        ax.set_ylabel("training time (s)")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
