"""FDSKL's cost against n: seconds, bytes and peak memory per epoch, and what prediction costs.

Part 1 (scaling). A synthetic 4-party problem: n rows, 20 dense columns
(5 per party), each party generating only its own columns (column c from its
own seeded generator), labels at the active party from a nonlinear rule of
all columns (it generates the others' columns one at a time to label the
rows, then frees them: a benchmark shortcut, not part of the protocol).
Every size trains the default bounded model (``n_components`` D random
features) through ``vfltorch.comm.launch``; with ``--unbounded-up-to N`` the
paper's growing model (n_components=None) runs too for n <= N, to show its
O(n^2 r / B) epoch (under the paper's protocol). Reported per epoch (measured over ``--epochs`` passes,
divided by them): the active party's training seconds, bytes sent by all
ranks (the dealer included), and each rank's peak RSS.

The scaling runs train only (``compress_to=None``: the compression after
training is a prediction-side cost); ``--batch-size`` overrides the default
batch (the batch-cap lever). Each record carries the load average.

Part 2 (``--a9a-predict``): bytes sent to score a9a's 16,281 test rows
(all ranks, the ``fdskl/predict`` phase) by the bounded model uncompressed and
compressed to each ``--compress-to`` D' (``compress.py``; the distillation's
steps, seconds and bytes are reported too), and with ``--a9a-growing`` the
paper's growing model (5 epochs, 5,152 features), under ``--protocols`` paper
and shared, with the test accuracy.

    python -m benchmarks.fdskl_scaling --sizes 10000 100000 1000000 --protocols shared paper --output-dir results/fdskl_scaling
    python -m benchmarks.fdskl_scaling --sizes --protocols shared --a9a-predict --n-components 1536 --a9a-epochs 4 \
        --compress-to 496 --predict-bits 32 24 20 --output-dir results/fdskl_predict
    python -m benchmarks.fdskl_scaling --sizes --protocols shared --a9a-predict --n-components 1536 --a9a-epochs 4 \
        --compress-to if-faithful --a9a-only-compressed --output-dir results/fdskl_predict_default   # the defaults

writes ``fdskl_scaling.json`` and ``fdskl_scaling.md`` to ``--output-dir``.
Timings on the shared 2-core machine are noisy; bytes are exact.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time
import warnings
from pathlib import Path

import torch

D_COLUMNS = 20


def column(c: int, n: int, seed: int) -> torch.Tensor:
    """Column c of the synthetic problem: uniform on [0, 1], from its own generator (any party can make it)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed * 1000 + c), dtype=torch.float64).float()


def labels(n: int, seed: int) -> torch.Tensor:
    """y = sign(sum_c sin(2 pi x_c + c) - threshold), about 9:1, nonlinear in every column."""
    s = torch.zeros(n, dtype=torch.float64)
    for c in range(D_COLUMNS):
        s += torch.sin(2 * math.pi * column(c, n, seed).double() + c)
    threshold = float(torch.quantile(s[: min(n, 100_000)], 0.9))
    return torch.where(s > threshold, 1.0, -1.0).float()


def party_columns(rank: int, parties: int) -> list[int]:
    per = D_COLUMNS // parties
    return list(range(rank * per, (rank + 1) * per)) if rank < parties - 1 else list(range(rank * per, D_COLUMNS))


def scaling_job(fed, n, kwargs, seed):
    from vfltorch.kernels import FDSKLClassifier

    warnings.simplefilter("ignore")
    est = FDSKLClassifier(fed, **kwargs)
    if fed.is_coordinator:
        est.fit(None)
    else:
        cols = party_columns(fed.parties.index(fed.rank), fed.num_parties)
        X = torch.stack([column(c, n, seed) for c in cols], dim=1)
        y = labels(n, seed) if fed.is_active else None
        est.fit(X, y, columns=cols)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"rank": fed.rank, "peak_rss_mb": rss_kb / 1024}
    if fed.is_active:
        out.update(train_seconds=est.train_seconds_, iterations=est.n_iter_, features=est.n_random_features_,
                   bytes=est.comm_["train_bytes_sent_total"], batch_loss=est.batch_loss_)
    return out


def run_scaling(n: int, parties: int, protocol: str, n_components, epochs: float, seed: int,
                batch_size: int | None = None) -> dict:
    from vfltorch.comm import launch

    # Training only: the model compression after training (compress.py) is a prediction-side cost, off here.
    kwargs = dict(protocol=protocol, n_components=n_components, epochs=epochs, random_state=seed, sigma="median",
                  batch_size=batch_size, compress_to=None)
    started = time.perf_counter()
    out = launch(scaling_job, parties, args=(n, kwargs, seed), coordinator=protocol == "shared" and parties > 1,
                 timeout=3600)
    wall = time.perf_counter() - started
    a = out[0]
    return {"n": n, "parties": parties, "protocol": protocol, "n_components": n_components, "epochs": epochs,
            "iterations": a["iterations"], "features": a["features"],
            "seconds_per_epoch": a["train_seconds"] / epochs, "bytes_per_epoch": a["bytes"] / epochs,
            "peak_rss_mb": [round(o["peak_rss_mb"], 1) for o in out], "wall_seconds": wall,
            "batch_size": batch_size, "load_average": os.getloadavg(),
            "batch_loss": a["batch_loss"]}


def a9a_job(fed, kwargs, bits_list):
    from vfltorch.data import DataConfig, load_party_data
    from vfltorch.kernels import FDSKLClassifier
    from vfltorch.kernels.trainer import phase_totals

    warnings.simplefilter("ignore")
    est = FDSKLClassifier(fed, **kwargs)
    data = None
    if fed.is_coordinator:
        est.fit(None)
    else:
        data = load_party_data(fed, DataConfig(dataset="a9a", scale="minmax", seed=0))
        est.fit(data.X_train, data.y_train, columns=data.columns)
    out = {"refit_bytes": (getattr(est, "compress_", None) or {}).get("refit_bytes_sent", 0), "predict": {}}
    for bits in bits_list:            # the same model scored at each prediction ring width (shared protocol)
        if bits is not None:
            est.set_params(predict_bits=bits)
        before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
        f = est.decision_function(None if data is None else data.X_test)
        rec = {"predict_bytes": phase_totals(fed, "fdskl/predict")["bytes_sent"] - before}
        if fed.is_active:
            rec["f"] = torch.as_tensor(f).double()
            rec["accuracy"] = float(((rec["f"] >= 0).double() * 2 - 1 == data.y_test.double()).double().mean())
        out["predict"][str(bits)] = rec
    if fed.is_active:
        support = getattr(est, "support_", None)
        out.update(rows=int(data.X_test.shape[0]), features=est.n_random_features_,
                   predict_features=est.n_random_features_ if support is None else int(len(support)),
                   compress=getattr(est, "compress_", None), train_seconds=est.train_seconds_)
    return out


def run_a9a(protocol: str, n_components, parties: int, epochs: float, compress_to=None, *,
            compress_support: str = "public", bits_list=(None,)) -> list[dict]:
    """One federated fit, then the test rows scored at each prediction ring width in ``bits_list`` (None: the
    estimator's default; only the shared protocol has a ring); one record per width."""
    from vfltorch.comm import launch

    kwargs = dict(protocol=protocol, n_components=n_components, epochs=epochs, random_state=0,
                  compress_to=compress_to, compress_support=compress_support)
    bits_list = list(bits_list) if protocol == "shared" else [None]
    started = time.perf_counter()
    out = launch(a9a_job, parties, args=(kwargs, bits_list), coordinator=protocol == "shared", timeout=3600)
    wall = time.perf_counter() - started
    a = out[0]
    if a["compress"]:
        a["compress"]["refit_bytes_total"] = sum(o["refit_bytes"] for o in out)
    reference = a["predict"][str(bits_list[0])]["f"]
    recs = []
    for bits in bits_list:
        got = a["predict"][str(bits)]
        err = (got["f"] - reference).abs()
        recs.append({"protocol": protocol, "n_components": n_components, "features": a["features"], "rows": a["rows"],
                     "compress_to": compress_to, "compress_support": compress_support if compress_to else None,
                     "predict_features": a["predict_features"], "compress": a["compress"], "predict_bits": bits,
                     "predict_bytes": sum(o["predict"][str(bits)]["predict_bytes"] for o in out),
                     "test_accuracy": got["accuracy"], "train_seconds": a["train_seconds"], "epochs": epochs,
                     "f_max_error_vs_first": float(err.max()) / float(reference.abs().max()),
                     "sign_changes_vs_first": float(((got["f"] >= 0) != (reference >= 0)).double().mean()),
                     "wall_seconds": wall, "load_average": os.getloadavg()})
    return recs


def _compress_to(text: str):
    return int(text) if text.isdigit() else text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--protocols", nargs="+", default=["paper", "shared"], choices=["paper", "shared"])
    p.add_argument("--n-components", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=None, help="B (default: the estimator's, n / 128 in [32, 256])")
    p.add_argument("--epochs", type=float, default=1.0, help="passes measured (figures are per epoch)")
    p.add_argument("--epochs-at", type=str, nargs="*", default=[],
                   help="N=EPOCHS overrides, e.g. 1000000=0.25 (a fraction of an epoch, scaled up)")
    p.add_argument("--unbounded-up-to", type=int, default=0, help="also run n_components=None for n <= this")
    p.add_argument("--a9a-predict", action="store_true")
    p.add_argument("--a9a-epochs", type=float, default=5.0, help="training epochs before the a9a prediction")
    p.add_argument("--a9a-growing-shared", action="store_true", help="also the growing model under shared (slow)")
    p.add_argument("--a9a-growing", action="store_true", help="also the growing model under paper")
    p.add_argument("--compress-to", type=_compress_to, nargs="*", default=[496],
                   help="a9a: also the bounded model compressed to these D' (compress.py) besides uncompressed; "
                        "'if-faithful' (the estimator's default: D' = 496 kept only if the check rows allow it), "
                        "'auto'")
    p.add_argument("--compress-support", choices=["public", "alpha"], default="public",
                   help="a9a: which D' features the compressed models keep (compress.py)")
    p.add_argument("--predict-bits", type=int, nargs="+", default=[24],
                   help="a9a, shared: score the test rows at each of these ring widths (the first is the reference "
                        "of the f error columns)")
    p.add_argument("--a9a-only-compressed", action="store_true", help="a9a: skip the uncompressed bounded model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, default=Path("results/fdskl_scaling"))
    args = p.parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    overrides = {int(k): float(v) for k, v in (s.split("=") for s in args.epochs_at)}
    rows, predict = [], []
    for n in args.sizes:
        for protocol in args.protocols:
            # The growing model under the paper's protocol only (under shared it is ~4x slower still).
            models = [args.n_components] + ([None] if n <= args.unbounded_up_to and protocol == "paper" else [])
            for D in models:
                epochs = overrides.get(n, args.epochs)
                rec = run_scaling(n, args.parties, protocol, D, epochs, args.seed, args.batch_size)
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    if args.a9a_predict:
        for protocol in args.protocols:
            grow = args.a9a_growing_shared if protocol == "shared" else args.a9a_growing
            specs = ([(None, None)] if grow else []) + \
                ([] if args.a9a_only_compressed else [(args.n_components, None)]) + \
                [(args.n_components, c) for c in args.compress_to]
            for D, c in specs:
                for rec in run_a9a(protocol, D, args.parties, args.a9a_epochs, c,
                                   compress_support=args.compress_support, bits_list=args.predict_bits):
                    predict.append(rec)
                    print(json.dumps(rec), flush=True)
    (args.output_dir / "fdskl_scaling.json").write_text(json.dumps({"scaling": rows, "a9a_predict": predict},
                                                                   indent=2))
    lines = ["| n | protocol | model | epochs measured | iterations | s / epoch | bytes / epoch | peak RSS MB "
             "per rank |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        model = f"D = {r['n_components']}" if r["n_components"] else f"growing ({r['features']} features)"
        lines.append(f"| {r['n']:,} | {r['protocol']} | {model} | {r['epochs']:g} | {r['iterations']} | "
                     f"{r['seconds_per_epoch']:.1f} | {r['bytes_per_epoch'] / 1e6:,.1f} MB | "
                     f"{', '.join(f'{m:.0f}' for m in r['peak_rss_mb'])} |")
    if predict:
        lines += ["", "| protocol | model | epochs | features trained / predicted | test rows | predict bytes (all ranks) "
                  "| test accuracy | refit iterations, s, bytes (all ranks) |", "|---|---|---|---|---|---|---|---|"]
        for r in predict:
            model = f"D = {r['n_components']}" if r["n_components"] else "growing"
            if r["compress_to"]:
                model += f", compressed to {r['compress_to']} ({r['compress_support']} support" + \
                    (f", decision: {r['compress']['decision']})" if r["compress"] else ")")
            if r["predict_bits"]:
                model += f", f in Z_2^{r['predict_bits']} (max |f - f_first| / max |f| " \
                         f"{r['f_max_error_vs_first']:.1e}, {100 * r['sign_changes_vs_first']:.3f}% signs)"
            c = r["compress"]
            refit = f"{c['refit_iterations']}, {c['refit_seconds']:.1f} s, {c['refit_bytes_total'] / 1e6:,.1f} MB" \
                if c else "-"
            lines.append(f"| {r['protocol']} | {model} | {r['epochs']:g} | {r['features']} / {r['predict_features']} | "
                         f"{r['rows']:,} | {r['predict_bytes'] / 1e6:,.1f} MB | {100 * r['test_accuracy']:.2f} | "
                         f"{refit} |")
    (args.output_dir / "fdskl_scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
