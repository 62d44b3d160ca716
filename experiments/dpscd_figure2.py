"""DP-SCD Figure 2: the primal objective against epochs, for epsilon in {0.1, 1}.

DP-SCD, seqDP-SCD and DP-SGD with the configurations Figure 1 chose on the
validation rows (read from ``--figure1``, default ``<output-dir>/figure1.json``;
tuned here the same way if that file is absent), and the non-private SCD and
SGD. Each private run is calibrated for its full number of epochs; the curve
shows its (noisy) model after each epoch, as the paper plots training. The
objective is P(theta) on the training rows; medians over ``--seeds`` runs.

    python -m experiments.dpscd_figure2 --output-dir results/dpscd          # after dpscd_figure1
    python -m experiments.dpscd_figure2 --quick

writes ``figure2.json``, ``figure2.csv`` and ``figure2.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .dpscd_common import PAPER_CLAIMS, TASKS, run_jobs, tune_and_evaluate
from .outputs import machine_note, pyplot, write_csv, write_json

METHODS = ("DP-SCD", "seqDP-SCD", "DP-SGD", "SCD", "SGD")
EPSILONS = (0.1, 1.0)


def chosen_configs(figure1: Path, task: str, method: str, epsilons, mode, workers, epochs) -> dict:
    if figure1.exists():
        results = json.loads(figure1.read_text())["results"].get(task, {}).get(method)
        if results:
            if method in ("SCD", "SGD"):
                return {None: results["nonprivate"]["config"]}
            if all(str(e) in results for e in epsilons):
                return {e: results[str(e)]["config"] for e in epsilons}
    tuned = tune_and_evaluate(task, method, epsilons, mode, seeds=1, workers=workers, epochs=epochs)
    return {(None if k == "nonprivate" else k): v["config"] for k, v in tuned.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, default=None, help="runs per curve (default 10; --quick 3)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ridge-epochs", type=float, default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--output-dir", default="results/dpscd")
    p.add_argument("--figure1", default=None, help="Figure 1's JSON with the chosen configurations")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    figure1 = Path(args.figure1) if args.figure1 else out / "figure1.json"
    seeds = args.seeds or (3 if args.quick else 10)
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    record = {"experiment": "DP-SCD Figure 2: objective vs epochs", "machine": machine_note(), "seeds": seeds,
              "epsilons": list(EPSILONS), "paper_claim": PAPER_CLAIMS["figure2"], "curves": {}}
    rows = []
    for task in args.tasks:
        epochs = args.ridge_epochs if task == "ridge" else None
        record["curves"][task] = {}
        for method in METHODS:
            configs = chosen_configs(figure1, task, method, EPSILONS, mode, args.workers, epochs)
            jobs = [dict(task=task, method=method, epsilon=e, config=c, seed=s, on="test", epochs=epochs,
                         monitor_every=1) for e, c in configs.items() for s in range(seeds)]
            for e, c in configs.items():
                runs = [r for r in run_jobs([j for j in jobs if j["epsilon"] == e], args.workers)]
                epochs_seen = [h["epoch"] for h in runs[0]["history"]]
                curve = np.nanmedian([[h["objective"] for h in r["history"]] for r in runs], axis=0)
                key = "nonprivate" if e is None else str(e)
                record["curves"][task].setdefault(method, {})[key] = {
                    "config": c, "epochs": epochs_seen, "median_objective": curve.tolist(),
                    "epsilon_by_epoch": [h["epsilon"] for h in runs[0]["history"]]}
                for k, v in zip(epochs_seen, curve):
                    rows.append({"task": task, "method": method, "epsilon": key, "epoch": k, "median_objective": v})
                print(f"[{task}] {method} eps={key}: final objective {curve[-1]:.4f} ({c})", flush=True)
        record["seconds"] = time.perf_counter() - started
        write_json(out / "figure2.json", record)
        write_csv(out / "figure2.csv", rows)
    plot(record, out / "figure2.png")
    print(f"wrote {out / 'figure2.json'}, figure2.csv, figure2.png in {record['seconds']:.0f} s")


def plot(record, path):
    plt = pyplot()
    tasks = list(record["curves"])
    fig, axes = plt.subplots(len(EPSILONS), len(tasks), figsize=(5 * len(tasks), 3.6 * len(EPSILONS)),
                             squeeze=False)
    for j, task in enumerate(tasks):
        for i, e in enumerate(EPSILONS):
            ax = axes[i][j]
            for method, curves in record["curves"][task].items():
                c = curves.get(str(e)) or curves.get("nonprivate")
                ax.plot(c["epochs"], c["median_objective"], marker=".", label=method,
                        linestyle="--" if method in ("SCD", "SGD") else "-")
            ax.set_yscale("log")
            ax.set_xlabel("epoch")
            ax.set_ylabel("primal objective (train)")
            ax.set_title(f"{task} on {TASKS[task]['dataset']}, epsilon = {e}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
