"""Yang et al. Table 1: epochs, final training loss and test AUC of SGD and SQN, next to the paper's numbers.

Credit 1 = credit_default (30,000 x 23), Credit 2 = give_me_some_credit
(150,000 x 10); two data parties (guest with the first half of the columns
and the labels, one host) and a coordinator; 80/20 split; standardised
columns (Credit 2: median-imputed NaNs); batch sizes 1000 and 3000; L = 4,
S_H = S, M = 10; stop when the epoch loss (the row-weighted mean of the
mini-batch Taylor losses) changes by less than 1e-5.

The optimisation runs in ``--insecure-plaintext`` mode: the same protocol,
the same messages, masks and fixed-point values, without encryption, which
gives the same numbers as the encrypted protocol up to fixed-point rounding
(about 1e-12 here; ``tests/test_hetero_lr.py`` checks encrypted == plaintext
== centralised). The cost of encryption per epoch is measured separately by
``experiments.hetero_lr_speed``.

    python -m experiments.hetero_lr_table1 --output-dir results/hetero_lr              # 3 seeds, ~10 min
    python -m experiments.hetero_lr_table1 --quick                                      # Credit 1, seed 0

writes ``table1.json`` (every run with its learning curve), ``table1.csv``
(one row per run), ``table1.md`` (the table next to the paper's) and
``table1.png`` (training loss and test AUC against epochs) to the output
directory. The seed sets the split, the mini-batches and the Hessian
samples. Learning rates: ``HYPER`` in ``hetero_lr_common.py`` (Credit 1: the
estimator's defaults, SGD 0.15, SQN 0.3 with decay 1/(1 + e); Credit 2: SQN
0.1), chosen on the centralised twin (``docs/hetero_lr.md``). Each setting
runs in its own launch, so a run that diverges (``DivergenceError``) is
recorded as such and the others go on. ``--clip C`` winsorises every party's
standardised columns to [-C, C] (a variant; the paper's table is without).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from vfltorch.comm import FederationError

from .hetero_lr_common import BATCHES, DATASETS, HYPER, OPTIMIZERS, PAPER, run_table
from .outputs import machine_note, pyplot, write_json


def summarise(runs: list) -> list[dict]:
    rows = []
    for ds in DATASETS:
        for batch in BATCHES:
            for opt in OPTIMIZERS:
                every = [r for r in runs if r["dataset"] == ds and r["batch"] == batch and r["optimizer"] == opt]
                sel = [r for r in every if not r.get("diverged")]
                if not sel:
                    continue
                paper = PAPER[(ds, batch, opt)]
                rows.append({"dataset": ds, "name": DATASETS[ds], "batch": batch, "optimizer": opt,
                             "seeds": [r["seed"] for r in sel], "epochs": [r["epochs"] for r in sel],
                             "epochs_mean": float(np.mean([r["epochs"] for r in sel])),
                             "epochs_median": float(np.median([r["epochs"] for r in sel])),
                             "train_loss": float(np.mean([r["train_loss"] for r in sel])),
                             "test_auc": float(np.mean([r["test_auc"] for r in sel])),
                             "test_auc_std": float(np.std([r["test_auc"] for r in sel])),
                             "converged": sum(r["converged"] for r in sel),
                             "diverged_seeds": [r["seed"] for r in every if r.get("diverged")],
                             "paper_epochs": paper[0], "paper_loss": paper[1], "paper_auc": paper[2]})
    return rows


def markdown(rows: list[dict], runs: list) -> str:
    lines = ["| data | batch | method | epochs (per seed) | mean epochs | loss | test AUC | paper epochs / loss / AUC "
             "| AUC - paper |", "|---|---|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        div = f" (diverged: seeds {r['diverged_seeds']})" if r["diverged_seeds"] else ""
        lines.append(f"| {r['name']} | {r['batch']} | {r['optimizer'].upper()} | {r['epochs']}{div} | "
                     f"{r['epochs_mean']:.1f} | {r['train_loss']:.6f} | {r['test_auc']:.4f} | "
                     f"{r['paper_epochs']} / {r['paper_loss']:.6f} / {r['paper_auc']:.4f} | "
                     f"{r['test_auc'] - r['paper_auc']:+.4f} |")
    lines.append("")
    for ds in DATASETS:
        for batch in BATCHES:
            pairs = {}
            for r in runs:
                if r["dataset"] == ds and r["batch"] == batch and not r.get("diverged"):
                    pairs.setdefault(r["seed"], {})[r["optimizer"]] = r["epochs"]
            wins = [s for s, p in pairs.items() if len(p) == 2 and p["sqn"] < p["sgd"]]
            if pairs:
                lines.append(f"- {DATASETS[ds]}, batch {batch}: SQN needed fewer epochs than SGD for "
                             f"{len(wins)} of {len(pairs)} seeds")
    return "\n".join(lines) + "\n"


def plot(runs: list, path: Path) -> None:
    plt = pyplot()
    keys = [(ds, b) for ds in DATASETS for b in BATCHES if any(r["dataset"] == ds and r["batch"] == b for r in runs)]
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 6.5), squeeze=False)
    colors = {"sgd": "tab:blue", "sqn": "tab:red"}
    for j, (ds, b) in enumerate(keys):
        for r in runs:
            if r["dataset"] != ds or r["batch"] != b or r.get("diverged"):
                continue
            ep = [h["epoch"] for h in r["history"]]
            label = r["optimizer"].upper() if r["seed"] == min(x["seed"] for x in runs) else None
            axes[0, j].plot(ep, [h["loss"] for h in r["history"]], color=colors[r["optimizer"]], alpha=0.7,
                            label=label)
            axes[1, j].plot(ep, [h["test_auc"] for h in r["history"]], color=colors[r["optimizer"]], alpha=0.7)
        axes[0, j].set_title(f"{DATASETS[ds]}, batch {b}")
        axes[0, j].set_ylabel("training loss (epoch mean)")
        axes[1, j].set_ylabel("test AUC")
        axes[1, j].set_xlabel("epoch")
        axes[0, j].legend()
        lo = min(h["loss"] for r in runs if r["dataset"] == ds and not r.get("diverged") for h in r["history"])
        axes[0, j].set_ylim(lo - 0.002, lo + 0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--quick", action="store_true", help="Credit 1 and seed 0 only")
    p.add_argument("--max-epochs", type=int, default=100)
    p.add_argument("--clip", type=float, default=None,
                   help="winsorise each party's standardised columns to [-C, C] (default: no clipping)")
    p.add_argument("--output-dir", default="results/hetero_lr")
    args = p.parse_args(argv)
    if args.quick:
        args.datasets, args.seeds = ["credit_default"], [0]
    out = Path(args.output_dir)
    runs = []
    for ds in args.datasets:
        hyper = {opt: {"max_epochs": args.max_epochs, **HYPER[ds][opt]} for opt in OPTIMIZERS}
        for seed in args.seeds:
            for batch in BATCHES:
                for opt in OPTIMIZERS:
                    try:
                        r = run_table(ds, seed, [(batch, opt)], hyper, timeout=900, clip=args.clip)[0]
                    except FederationError as exc:
                        if "DivergenceError" not in str(exc):
                            raise
                        r = {"dataset": ds, "seed": seed, "batch": batch, "optimizer": opt, "clip": args.clip,
                             "diverged": True, "error": str(exc).splitlines()[1].strip(), **hyper[opt]}
                        print(f"{DATASETS[ds]:>8} seed {seed} batch {batch:>4} {opt.upper()}: DIVERGED", flush=True)
                    else:
                        print(f"{DATASETS[ds]:>8} seed {seed} batch {r['batch']:>4} {r['optimizer'].upper()}: "
                              f"{r['epochs']:>3} epochs, loss {r['train_loss']:.6f}, AUC {r['test_auc']:.4f} "
                              f"({r['wall_seconds']:.0f} s)", flush=True)
                    runs.append(r)
    rows = summarise(runs)
    record = {"experiment": "Yang et al. Table 1 (plaintext mode of the same protocol)", "machine": machine_note(),
              "seeds": args.seeds, "clip": args.clip, "hyper": {ds: HYPER[ds] for ds in args.datasets},
              "summary": rows, "runs": runs}
    write_json(out / "table1.json", record)
    with open(out / "table1.csv", "w", newline="") as fh:
        keys = ["dataset", "seed", "batch", "optimizer", "clip", "lr", "decay", "l2", "L", "M", "epochs",
                "iterations", "converged", "train_loss", "test_auc", "curvature_pairs", "wall_seconds", "diverged"]
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in runs:
            w.writerow({k: r.get(k) for k in keys})
    text = markdown(rows, runs)
    (out / "table1.md").write_text(text)
    plot(runs, out / "table1.png")
    print(text)


if __name__ == "__main__":
    main()
