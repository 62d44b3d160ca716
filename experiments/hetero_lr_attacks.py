"""The host's label inference on real data: paper protocol against the shared default (batch 50, SGD).

Two data parties and a coordinator train SGD at batch 50 for ``--epochs``
epochs, once under each protocol, in the same processes. The host then runs
``vfltorch.linear.attacks`` on what it holds: its block of w after every
step (paper) or its share of it (shared), the public batches and its own
columns. Reported: the accuracy of the exact 0/1 solve of the first batch,
the AUC of the stacked least-squares residuals over every step, and the
own-columns baseline (a logistic regression on the host's columns fitted
with every true label, in-sample AUC) - the most the host may learn.

The paper protocol runs in its plaintext mode by default (``--encrypted``
for Paillier): the host's view - its gradient blocks - is the same
(tests/test_hetero_lr_attacks.py runs it encrypted).

    python -m experiments.hetero_lr_attacks --dataset breast_cancer --epochs 10
    python -m experiments.hetero_lr_attacks --dataset credit_default --epochs 6     # ~5 min on 2 busy cores
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.linear import HeteroLogisticRegression, attacks
from vfltorch.linear.batches import BatchPlan
from vfltorch.linear.bounds import quantize

BATCH, L2, LR = 50, 1e-3, 0.15


def attack_job(fed, dataset: str, epochs: int, seed: int, encrypted: bool):
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="standard", test_fraction=0.2, seed=seed)) \
        if fed.is_data_party else None
    views = attacks.record_views(host_rank=1)
    out = {}
    for protocol in ("paper", "shared"):
        views["trajectory"].clear()
        est = HeteroLogisticRegression(fed, protocol=protocol, optimizer="sgd", batch_size=BATCH, lr=LR, l2=L2,
                                       max_epochs=epochs, tol=0.0, random_state=seed,
                                       encryption=encrypted or protocol == "shared", key_bits=1024,
                                       crypto_processes=1)
        est.fit(None if data is None else data.X_train,
                None if data is None or not fed.is_active else data.y_train)
        out[protocol] = [(attacks.as_numpy(w), eta) for w, eta in views["trajectory"]]
    if fed.rank == 1:
        return {"X": data.X_train.numpy(), **out}
    if fed.is_active:
        return {"y": data.y_train.numpy()}
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="breast_cancer")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encrypted", action="store_true", help="paper protocol under Paillier (1024-bit keys)")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    res = launch(attack_job, 2, args=(args.dataset, args.epochs, args.seed, args.encrypted), coordinator=True,
                 timeout=3600)
    y, host = res[0]["y"], res[1]
    n = len(y)
    plan = BatchPlan(n, BATCH, BATCH, args.seed)
    own = attacks.own_columns_auc(host["X"], y)
    report = {"dataset": args.dataset, "rows": n, "host_columns": host["X"].shape[1], "epochs": args.epochs,
              "batch": BATCH, "own_columns_auc": own, "protocols": {}}
    for protocol, fx in (("paper", 16), ("shared", 10)):
        traj = host[protocol]
        Xh = quantize(torch.as_tensor(host["X"]), fx).numpy()
        batches = [rows for e in range(args.epochs) for rows in plan.epoch(e)][:len(traj)]
        grads = attacks.gradients_from_trajectory([w for w, _ in traj], [eta for _, eta in traj], L2)
        first = batches[0]
        labels = attacks.first_batch_labels(Xh[first], grads[0])
        exact = None if labels is None else float((labels == y[first]).mean())
        stacked = attacks.auc(-attacks.stacked_residuals(Xh, batches, grads), y)
        report["protocols"][protocol] = {"first_batch_accuracy": exact, "stacked_auc": stacked, "steps": len(traj)}
    print(f"{args.dataset}: {n} rows, host {host['X'].shape[1]} columns, SGD batch {BATCH}, {args.epochs} epochs")
    print(f"own-columns baseline (all true labels, in-sample AUC): {own:.3f}")
    for protocol, r in report["protocols"].items():
        acc = "no solution" if r["first_batch_accuracy"] is None else f"{r['first_batch_accuracy']:.3f}"
        print(f"{protocol:7s} first-batch exact solve: {acc:>11s}   stacked least squares AUC: {r['stacked_auc']:.3f}")
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
