"""DP-SCD Figure 1: the privacy-utility trade-off (epsilon in {0.1, 0.5, 1, 2}, delta = 1e-3).

For ridge regression (cal_housing), logistic regression (phishing) and the
L2-SVM (adult): DP-SCD, seqDP-SCD and DP-SGD (opacus), each tuned on the
validation rows at every epsilon, then the median test utility of ``--seeds``
runs; the non-private SCD and SGD as references. See ``dpscd_common`` for the
data, the preprocessing and the grids.

    python -m experiments.dpscd_figure1 --output-dir results/dpscd              # default: 10 seeds, full grids
    python -m experiments.dpscd_figure1 --quick                                 # 3 seeds, small grids, 2 epsilons
    python -m experiments.dpscd_figure1 --ridge-epochs 50 --workers 2           # ridge as the authors' README
    python -m experiments.dpscd_figure1 --tasks svm --merge                     # one task at a time, kept together

writes ``figure1.json`` (every validation run, the chosen configurations,
the number of configurations tried per method, the medians), ``figure1.csv``
and ``figure1.png``, and prints whether the paper's claims reproduce.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from .dpscd_common import EPSILONS, PAPER_CLAIMS, PRIVATE_METHODS, TASKS, better, metric_name, tune_and_evaluate
from .outputs import machine_note, pyplot, write_csv, write_json

METHOD_ORDER = ("DP-SCD", "seqDP-SCD", "DP-SGD", "SCD", "SGD")


def check_claims(task: str, results: dict, epsilons) -> list[str]:
    """The issue's targets, checked on the medians: DP-SCD >= DP-SGD (ridge, svm) and seqDP-SCD the worst."""
    notes = []
    for e in epsilons:
        u = {m: (results[m][e] if e in results[m] else results[m][str(e)])["median_utility"] for m in PRIVATE_METHODS}
        if task in ("ridge", "svm"):
            ok = not better(task, u["DP-SGD"], u["DP-SCD"])
            notes.append(f"{task} eps={e}: DP-SCD {u['DP-SCD']:.4f} vs DP-SGD {u['DP-SGD']:.4f} -> "
                         f"{'DP-SCD at least as good' if ok else 'DOES NOT REPRODUCE (DP-SGD better)'}")
        worst = all(not better(task, u["seqDP-SCD"], u[m]) for m in ("DP-SCD", "DP-SGD"))
        notes.append(f"{task} eps={e}: seqDP-SCD {u['seqDP-SCD']:.4f} -> "
                     f"{'the worst DP method' if worst else 'NOT the worst (does not reproduce)'}")
    return notes


def plot(record: dict, path: Path) -> None:
    plt = pyplot()
    tasks = list(record["results"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        res = record["results"][task]
        eps = record["epsilons"]
        for m in PRIVATE_METHODS:
            ax.plot(eps, [res[m][str(e)]["median_utility"] for e in eps], marker="o", label=m)
        for m, style in (("SCD", "--"), ("SGD", ":")):
            ax.axhline(res[m]["nonprivate"]["median_utility"], linestyle=style, color="gray", label=m)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon (delta = 1e-3)")
        ax.set_ylabel(metric_name(task))
        ax.set_title(f"{task} on {TASKS[task]['dataset']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--epsilons", nargs="+", type=float, default=None)
    p.add_argument("--seeds", type=int, default=None, help="test runs per chosen configuration (default 10)")
    p.add_argument("--quick", action="store_true", help="small grids, 3 seeds, epsilon in {0.1, 1}")
    p.add_argument("--ridge-epochs", type=float, default=None, help="epochs for ridge (default 10; README: 50)")
    p.add_argument("--workers", type=int, default=2, help="parallel runs (processes)")
    p.add_argument("--output-dir", default="results/dpscd")
    p.add_argument("--merge", action="store_true",
                   help="keep the other tasks' results already in <output-dir>/figure1.json (same epsilons and "
                        "mode): run the tasks one at a time")
    args = p.parse_args(argv)
    mode = "quick" if args.quick else "full"
    epsilons = args.epsilons or ([0.1, 1.0] if args.quick else list(EPSILONS))
    seeds = args.seeds or (3 if args.quick else 10)
    out = Path(args.output_dir)
    started = time.perf_counter()
    record = {"experiment": "DP-SCD Figure 1: privacy-utility trade-off", "machine": machine_note(),
              "mode": mode, "epsilons": epsilons, "delta": 1e-3, "seeds": seeds, "paper_claim": PAPER_CLAIMS["figure1"],
              "settings": {t: {**TASKS[t], **({"epochs": args.ridge_epochs} if t == "ridge" and args.ridge_epochs
                                               else {})} for t in args.tasks},
              "results": {}, "claims": []}
    rows = []
    previous = out / "figure1.json"
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        if old["epsilons"] != epsilons or old["mode"] != mode or old["seeds"] != seeds:
            raise SystemExit(f"--merge: {previous} was run with other settings "
                             f"({old['mode']}, epsilons {old['epsilons']}, {old['seeds']} seeds)")
        for task, res in old["results"].items():
            if task in args.tasks:
                continue
            record["results"][task] = res
            record["settings"][task] = old["settings"][task]
            record["claims"] += check_claims(task, res, epsilons)
            if (out / "figure1.csv").exists():
                with (out / "figure1.csv").open() as f:
                    rows += [r for r in csv.DictReader(f) if r["task"] == task]
    for task in args.tasks:
        epochs = args.ridge_epochs if task == "ridge" else None
        results = {}
        for method in METHOD_ORDER:
            t0 = time.perf_counter()
            results[method] = tune_and_evaluate(task, method, epsilons, mode, seeds, args.workers, epochs=epochs)
            print(f"[{task}] {method}: " + ", ".join(
                f"{k}: {v['median_utility']:.4f} ({v['config']})" for k, v in results[method].items())
                + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)
            for k, v in results[method].items():
                rows.append({"task": task, "dataset": TASKS[task]["dataset"], "method": method, "epsilon": k,
                             "metric": metric_name(task), "median": v["median_utility"],
                             "median_train_objective": v["median_objective"], "config": v["config"],
                             "configurations_tried": v["configurations_tried"], "seeds": seeds,
                             "epsilon_spent_max": v["epsilon_spent"]})
        for m in results:
            for v in results[m].values():
                v.pop("histories", None)
        record["results"][task] = {m: {str(k): v for k, v in r.items()} for m, r in results.items()}
        record["claims"] += check_claims(task, results, epsilons)
        record["seconds"] = time.perf_counter() - started
        write_json(out / "figure1.json", record)
        write_csv(out / "figure1.csv", rows)
    plot(record, out / "figure1.png")
    print("\n".join(record["claims"]))
    print(f"wrote {out / 'figure1.json'}, figure1.csv, figure1.png in {record['seconds']:.0f} s")


if __name__ == "__main__":
    main()
