"""Vertical DP-SCD: the label-safe protocols against the paper's, side by side in one run (issue 38).

For each dataset and party count, ``vfl dpscd`` runs the same options under ``--vertical-protocol paper``
(the baseline: clipped steps in the clear, the label leak), then each of ``--protocols`` (``shared``: a
dealer's correlated randomness; ``encrypted``: Paillier at ``--key-bits``). Reported per run: the active
party's training seconds (set-up and prediction excluded), the bytes every rank sent (the dealer included),
the test accuracy, and the ratios against the paper protocol of the same dataset and Q.

    python -m benchmarks.dpscd_protocols --datasets phishing adult --parties 2 3 --protocols shared

prints a Markdown table and writes ``dpscd_protocols.json`` to ``--output-dir`` when given. Timings on a
shared machine are noisy: compare the ratios, measured back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_one(dataset: str, protocol: str, parties: int, extra: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "vfltorch", "dpscd", "--dataset", dataset, "--parties", str(parties),
               "--vertical-protocol", protocol, "--quiet", "--output-json", str(out), *extra]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        rec = json.loads(out.read_text())
    sent = sum(int(v["bytes_sent"]) for v in rec["comm"].values())
    return {"dataset": dataset, "protocol": protocol, "parties": parties, "train_seconds": rec["train_seconds"],
            "bytes": sent, "test_accuracy": rec["metrics"].get("test_accuracy"), "steps": rec["steps"],
            "epsilon": rec["epsilon"], "wall_seconds": wall, "command": " ".join(cmd[1:]),
            "load_average": [load_before, os.getloadavg()[0]]}


def table(rows: list[dict]) -> str:
    lines = ["| dataset | Q | protocol | steps | train s | MB sent | test acc | time x paper | bytes x paper |",
             "|" + "---|" * 9]
    for r in rows:
        base = next(b for b in rows if b["dataset"] == r["dataset"] and b["parties"] == r["parties"]
                    and b["protocol"] == "paper")
        lines.append(f"| {r['dataset']} | {r['parties']} | {r['protocol']} | {r['steps']} | "
                     f"{r['train_seconds']:.2f} | {r['bytes'] / 1e6:.2f} | "
                     f"{100 * (r['test_accuracy'] or float('nan')):.2f} | "
                     f"{r['train_seconds'] / base['train_seconds']:.2f} | {r['bytes'] / base['bytes']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["phishing", "adult"])
    p.add_argument("--parties", nargs="+", type=int, default=[2, 3])
    p.add_argument("--protocols", nargs="+", default=["shared"], choices=["shared", "encrypted"])
    p.add_argument("--epochs", default="1")
    p.add_argument("--L", default="100")
    p.add_argument("--key-bits", default="2048", help="Paillier key of the encrypted protocol")
    p.add_argument("--output-dir", default=None)
    args = p.parse_args(argv)
    extra = ["--epochs", args.epochs, "--L", args.L, "--key-bits", args.key_bits]
    rows = []
    for dataset in args.datasets:
        task = ["--task", "svm"] if dataset == "adult" else ["--task", "logistic"]
        for q in args.parties:
            for protocol in ["paper", *args.protocols]:
                rows.append(run_one(dataset, protocol, q, extra + task))
                print(f"  {dataset} Q={q} {protocol}: {rows[-1]['train_seconds']:.2f} s, "
                      f"{rows[-1]['bytes'] / 1e6:.2f} MB", file=sys.stderr, flush=True)
    print(table(rows))
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dpscd_protocols.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
