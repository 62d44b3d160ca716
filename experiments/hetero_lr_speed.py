"""Wall time and bytes of an encrypted epoch against the plaintext mode of the same protocol (Credit 1).

Two data parties and a coordinator (3 processes on this 2-core machine),
credit_default (24,000 training rows, 12 + 11 columns plus the guest's
intercept), batch 1000: per optimizer, one run in ``--insecure-plaintext``
mode and one with Paillier keys of ``--key-bits`` bits, in the same party
processes, one after the other. Reported per epoch: online seconds (the
protocol itself), offline seconds (obfuscators r^n made ahead of need,
before each iteration: they depend on no data), bytes sent per party, and
each party's seconds by phase (encrypt, homomorphic ops, decrypt, send,
receive, local tensor work).

    python -m experiments.hetero_lr_speed --output-dir results/hetero_lr            # 2048-bit keys, ~5 min
    python -m experiments.hetero_lr_speed --quick                                     # 1024-bit keys, SGD only

writes ``speed.json`` and ``speed.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .hetero_lr_common import run_speed
from .outputs import machine_note, write_json

ROLES = {"0": "guest", "1": "host", "2": "coordinator"}


def markdown(runs: list) -> str:
    lines = ["| optimizer | encryption | online s / epoch | offline s / epoch | total s / epoch | "
             "bytes / epoch: guest, host, coordinator |", "|---|---|---:|---:|---:|---|"]
    for r in runs:
        total = r["online_seconds_per_epoch"] + r["offline_seconds_per_epoch"]
        b = r["bytes_per_epoch_per_party"]
        lines.append(f"| {r['optimizer'].upper()} | {r['encryption']} | {r['online_seconds_per_epoch']:.2f} | "
                     f"{r['offline_seconds_per_epoch']:.2f} | {total:.2f} | "
                     f"{b['0'] / 1e6:.2f} MB, {b['1'] / 1e6:.2f} MB, {b['2'] / 1e6:.3f} MB |")
    lines.append("")
    for opt in sorted({r["optimizer"] for r in runs}):
        plain = [r for r in runs if r["optimizer"] == opt and r["key_bits"] == 0]
        enc = [r for r in runs if r["optimizer"] == opt and r["key_bits"] > 0]
        if plain and enc:
            p, e = plain[0], enc[0]
            lines.append(f"- {opt.upper()}: encrypted / plaintext = {e['online_seconds_per_epoch'] / p['online_seconds_per_epoch']:.1f}x "
                         f"online, {(e['online_seconds_per_epoch'] + e['offline_seconds_per_epoch']) / p['online_seconds_per_epoch']:.1f}x "
                         f"with the obfuscators; bytes {sum(e['bytes_per_epoch_per_party'].values()) / sum(p['bytes_per_epoch_per_party'].values()):.1f}x")
    lines.append("")
    lines.append("Seconds by phase per epoch (encrypted runs):")
    lines.append("")
    for r in runs:
        if r["key_bits"] == 0:
            continue
        for t in r["timings"]:
            sec = ", ".join(f"{k} {v / r['epochs']:.2f}" for k, v in t["seconds"].items())
            lines.append(f"- {r['optimizer'].upper()} {t['role']}: {sec}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--key-bits", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--optimizers", nargs="+", default=["sgd", "sqn"], choices=["sgd", "sqn"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--precompute", default="batch", choices=["batch", "epoch", "background", "none"])
    p.add_argument("--feature-frac-bits", type=int, default=16,
                   help="fractional bits of the features in [[d]]^T X (the exponent length)")
    p.add_argument("--quick", action="store_true", help="1024-bit keys, SGD only")
    p.add_argument("--output-dir", default="results/hetero_lr")
    p.add_argument("--name", default=None, help="file stem of the outputs (default: speed)")
    args = p.parse_args(argv)
    if args.quick:
        args.key_bits, args.optimizers = 1024, ["sgd"]
    runs = run_speed(args.key_bits, args.batch_size, args.optimizers, args.epochs, args.precompute,
                     feature_frac_bits=args.feature_frac_bits)
    record = {"experiment": "hetero-LR: encrypted vs plaintext epoch, Credit 1", "machine": machine_note(),
              "settings": vars(args), "runs": runs}
    out = Path(args.output_dir)
    stem = args.name or "speed"
    write_json(out / f"{stem}.json", record)
    text = markdown(runs)
    (out / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
