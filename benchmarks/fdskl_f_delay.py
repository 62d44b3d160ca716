"""FDSKL's pipelined iteration against the exact one, centralised: test accuracy of f_delay 1 against f_delay 0.

``f_delay`` 1 (the shared protocol's default) computes f on batch t from the coefficients before step t - 1 and
takes the delay-compensated step (``kernels.budget``); at Q = 1 it is the same algorithm as the federated
pipelined run (the twin tests say so), so its accuracy is measured here, without processes:

    python -m benchmarks.fdskl_f_delay --datasets phishing credit_default --seeds 8
    python -m benchmarks.fdskl_f_delay --datasets phishing credit_default --seeds 8 --full
    python -m benchmarks.fdskl_f_delay --datasets a9a give_me_some_credit --seeds 1 --full

Each seed is ``vfl fdskl --parties 1 --seed S`` (its split, features and batches) trained twice, ``--f-delay 0``
then ``1``. Without ``--full`` the width is the median's and nothing is compressed (``sigma_grid=(1,)``,
``compress_to=None``): the training algorithm alone. ``--full`` keeps the defaults (width selection,
``compress_to='if-faithful'``), whose discrete decisions can differ between two nearly equal models. Prints
one line per seed (accuracy, test log loss, width multiplier, kept model) and the mean and worst difference.
"""

from __future__ import annotations

import argparse
import os
import statistics


def one(dataset: str, seed: int, f_delay: int, full: bool) -> dict:
    import torch

    from vfltorch.cli import data_config, parse_command_line
    from vfltorch.comm import Federation
    from vfltorch.data import load_party_data
    from vfltorch.kernels import cli as kcli
    from vfltorch.kernels.trainer import held_out_metrics

    args, _ = parse_command_line(["fdskl", "--dataset", dataset, "--parties", "1", "--seed", str(seed)])
    fed = Federation.local()
    data = load_party_data(fed, data_config(args))
    est = kcli._estimator(fed, args, data.task)
    est.set_params(f_delay=f_delay, **({} if full else {"compress_to": None, "sigma_grid": (1.0,)}))
    est.fit(data.X_train.to(torch.float64), data.y_train, columns=data.columns)
    f = torch.as_tensor(est.decision_function(data.X_test.to(torch.float64))).to(torch.float64)
    y = torch.as_tensor(data.y_test).to(torch.float64)
    return {"accuracy": held_out_metrics(f, y, "binary")["accuracy"],
            "log_loss": float(torch.nn.functional.softplus(-y * f).mean()),
            "sigma_multiplier": est.sigma_multiplier_, "kept": (est.compress_ or {}).get("decision", "all D")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["phishing", "credit_default"])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="the defaults' width selection and compression too")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; {'defaults' if args.full else 'median width, no compression'}")
    for ds in args.datasets:
        diffs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            a, b = one(ds, seed, 0, args.full), one(ds, seed, 1, args.full)
            diffs.append(100 * (b["accuracy"] - a["accuracy"]))
            print(f"{ds} seed {seed}: f_delay 0 {100 * a['accuracy']:.2f}% (log loss {a['log_loss']:.3f}, "
                  f"width x{a['sigma_multiplier']:g}, {a['kept']}) | f_delay 1 {100 * b['accuracy']:.2f}% "
                  f"({b['log_loss']:.3f}, x{b['sigma_multiplier']:g}, {b['kept']}) | {diffs[-1]:+.2f} point",
                  flush=True)
        print(f"{ds}: mean {statistics.mean(diffs):+.3f} point, worst {min(diffs):+.2f} ({len(diffs)} seeds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
