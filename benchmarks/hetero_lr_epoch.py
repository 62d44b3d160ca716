"""One encrypted hetero-LR epoch on credit_default, today's single-process path against every core, side by side.

    python -m benchmarks.hetero_lr_epoch --output-json results/hetero_lr/epoch_bench.json [--key-bits 2048]

Two data parties and a coordinator (``vfltorch.comm.launch``), credit_default
(24,000 training rows), batch 1000, SGD, one epoch per configuration, all
configurations in the same party processes one after the other (so they
share the machine's state and load):

* ``paper, 1 process``: the paper protocol as it ran before issue 21 - every
  Paillier operation in the party's own process, obfuscators made before each
  iteration (``crypto_processes=1, precompute="batch"``);
* ``paper, every core``: obfuscators (encryptions of zero), [[d]]^T X and the
  coordinator's decryptions spread over ``crypto_processes`` = the machine's
  cores (``CryptoWorkers``, started and warmed up during setup);
* ``paper, every core, background`` (``--with-background``): the same, plus a
  background process per party that keeps the obfuscator pool full while the
  parties compute;
* ``paper, packed features``: the same protocol and leakage with each party's
  columns encrypted once, packed (``packed_features=True``, ``linear/packed.py``):
  per batch a few ciphertexts instead of 2 |S| fresh encryptions; the one-off
  encryption of the columns is reported as setup;
* ``shared``: the default protocol (no Paillier at all), for scale.

Reported per configuration: all-in wall seconds of the epoch (online +
offline + the end-of-epoch reports), online and offline seconds, setup
seconds (key generation, worker start-up, the packed layout's one-off
encryption of the columns: once per run), bytes per party, the wall-time
ratio against the single-process path, and the ratio of a whole E-epoch run
(setup + E x wall; E = 1 and ``--amortise`` epochs) against the same for the
single-process path. The ratio is the
measurement; absolute seconds depend on how busy the machine is (its load
average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from vfltorch.comm import launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.linear import HeteroLogisticRegression


def configurations(processes: int, background: bool = False) -> list[tuple[str, dict]]:
    out = [
        ("paper, 1 process", dict(protocol="paper", crypto_processes=1, precompute="batch")),
        (f"paper, every core ({processes} processes)", dict(protocol="paper", crypto_processes=processes,
                                                            precompute="batch")),
    ]
    if background:
        out.append((f"paper, every core ({processes}) + background obfuscators",
                    dict(protocol="paper", crypto_processes=processes, precompute="background")))
    out += [
        ("paper, packed features, 1 process", dict(protocol="paper", crypto_processes=1, precompute="batch",
                                                    packed_features=True)),
        ("shared (default protocol)", dict(protocol="shared")),
    ]
    return out


def bench_job(fed, key_bits: int, batch: int, processes: int, dataset: str, insecure_key: bool = False,
              background: bool = False):
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="standard", test_fraction=0.2, seed=0)) \
        if fed.is_data_party else None
    X = None if data is None else data.X_train
    y = None if data is None or not fed.is_active else data.y_train
    out = []
    for name, kw in configurations(processes, background):
        est = HeteroLogisticRegression(fed, optimizer="sgd", batch_size=batch, max_epochs=1, tol=0.0,
                                       key_bits=key_bits, insecure_key=insecure_key, **kw)
        started = time.perf_counter()
        est.fit(X, y)
        total = time.perf_counter() - started
        if fed.is_active:
            h = est.history_[-1]
            out.append({"configuration": name, "settings": kw, "wall_seconds": est.wall_seconds_,
                        "online_seconds": est.train_seconds_, "offline_seconds": est.offline_seconds_,
                        "setup_seconds": est.setup_seconds_, "fit_seconds_including_setup": total,
                        "bytes_per_party": h["bytes_per_party"], "loss": h["loss"], "encryption": est.encryption_,
                        "timings": est.timings_})
    return out if fed.is_active else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--key-bits", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="crypto processes per party in the 'every core' configurations (default: cores)")
    p.add_argument("--dataset", default="credit_default")
    p.add_argument("--insecure-key", action="store_true", help="allow keys under 1024 bits (smoke runs)")
    p.add_argument("--with-background", action="store_true",
                   help="also run every core + a background obfuscator process per party")
    p.add_argument("--amortise", type=int, default=10,
                   help="E for the whole-run ratio (setup + E x epoch), besides E = 1 (default 10)")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    load = os.getloadavg()
    results = launch(bench_job, 2, args=(args.key_bits, args.batch_size, args.processes, args.dataset,
                                                args.insecure_key, args.with_background),
                     coordinator=True, timeout=1800)[0]
    base = results[0]["wall_seconds"]
    E = args.amortise
    run_1 = {e: results[0]["setup_seconds"] + e * base for e in (1, E)}
    for r in results:
        r["wall_ratio_vs_1_process"] = r["wall_seconds"] / base
        for e in (1, E):
            r[f"run_{e}_epochs_seconds"] = r["setup_seconds"] + e * r["wall_seconds"]
            r[f"run_{e}_epochs_ratio_vs_1_process"] = r[f"run_{e}_epochs_seconds"] / run_1[e]
    record = {"benchmark": "hetero-LR encrypted epoch, 1 process vs every core", "settings": vars(args),
              "cpu_count": os.cpu_count(), "load_average_before": load, "load_average_after": os.getloadavg(),
              "python": sys.version.split()[0], "runs": results}
    print(f"{args.dataset}, {args.key_bits}-bit keys, batch {args.batch_size}, 2 data parties, 1 SGD epoch "
          f"(load average {load[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'configuration':44s} {'wall s':>8s} {'online':>8s} {'offline':>8s} {'setup':>7s} {'x 1-proc':>9s} "
          f"{'run 1 ep':>9s} {f'run {E} ep':>9s}")
    for r in results:
        print(f"{r['configuration']:44s} {r['wall_seconds']:8.2f} {r['online_seconds']:8.2f} "
              f"{r['offline_seconds']:8.2f} {r['setup_seconds']:7.2f} {r['wall_ratio_vs_1_process']:9.3f} "
              f"{r['run_1_epochs_ratio_vs_1_process']:9.3f} {r[f'run_{E}_epochs_ratio_vs_1_process']:9.3f}")
    print(f"(x 1-proc: epoch wall / the 1-process epoch; run E ep: (setup + E x epoch) / the same for 1 process; "
          f"load average after: {record['load_average_after'][0]:.1f})")
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
