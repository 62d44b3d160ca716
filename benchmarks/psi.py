"""Row alignment by ECDH-PSI (vfltorch.data.psi): seconds and bytes against the set size.

Each of ``--parties`` real gloo processes holds ``n`` string IDs, half of them
shared by all parties; the points travel in chunks of ``psi.CHUNK``. Reported
per n: the wall time of ``align_rows`` (the slowest party), bytes sent in
total (meter phase ``data/psi``), and the ratio to an in-process plain
``set`` intersection of the same IDs (the insecure baseline).

    python -m benchmarks.psi --sizes 10000 100000 --parties 2

prints one line per size and writes ``psi.json`` to ``--output-dir`` (default ``results/psi``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vfltorch.comm import launch
from vfltorch.data import psi


def make_ids(n: int, party: int) -> list[str]:
    shared = [f"customer-{i:09d}" for i in range(n // 2)]
    own = [f"party{party}-only-{i:09d}" for i in range(n - n // 2)]
    return shared + own


def _job(fed, n):
    ids = make_ids(n, fed.parties.index(fed.rank))
    fed.barrier()
    started = time.perf_counter()
    rows, counts = psi.align_rows(fed, ids)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "aligned": counts["aligned"],
            "bytes_sent": fed.meter.as_dict().get("data/psi", {}).get("bytes_sent", 0)}


def _plain(n: int, parties: int) -> float:
    sets = [make_ids(n, q) for q in range(parties)]
    started = time.perf_counter()
    common = set(sets[0])
    for s in sets[1:]:
        common &= set(s)
    _ = [i for i in sets[0] if i in common]
    return time.perf_counter() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--parties", type=int, default=2)
    ap.add_argument("--output-dir", default="results/psi")
    args = ap.parse_args(argv)
    out = []
    for n in args.sizes:
        res = launch(_job, args.parties, args=(n,), timeout=3600)
        seconds = max(r["seconds"] for r in res)
        sent = sum(r["bytes_sent"] for r in res)
        base = _plain(n, args.parties)
        row = {"ids_per_party": n, "parties": args.parties, "aligned": res[0]["aligned"], "seconds": seconds,
               "bytes_sent": sent, "bytes_per_id": sent / (n * args.parties), "plain_set_seconds": base,
               "ratio_to_plain": seconds / base if base > 0 else float("inf")}
        assert row["aligned"] == n // 2
        print(f"n={n:>8} parties={args.parties}: {seconds:8.2f} s, {sent / 1e6:8.2f} MB sent "
              f"({row['bytes_per_id']:.1f} B/ID), {row['ratio_to_plain']:.0f}x a plain set intersection",
              flush=True)
        out.append(row)
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "psi.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
