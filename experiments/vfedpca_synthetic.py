"""VFedPCA on the paper's synthetic single- and mixture-Gaussian data (Figures 6-8, synthetic panels).

    python -m experiments.vfedpca_synthetic --output-dir results/vfedpca_synthetic

Data (``vfltorch.pca.synthetic``): [features, samples] = [1000, 200],
[2000, 400], [5000, 1000] by default; ``--full`` adds the paper's [10000, 2000]
and [20000, 4000] (about 0.7 GB for the largest matrix and, in this
simulation, the pooled reference of the parent process: it takes a while on
2 cores). Each party draws only its own columns. Settings: k = 1, T = 10,
l = 10, p = 3, 5, 10 (Figure 6); the largest p with warm start / weight
scaling (Figure 8); the exact federated PCA (masked sums) with its rounds
and bytes. Columns are centred per party, as everywhere in vfltorch.pca.
Writes ``synthetic.json``, ``synthetic.csv``, ``synthetic_<pattern>.png`` and
``summary.md``. ``--quick``: the smallest shape, p = 3 and 10, T = 5.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from vfltorch.pca import PAPER_SHAPES, ExactFederatedPCA, VFedPCA

from .vfedpca_common import Job, curve, distances, reference, run_jobs
from .outputs import pyplot as plt, write_json

PAPER = ("the paper runs Figures 6-8 on these synthetic shapes too; the qualitative claim to check is the "
         "same: a sharp drop after the first communication, warm start and weight scaling helping")
FIG8 = {"warm start": {"warm_start": True}, "weight scaling": {"weight_scaling": True},
        "both": {"warm_start": True, "weight_scaling": True}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", default="results/vfedpca_synthetic")
    ap.add_argument("--full", action="store_true", help="all five of the paper's shapes")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--patterns", nargs="+", default=["single", "mixture"], choices=["single", "mixture"])
    ap.add_argument("--max-rounds", type=int, default=500, help="exact method: at most this many rounds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.output_dir)
    shapes = PAPER_SHAPES if args.full else PAPER_SHAPES[:1] if args.quick else PAPER_SHAPES[:3]
    ps = [3, 10] if args.quick else [3, 5, 10]
    periods = 5 if args.quick else 10
    jobs = []
    for pattern in args.patterns:
        for m, n in shapes:
            ds = f"synthetic:{pattern}:{m}x{n}:{args.seed}"
            for p in ps:
                jobs.append(Job(f"{ds}/fig6/p={p}", ds, p, VFedPCA, dict(periods=periods, local_iters=10, merge="paper"),
                                "none",
                                {"figure": "fig6", "label": f"p={p}", "pattern": pattern, "shape": [m, n]}))
            for label, extra in ({} if args.quick else FIG8).items():
                jobs.append(Job(f"{ds}/fig8/{label}", ds, ps[-1], VFedPCA, dict(periods=periods, local_iters=10,
                                                                                merge="paper", **extra), "none",
                                {"figure": "fig8", "label": label, "pattern": pattern, "shape": [m, n]}))
            jobs.append(Job(f"{ds}/exact/p={ps[-1]}", ds, ps[-1], ExactFederatedPCA,
                            dict(n_components=1, max_rounds=args.max_rounds), "none",
                            {"figure": "exact", "label": f"p={ps[-1]}", "pattern": pattern, "shape": [m, n]}))
    results = run_jobs(jobs, timeout=1800)
    refs, record, rows = {}, {"paper": PAPER, "settings": {"periods": periods, "l": 10, "k": 1, "p": ps,
                                                           "shapes": shapes}, "runs": []}, []
    for res in results:
        job = res["job"]
        if job.dataset not in refs:
            refs[job.dataset] = reference(job.dataset, 1)
        G = refs[job.dataset]
        entry = {"name": job.name, "p": job.p, **job.tags, "bytes": res["bytes"], "rounds": res["rounds"],
                 "seconds": res["seconds"]}
        if job.tags["figure"] == "exact":
            entry.update(distances(res["components"][0], G), converged=res["converged"])
            rows.append([job.tags["pattern"], *job.tags["shape"], "exact", job.p, res["rounds"], entry["distance"]])
        else:
            entry["curve"] = curve(res, G)
            for pt in entry["curve"]:
                rows.append([job.tags["pattern"], *job.tags["shape"], job.tags["label"], job.p, pt["period"],
                             pt["distance"]])
        record["runs"].append(entry)
    write_json(out / "synthetic.json", record)
    with open(out / "synthetic.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pattern", "features", "samples", "setting", "p", "period_or_rounds", "distance"])
        w.writerows(rows)
    _plot(record, out, args.patterns, shapes)
    summary = _summary(record)
    (out / "summary.md").write_text(summary)
    print(summary)
    return 0


def _plot(record, out, patterns, shapes):
    pyplot = plt()
    for pattern in patterns:
        f, axes = pyplot.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.4), squeeze=False)
        for ax, (m, n) in zip(axes[0], shapes):
            for run in record["runs"]:
                if run.get("pattern") == pattern and run.get("shape") == [m, n] and "curve" in run:
                    ax.plot([p["period"] for p in run["curve"]], [p["distance"] for p in run["curve"]], marker="o",
                            label=run["label"])
            ax.set_title(f"{pattern} [{m}, {n}]")
            ax.set_xlabel("communication period (0: isolated)")
            ax.set_ylabel("sign-aligned distance")
            ax.legend(fontsize=7)
        f.tight_layout()
        f.savefig(out / f"synthetic_{pattern}.png", dpi=110)
        pyplot.close(f)


def _summary(record) -> str:
    lines = ["# VFedPCA on synthetic Gaussian data (measured)", "", f"settings: {record['settings']}", "",
             "| pattern | [features, samples] | setting | p | isolated | after period 1 | after period T | bytes |",
             "|---|---|---|---|---|---|---|---|"]
    for run in record["runs"]:
        if "curve" in run:
            c = run["curve"]
            lines.append(f"| {run['pattern']} | {run['shape']} | {run['label']} | {run['p']} | {c[0]['distance']:.4g} | "
                         f"{c[1]['distance']:.4g} | {c[-1]['distance']:.4g} | {run['bytes']} |")
    lines += ["", "| pattern | [features, samples] | exact (masked sums), p | distance | rounds | bytes | converged |",
              "|---|---|---|---|---|---|---|"]
    for run in record["runs"]:
        if run["figure"] == "exact":
            lines.append(f"| {run['pattern']} | {run['shape']} | {run['p']} | {run['distance']:.3g} | {run['rounds']} | "
                         f"{run['bytes']} | {run['converged']} |")
    lines += ["", f"Paper (qualitative): {record['paper']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
