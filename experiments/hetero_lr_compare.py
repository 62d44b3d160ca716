"""SGD against SQN on equal terms: the same step schedule, several seeds, epochs, rounds, bytes and seconds.

The issue-13 finding: the old comparison gave SGD a constant step 0.15 and SQN
0.3 / (1 + e). Here both optimizers run under each of two schedules,

* ``constant``: eta = 0.15 every epoch (SGD's old default),
* ``decaying``: eta = 0.3 / (1 + e) (SQN's old default),

on credit_default (2 data parties, batch 1000, L = 4, M = 10, stop when the
epoch loss changes by < 1e-5, at most ``--max-epochs``), with seeds 0, 1, 2
(the seed draws the train/test split and the batches), under the default
shared protocol (``--protocol shared``; ``--protocol paper`` with
``--encrypted`` runs the Paillier protocol instead). Reported per run:
epochs, iterations, protocol rounds (gradient rounds + curvature rounds),
bytes sent by all processes, wall seconds, final training loss, test AUC.

``--twin`` (fast): the epochs, rounds, losses and AUCs come from the centralised
twin (one process, the same optimizer and schedule, X at the shared protocol's
10 fractional bits: what the shared protocol reproduces, to 1e-4 in the loss in
the tests; the stopping rule is a threshold, so a run could differ by an epoch),
and bytes and seconds per epoch are measured on two epochs of the federated
shared protocol per optimizer (the last epoch: steady state), times the epochs.

    python -m experiments.hetero_lr_compare --output-dir results/hetero_lr            # federated, slow
    python -m experiments.hetero_lr_compare --twin --output-dir results/hetero_lr     # twin + measured bytes

writes ``compare.json`` and ``compare.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.linear import HeteroLogisticRegression

SCHEDULES = {"constant": {"lr": 0.15, "decay": 0.0}, "decaying": {"lr": 0.3, "decay": 1.0}}


def compare_job(fed, dataset: str, seed: int, protocol: str, encrypted: bool, max_epochs: int, key_bits: int,
                schedules=tuple(SCHEDULES), optimizers=("sgd", "sqn"), packed_features: bool = False,
                crypto_processes: int | None = None):
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="standard", test_fraction=0.2, seed=seed)) \
        if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None or not fed.is_active else data.y_train
    out = []
    for schedule in schedules:
        step = SCHEDULES[schedule]
        for optimizer in optimizers:
            est = HeteroLogisticRegression(fed, protocol=protocol, optimizer=optimizer, batch_size=1000,
                                           max_epochs=max_epochs, random_state=seed, encryption=encrypted,
                                           key_bits=key_bits, crypto_processes=crypto_processes,
                                           packed_features=packed_features, **step)
            started = time.perf_counter()
            est.fit(X, y)
            wall = time.perf_counter() - started
            scores = est.decision_function(None if data is None else data.X_test)
            if fed.is_active:
                from sklearn.metrics import roc_auc_score

                hist = est.history_
                out.append({"schedule": schedule, "optimizer": optimizer, "seed": seed, "epochs": est.n_epochs_,
                            "converged": est.converged_, "iterations": est.n_iter_, "rounds": hist[-1]["rounds"],
                            "bytes": int(sum(h["bytes_total"] for h in hist)), "wall_seconds": wall,
                            "setup_seconds": est.setup_seconds_, "train_loss": est.train_loss_,
                            "test_auc": float(roc_auc_score(data.y_test.numpy() > 0, scores.numpy())),
                            "encryption": est.encryption_, "loss_curve": [h["loss"] for h in hist]})
    return out if fed.is_active else None


def epoch_cost_job(fed, dataset: str):
    """Bytes and wall seconds of the second epoch of the shared protocol, per optimizer (guest's view)."""
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="standard", test_fraction=0.2, seed=0)) \
        if fed.is_data_party else None
    out = {}
    for optimizer in ("sgd", "sqn"):
        est = HeteroLogisticRegression(fed, optimizer=optimizer, batch_size=1000, max_epochs=2, tol=0.0)
        est.fit(None if data is None else data.X_train, None if data is None or not fed.is_active else data.y_train)
        if fed.is_active:
            h = est.history_
            out[optimizer] = {"bytes_per_epoch": h[-1]["bytes_total"],
                              "seconds_per_epoch": h[-1]["online_seconds"] - h[0]["online_seconds"]}
    return out if fed.is_active else None


def twin_runs(args) -> list:
    from sklearn.metrics import roc_auc_score

    from vfltorch.comm import Federation

    # One launch measures the federated epoch cost; the runs themselves are the twin, in this process.
    # (This function used to call itself here instead, so --twin launched party processes without end.)
    cost = launch(epoch_cost_job, 2, args=(args.dataset,), coordinator=True, timeout=3600)[0]
    runs = []
    for seed in args.seeds:
        data = load_party_data(Federation.local(),
                               DataConfig(dataset=args.dataset, scale="standard", test_fraction=0.2, seed=seed))
        for schedule in args.schedules:
            for optimizer in args.optimizers:
                est = HeteroLogisticRegression(None, optimizer=optimizer, batch_size=1000, max_epochs=args.max_epochs,
                                               random_state=seed, feature_frac_bits=10, **SCHEDULES[schedule])
                started = time.perf_counter()
                est.fit(data.X_train, data.y_train)
                c = cost[optimizer]
                runs.append({"schedule": schedule, "optimizer": optimizer, "seed": seed, "epochs": est.n_epochs_,
                             "converged": est.converged_, "iterations": est.n_iter_,
                             "rounds": est.history_[-1]["rounds"], "bytes": c["bytes_per_epoch"] * est.n_epochs_,
                             "wall_seconds": c["seconds_per_epoch"] * est.n_epochs_,
                             "twin_seconds": time.perf_counter() - started, "train_loss": est.train_loss_,
                             "test_auc": float(roc_auc_score(data.y_test.numpy() > 0,
                                                             est.decision_function(data.X_test).numpy())),
                             "loss_curve": [h["loss"] for h in est.history_]})
    return runs, cost


def markdown(runs: list, args) -> str:
    source = " (epochs from the centralised twin; bytes, seconds: measured shared epochs x epochs)" if args.twin else ""
    layout = ", packed features" if getattr(args, "packed_features", False) else ""
    lines = [f"{args.dataset}, protocol {args.protocol}{' (Paillier)' if args.encrypted else ''}{layout}{source}, "
             f"batch 1000, "
             f"L = 4, M = 10, tol 1e-5, seeds {args.seeds}", "",
             "| schedule | optimizer | epochs (per seed) | mean epochs | mean rounds | mean MB sent | mean wall s | "
             "train loss | test AUC |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for schedule in SCHEDULES:
        for optimizer in ("sgd", "sqn"):
            rs = [r for r in runs if r["schedule"] == schedule and r["optimizer"] == optimizer]
            if not rs:
                continue
            epochs = "/".join(f"{r['epochs']}{'' if r['converged'] else '*'}" for r in rs)
            lines.append(f"| {schedule} | {optimizer.upper()} | {epochs} | {np.mean([r['epochs'] for r in rs]):.1f} | "
                         f"{np.mean([r['rounds'] for r in rs]):.0f} | {np.mean([r['bytes'] for r in rs]) / 1e6:.1f} | "
                         f"{np.mean([r['wall_seconds'] for r in rs]):.1f} | "
                         f"{np.mean([r['train_loss'] for r in rs]):.6f} | {np.mean([r['test_auc'] for r in rs]):.4f} |")
    lines.append("")
    lines.append("`*`: stopped at --max-epochs without meeting the tolerance.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="credit_default")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--protocol", default="shared", choices=["shared", "paper"])
    p.add_argument("--encrypted", action="store_true", help="paper protocol under Paillier (default: plaintext "
                                                            "paper protocol when --protocol paper)")
    p.add_argument("--key-bits", type=int, default=2048)
    p.add_argument("--max-epochs", type=int, default=60)
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    p.add_argument("--optimizers", nargs="+", default=["sgd", "sqn"], choices=["sgd", "sqn"])
    p.add_argument("--packed-features", action="store_true",
                   help="paper protocol, SGD: the packed-features Paillier layout (columns encrypted once)")
    p.add_argument("--crypto-processes", type=int, default=None,
                   help="paper protocol: crypto processes per party (default: the machine's cores)")
    p.add_argument("--twin", action="store_true", help="epochs from the centralised twin, bytes and seconds "
                                                       "per epoch measured on the shared protocol")
    p.add_argument("--output-dir", default="results/hetero_lr")
    p.add_argument("--name", default="compare")
    args = p.parse_args(argv)
    encrypted = args.encrypted or args.protocol == "shared"
    load_before = os.getloadavg()
    runs, cost = [], None
    if args.twin:
        runs, cost = twin_runs(args)
    for seed in ([] if args.twin else args.seeds):
        runs += launch(compare_job, 2, args=(args.dataset, seed, args.protocol, encrypted, args.max_epochs,
                                             args.key_bits, tuple(args.schedules), tuple(args.optimizers),
                                             args.packed_features, args.crypto_processes),
                         coordinator=True, timeout=3600)[0]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    load = {"before": load_before, "after": os.getloadavg()}
    (out / f"{args.name}.json").write_text(json.dumps({"settings": vars(args), "epoch_cost": cost, "runs": runs,
                                                       "load_average": load}, indent=1))
    text = markdown(runs, args) + (f"\nLoad average (1 min) before {load['before'][0]:.1f}, after "
                                   f"{load['after'][0]:.1f} on {os.cpu_count()} cores.\n")
    (out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
