"""FDSKL communication: bytes per iteration against the iteration t, for both schedules, vs the analysis.

FDSKL's analysis (Section 5) gives O(q t) communication per iteration: to
evaluate f(x_i) the phases of x_i on all t earlier features go through
Algorithm 3. Batched (B rows, r features per iteration, Q parties), each
masked sum sends 2Q - 2 messages (T1: Q - 1 edges and the kept party's
total to the active party; T2: Q - 2 edges), so with a-byte angles (a = 2 for the
default 16-bit angles, 4 for ``--angle-bits 32``):

* ``paper`` schedule: a (2Q - 2) B r (t + 1) bytes at iteration t: linear in t;
* ``cached`` schedule: a (2Q - 2) n r bytes at every iteration: constant.

The two cross at t + 1 = n / B, the end of the first epoch; over E epochs the
cached schedule sends E / 2 times fewer bytes in total. This script measures
the bytes of every iteration from the parties' meters (one curve point per
iteration), for Q = 2, 3, 4, and plots them with the analysis.

    python -m experiments.fdskl_comm --output-dir results/fdskl
    python -m experiments.fdskl_comm --dataset a9a --rows 4000 --iterations 60

writes ``comm.json``, ``comm.csv`` and ``comm.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from vfltorch.comm import launch
from vfltorch.data import load_party_data
from vfltorch.kernels import FDSKLClassifier

from .fdskl_common import data_config
from .outputs import machine_note, pyplot, write_outputs


def _party(fed, dataset, rows, batch, r, iterations, schedule, bits):
    data = load_party_data(fed, data_config(dataset, 0))
    X, y = data.X_train[:rows], None if data.y_train is None else data.y_train[:rows]
    epochs = iterations * batch / X.shape[0]
    clf = FDSKLClassifier(fed, protocol="paper", n_components=None, solver="dsg", batch_size=batch,
                          features_per_step=r, epochs=epochs,
                          schedule=schedule, angle_bits=bits, log_every=1).fit(X, y, columns=data.columns)
    if not fed.is_active:
        return None
    total = [0] + [p["bytes"] for p in clf.history_]
    return {"bytes_per_iteration": np.diff(total).tolist(), "iterations": clf.n_iter_,
            "train_seconds": clf.train_seconds_}


def analysis(schedule, q, n, batch, r, t, bits=16):
    per = bits // 8 * (2 * q - 2) * r
    return per * batch * (t + 1) if schedule == "paper" else per * n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="a9a")
    p.add_argument("--rows", type=int, default=8000, help="training rows used (n)")
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--features-per-step", type=int, default=32)
    p.add_argument("--iterations", type=int, default=64)
    p.add_argument("--parties", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--angle-bits", type=int, choices=[16, 32, 64], default=16)
    p.add_argument("--output-dir", default="results/fdskl")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    n, B, r = args.rows, args.batch_size, args.features_per_step
    record = {"experiment": "FDSKL bytes per iteration", "machine": machine_note(), "dataset": args.dataset,
              "rows": n, "batch_size": B, "features_per_step": r, "angle_bits": args.angle_bits, "runs": {}}
    rows = []
    for q in args.parties:
        for schedule in ("paper", "cached"):
            res = launch(_party, q, args=(args.dataset, n, B, r, args.iterations, schedule, args.angle_bits), timeout=600)[0]
            record["runs"][f"{schedule}/Q={q}"] = res
            for t, b in enumerate(res["bytes_per_iteration"]):
                model = analysis(schedule, q, n, B, r, t, args.angle_bits)
                rows.append({"parties": q, "schedule": schedule, "iteration": t, "bytes": b, "analysis": model})
            measured = res["bytes_per_iteration"]
            exact = all(b == analysis(schedule, q, n, B, r, t, args.angle_bits) for t, b in enumerate(measured))
            record["runs"][f"{schedule}/Q={q}"]["matches_analysis_exactly"] = exact
            print(f"Q={q} {schedule:>6}: {sum(measured) / 1e6:8.1f} MB in {len(measured)} iterations, "
                  f"first {measured[0] / 1e3:.0f} kB, last {measured[-1] / 1e3:.0f} kB, "
                  f"analysis exact: {exact}", flush=True)
    write_outputs(out, "comm", record, rows)
    plot(record, rows, out / "comm.png", n, B)
    print(f"wrote {out / 'comm.json'}, comm.csv, comm.png")


def plot(record, rows, path, n, B):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in record["runs"]:
        schedule, q = key.split("/")
        pts = [x for x in rows if x["schedule"] == schedule and f"Q={x['parties']}" == q]
        ax.plot([x["iteration"] for x in pts], [x["bytes"] / 1e6 for x in pts],
                "-" if schedule == "paper" else "--", label=f"{schedule}, {q}")
        ax.plot([x["iteration"] for x in pts], [x["analysis"] / 1e6 for x in pts], ":", color="gray", lw=1)
    ax.axvline(n / B - 1, color="k", lw=0.8, alpha=0.5)
    ax.text(n / B - 1, ax.get_ylim()[1] * 0.9, " end of epoch 1", fontsize=8)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("MB sent by all parties in iteration t")
    ax.set_title(f"bytes per iteration (n={n}, B={B}); dotted: analysis")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
