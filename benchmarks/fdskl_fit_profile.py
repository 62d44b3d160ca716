"""FDSKL's default centralised fit (Q = 1), timed and optionally profiled (issue 16's fit-time target).

    python -m benchmarks.fdskl_fit_profile --datasets hard a9a give_me_some_credit
    python -m benchmarks.fdskl_fit_profile --datasets hard --profile 25

Per dataset (``benchmarks.fdskl_accuracy.load``: ``hard`` is the synthetic set, the others come from
``VFLTORCH_DATA``): ``FDSKLClassifier()`` with every default, fitted in this process with one torch
thread; prints the fit seconds (wall clock and the process's CPU time, steadier on a loaded machine;
width selection + training + compression), the test accuracy and the load
average before and after. ``--profile N`` runs the fit under cProfile and prints the N costliest functions
(cumulative and own time, in this process's CPU seconds); profiled seconds are inflated by the profiler,
so time without it.

``--features`` also times the feature path alone on a batch of the default shape (B = 256 rows,
D = 1536 features, 16-bit angles, Q = 1): ``fmap.features`` (phases straight to table indices, one
lookup) against ``fmap.phases`` then decode + cos + sqrt 2 (the computed path, on this version's phases),
as a ratio measured in this process; the two must be equal.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import numpy as np
import torch


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fit_once(name: str, profile: int) -> dict:
    from benchmarks.fdskl_accuracy import accuracy, load
    from vfltorch.kernels import FDSKLClassifier

    Xtr, ytr, Xte, yte = load(name)
    torch.set_num_threads(1)
    est = FDSKLClassifier()
    prof = cProfile.Profile(time.process_time) if profile else None      # CPU seconds: steadier under load
    before = _load()
    started, cpu = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    est.fit(Xtr.astype(np.float32), ytr)
    if prof is not None:
        prof.disable()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    acc = accuracy(est.decision_function(Xte.astype(np.float32)), yte)
    out = {"dataset": name, "rows": len(ytr), "fit_s": seconds, "fit_cpu_s": cpu, "accuracy": acc,
           "selection_s": getattr(est, "selection_seconds_", 0.0), "train_s": est.train_seconds_,
           "load_before": before, "load_after": _load()}
    print(f"{name}: {len(ytr)} rows, fit {seconds:.2f} s (process CPU {cpu:.2f} s; selection {out['selection_s']:.2f}, "
          f"training {out['train_s']:.2f}), test accuracy {100 * acc:.2f}%, "
          f"load {before} -> {out['load_after']}", flush=True)
    if prof is not None:
        for key in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(profile)
            print(s.getvalue())
    return out


def feature_path(repeats: int = 20) -> None:
    """fmap.features (the table) against phases + decode + cos + sqrt 2, B = 256, D = 1536."""
    from vfltorch.comm import Federation, MaskStream
    from vfltorch.kernels.circle import Circle
    from vfltorch.kernels.protocol import SQRT2, FederatedFeatureMap
    from vfltorch.kernels.random_features import FourierSampler

    torch.set_num_threads(1)
    B, d, D, r = 256, 20, 1536, 32
    X = torch.rand(B, d, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    fmap = FederatedFeatureMap(Federation.local(), FourierSampler("rbf", sigma=1.0, seed=0), range(d), r, seed=0,
                               phase_key=1, masks=MaskStream.private(0), circle=Circle(16), dtype=torch.float32)
    for _ in range(D // r):
        fmap.add_block()
    blocks = range(fmap.n_blocks)

    def old():
        theta = fmap.phases(X, blocks)
        return fmap.circle.decode(theta, fmap.dtype).cos_().mul_(SQRT2)

    def new():
        return fmap.features(X, blocks)

    assert torch.equal(old(), new())
    times = {"decode+cos": [], "features": []}
    for _ in range(repeats):
        for label, fn in (("decode+cos", old), ("features", new)):
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"feature path, B = {B}, D = {D}, 16-bit angles, float32 (median of {repeats}): "
          f"phases + decode + cos {1e3 * med['decode+cos']:.2f} ms, features {1e3 * med['features']:.2f} ms, "
          f"ratio {med['decode+cos'] / med['features']:.2f}x; load {_load()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="*", default=["hard"])
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions (cProfile)")
    parser.add_argument("--features", action="store_true", help="time the feature path alone first")
    args = parser.parse_args(argv)
    if args.features:
        feature_path()
    for name in args.datasets:
        fit_once(name, args.profile)


if __name__ == "__main__":
    main()
