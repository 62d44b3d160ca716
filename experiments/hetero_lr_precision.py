"""How many fractional bits do the features need in the encrypted products? (Credit 1, centralised twin)

The features enter [[d]]^T X and [[h]]^T X as plaintext exponents quantised to
F_X fractional bits (``feature_frac_bits``); the exponent length is the cost
of the bucket method, so fewer bits are faster. Both protocol modes train on
exactly these quantised features, so the centralised twin with the same
F_X gives the protocol's model (``tests/test_hetero_lr.py``). This script
trains it for F_X in {32, 16, 12, 8} on credit_default (standardised columns,
80/20 split) and reports epochs, final training loss, test AUC and the
largest coefficient difference to F_X = 32.

    python -m experiments.hetero_lr_precision --output-dir results/hetero_lr     # seconds

writes ``precision.json`` and ``precision.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from sklearn.metrics import roc_auc_score

from vfltorch.comm import Federation
from vfltorch.data import load_party_data
from vfltorch.linear import HeteroLogisticRegression

from .hetero_lr_common import HYPER, data_config
from .outputs import machine_note, write_json


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", nargs="+", type=int, default=[32, 16, 12, 8])
    p.add_argument("--optimizers", nargs="+", default=["sgd", "sqn"], choices=["sgd", "sqn"])
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="results/hetero_lr")
    args = p.parse_args(argv)
    data = load_party_data(Federation.local(), data_config("credit_default", args.seed))
    runs = []
    for opt in args.optimizers:
        reference = None
        for bits in args.bits:
            est = HeteroLogisticRegression(None, optimizer=opt, batch_size=args.batch_size, feature_frac_bits=bits,
                                           random_state=args.seed, **HYPER["credit_default"][opt])
            est.fit(data.X_train, data.y_train)
            w = torch.cat([torch.as_tensor(est.coef_), torch.tensor([est.intercept_], dtype=torch.float64)])
            reference = w if reference is None else reference
            auc = float(roc_auc_score(data.y_test.numpy(), est.decision_function(data.X_test).numpy()))
            runs.append({"optimizer": opt, "feature_frac_bits": bits, "epochs": est.n_epochs_,
                         "train_loss": est.train_loss_, "test_auc": auc,
                         "max_coef_diff_to_first": float((w - reference).abs().max())})
    lines = ["| optimizer | F_X bits | epochs | train loss | test AUC | max abs coef diff to F_X = "
             f"{args.bits[0]} |", "|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['optimizer'].upper()} | {r['feature_frac_bits']} | {r['epochs']} | "
                     f"{r['train_loss']:.6f} | {r['test_auc']:.5f} | {r['max_coef_diff_to_first']:.2e} |")
    text = "\n".join(lines) + "\n"
    out = Path(args.output_dir)
    write_json(out / "precision.json", {"experiment": "hetero-LR feature precision (centralised twin, Credit 1)",
                                        "machine": machine_note(), "settings": vars(args), "runs": runs})
    (out / "precision.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
