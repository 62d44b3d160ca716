"""FDSKL on a GPU against all CPU threads of the same machine, in one process (issue 34's targets).

    python -m benchmarks.gpu                  # 500k rows of the hard shape, a9a, 10^6 decision values, a9a Q = 4
    python -m benchmarks.gpu --quick          # small sizes: a smoke test (about a minute on 2 cores)

Rows (each GPU figure against the CPU with torch's threads = every core):

* ``fit hard N``: ``FDSKLClassifier().fit`` on N rows of the synthetic hard shape (``benchmarks.fdskl_accuracy``'s
  ``make_classification``: 20 dense columns, 9:1, 4 clusters per class); target GPU >= 5x faster;
* ``fit a9a``: the same on a9a ($VFLTORCH_DATA/libsvm/a9a.gz; skipped with a message when absent); target < 0.5 s;
* ``decision values M``: ``decision_function`` of the hard model on M rows; target < 1 s on the GPU;
* ``federated a9a Q = 4``: ``vfl fdskl --dataset a9a --parties 4`` (default launcher, shared protocol) with
  ``--device cuda`` (every party on one GPU) against ``--device cpu``: training seconds; target GPU no slower.

Without a GPU the GPU column reads "no GPU: skipped". Each figure is one run after a warm-up fit on a small set
(CUDA context, kernels, tables); rerun for spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch


def hard_rows(n: int, seed: int = 0):
    """n rows of the hard synthetic shape, min-max scaled, float32, labels -1 / +1."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=n, n_features=20, n_informative=10, n_redundant=4, n_clusters_per_class=4,
                               weights=[0.9], class_sep=1.0, flip_y=0.0, random_state=seed)
    lo, hi = X.min(0), X.max(0)
    X = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    return X.astype(np.float32), 2.0 * y - 1.0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fit_seconds(X, y, device: str):
    from vfltorch.kernels import FDSKLClassifier

    _sync(device)
    started = time.perf_counter()
    est = FDSKLClassifier(device=device).fit(X, y)
    _sync(device)
    return time.perf_counter() - started, est


def decision_seconds(est, X, device: str) -> float:
    Xt = torch.as_tensor(X, device=device)
    _sync(device)
    started = time.perf_counter()
    est.decision_function(Xt)
    _sync(device)
    return time.perf_counter() - started


def a9a():
    from vfltorch.comm import Federation
    from vfltorch.data import DataConfig, available, load_party_data

    if not available("a9a"):
        return None
    d = load_party_data(Federation.local(), DataConfig(dataset="a9a", scale="minmax", seed=0))
    return d.X_train.float().numpy(), d.y_train.numpy()


def federated_seconds(dataset: str, parties: int, device: str, epochs: float | None):
    """Training seconds (the active party's) and wall seconds of `vfl fdskl` with the default launcher."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "vfltorch", "fdskl", "--dataset", dataset, "--parties", str(parties),
               "--device", device, "--output-json", out]
        if epochs is not None:
            cmd += ["--epochs", str(epochs)]
        started = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - started
        if run.returncode != 0:
            return None, f"failed: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}"
        record = json.loads(open(out).read())
        return (float(record["train_seconds"]), wall), None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--rows", type=int, default=None, help="rows of the hard shape to fit (default 500,000)")
    parser.add_argument("--predict-rows", type=int, default=None, help="rows to score (default 10^6)")
    parser.add_argument("--skip-federated", action="store_true")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = args.rows or (2_500 if args.quick else 500_000)
    predict_rows = args.predict_rows or (20_000 if args.quick else 1_000_000)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    gpu = torch.cuda.is_available()
    print(f"torch {torch.__version__}, {threads} CPU threads, "
          f"{torch.cuda.get_device_name(0) if gpu else 'no GPU'}", flush=True)
    table = []          # (what, cpu seconds, gpu seconds or None, target text, pass or None)

    Xs, ys = hard_rows(2_000, seed=1)
    fit_seconds(Xs, ys, "cpu")                                           # warm-up: imports, tables
    if gpu:
        fit_seconds(Xs, ys, "cuda")                                      # CUDA context, kernels, tables

    X, y = hard_rows(rows)
    cpu_s, cpu_est = fit_seconds(X, y, "cpu")
    gpu_s = gpu_est = None
    if gpu:
        gpu_s, gpu_est = fit_seconds(X, y, "cuda")
    acc = lambda est: float(np.mean((est.decision_function(X[:20000]) >= 0) == (y[:20000] > 0)))  # noqa: E731
    note = f"train acc {acc(cpu_est):.4f} cpu" + (f", {acc(gpu_est):.4f} gpu" if gpu else "")
    table.append((f"fit hard {rows:,} rows ({note})", cpu_s, gpu_s, "GPU >= 5x faster",
                  None if gpu_s is None else cpu_s / gpu_s >= 5.0))

    data = a9a()
    if data is None:
        print("a9a: not found under $VFLTORCH_DATA (libsvm/a9a.gz): skipped", flush=True)
    else:
        Xa, ya = data
        if args.quick:                                                   # (a smoke test: its first 2,500 rows)
            Xa, ya = Xa[:2500], ya[:2500]
        a_cpu, _ = fit_seconds(Xa, ya, "cpu")
        a_gpu = fit_seconds(Xa, ya, "cuda")[0] if gpu else None
        table.append((f"fit a9a ({len(ya):,} rows)", a_cpu, a_gpu, "GPU < 0.5 s",
                      None if a_gpu is None else a_gpu < 0.5))

    Xp, _ = hard_rows(predict_rows, seed=2)
    d_cpu = decision_seconds(cpu_est, Xp, "cpu")
    d_gpu = decision_seconds(gpu_est, Xp, "cuda") if gpu else None
    table.append((f"decision values {predict_rows:,} rows", d_cpu, d_gpu, "GPU < 1 s",
                  None if d_gpu is None else d_gpu < 1.0))

    if not args.skip_federated:
        dataset, parties, epochs = ("breast_cancer", 2, 1.0) if args.quick or data is None else ("a9a", 4, None)
        if data is None and not args.quick:
            print("federated a9a: a9a not found: breast_cancer Q = 2 instead", flush=True)
        f_cpu, err_cpu = federated_seconds(dataset, parties, "cpu", epochs)
        f_gpu, err_gpu = federated_seconds(dataset, parties, "cuda", epochs) if gpu else (None, None)
        for err in (err_cpu, err_gpu):
            if err:
                print(f"federated {dataset}: {err}", flush=True)
        if f_cpu is not None:
            what = f"federated {dataset} Q = {parties} train s (wall cpu {f_cpu[1]:.1f} s" + \
                (f", gpu {f_gpu[1]:.1f} s)" if f_gpu else ")")
            table.append((what, f_cpu[0], None if f_gpu is None else f_gpu[0], "GPU no slower",
                          None if f_gpu is None else f_gpu[0] <= f_cpu[0]))

    width = max(len(r[0]) for r in table)
    print(f"\n{'':{width}}  {'CPU s':>9}  {'GPU s':>18}  {'CPU/GPU':>8}  target")
    for what, c, g, target, ok in table:
        gtxt = f"{g:9.3f}" if g is not None else "no GPU: skipped"
        ratio = f"{c / g:8.2f}" if g else f"{'-':>8}"
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        print(f"{what:{width}}  {c:9.3f}  {gtxt:>18}  {ratio}  {target} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
