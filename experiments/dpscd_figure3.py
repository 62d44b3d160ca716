"""DP-SCD Figure 3: utility against the mini-batch size L, for several clipping bounds C.

DP-SCD at a fixed budget (default epsilon = 1, delta = 1e-3) on the three
tasks, L in {30, 100, 300, 1000, 3000} and C in {1e-3, 1e-2, 1e-1}; the
median test utility over ``--seeds`` runs per point (no tuning: this is the
sweep the tuning of Figure 1 chooses from).

    python -m experiments.dpscd_figure3 --output-dir results/dpscd
    python -m experiments.dpscd_figure3 --quick          # logistic only, 3 seeds

writes ``figure3.json``, ``figure3.csv`` and ``figure3.png``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from .dpscd_common import PAPER_CLAIMS, TASKS, metric_name, run_jobs
from .outputs import machine_note, pyplot, write_csv, write_json

LS = (30, 100, 300, 1000, 3000)
CS = (1e-3, 1e-2, 1e-1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=None, choices=list(TASKS))
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--seeds", type=int, default=None, help="runs per point (default 10; --quick 3)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ridge-epochs", type=float, default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--output-dir", default="results/dpscd")
    args = p.parse_args(argv)
    tasks = args.tasks or (["logistic"] if args.quick else list(TASKS))
    seeds = args.seeds or (3 if args.quick else 10)
    out = Path(args.output_dir)
    started = time.perf_counter()
    record = {"experiment": "DP-SCD Figure 3: utility vs L for several C", "machine": machine_note(),
              "epsilon": args.epsilon, "delta": 1e-3, "seeds": seeds, "L": list(LS), "C": list(CS),
              "paper_claim": PAPER_CLAIMS["figure3"], "points": {}}
    rows = []
    for task in tasks:
        epochs = args.ridge_epochs if task == "ridge" else None
        jobs = [dict(task=task, method="DP-SCD", epsilon=args.epsilon, config=dict(C=C, L=L), seed=s, on="test",
                     epochs=epochs) for C in CS for L in LS for s in range(seeds)]
        results = run_jobs(jobs, args.workers)
        record["points"][task] = {}
        for C in CS:
            med = []
            for L in LS:
                runs = [r for r in results if r["config"] == dict(C=C, L=L)]
                m = float(np.nanmedian([r["utility"] for r in runs]))
                med.append(m)
                rows.append({"task": task, "C": C, "L": L, "metric": metric_name(task), "median": m,
                             "median_train_objective": float(np.nanmedian([r["objective"] for r in runs])),
                             "sigma": runs[0]["sigma"]})
            record["points"][task][str(C)] = med
            print(f"[{task}] C={C:g}: " + "  ".join(f"L={L}: {m:.4f}" for L, m in zip(LS, med)), flush=True)
        record["seconds"] = time.perf_counter() - started
        write_json(out / "figure3.json", record)
        write_csv(out / "figure3.csv", rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for C, med in record["points"][task].items():
            ax.plot(LS, med, marker="o", label=f"C = {float(C):g}")
        ax.set_xscale("log")
        ax.set_xlabel("mini-batch size L")
        ax.set_ylabel(metric_name(task))
        ax.set_title(f"DP-SCD, {task} on {TASKS[task]['dataset']}, epsilon = {args.epsilon:g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "figure3.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'figure3.json'}, figure3.csv, figure3.png in {record['seconds']:.0f} s")


if __name__ == "__main__":
    main()
