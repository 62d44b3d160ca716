"""Row alignment by private set intersection (vfltorch.data.psi): seconds, bytes and memory against the set size.

Each of ``--parties`` real gloo processes holds ``n`` string IDs, half of them
shared by all parties. ``--engine rr22`` (SecretFlow's libpsi, the default when
spu is installed) or ``ecdh``. Reported per n: the wall time of ``align_rows``
(the slowest party), bytes sent through the federation (meter phase
``data/psi``: all of ECDH's traffic; for rr22 only the hellos and the row
order, libpsi's own link reports no byte count), the peak resident memory of
the largest party process (and its size before the alignment: torch and the
IDs), and the ratio to an in-process plain ``set`` intersection of the same IDs
(the insecure baseline). ``--loopback-bytes`` adds every byte sent on the
loopback interface during the alignment (TCP/IP headers included); run it in a
network namespace of its own so that nothing else counts:

    python -m benchmarks.psi --engine rr22 --sizes 10000 100000 1000000 --parties 2
    unshare -n sh -c 'ip link set lo up; python -m benchmarks.psi --engine rr22 --sizes 1000000 --loopback-bytes'
    python -m benchmarks.psi --engine rr22 --sizes 1000000 --tls      # over the TLS mesh, as across organisations

prints one line per size and writes ``psi.json`` to ``--output-dir`` (default ``results/psi``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

from vfltorch.comm import launch
from vfltorch.data import psi


def make_ids(n: int, party: int) -> list[str]:
    shared = [f"customer-{i:09d}" for i in range(n // 2)]
    own = [f"party{party}-only-{i:09d}" for i in range(n - n // 2)]
    return shared + own


def loopback_tx_bytes() -> int:
    """Bytes sent on ``lo`` in this network namespace (/proc/net/dev)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    return 0


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _job(fed, n, engine):
    ids = make_ids(n, fed.parties.index(fed.rank))
    before_mb = _rss_mb()
    fed.barrier()
    lo = loopback_tx_bytes()
    started = time.perf_counter()
    rows, counts = psi.align_rows(fed, ids, engine=engine)
    seconds = time.perf_counter() - started
    fed.barrier()
    return {"seconds": seconds, "aligned": counts["aligned"], "method": counts["method"],
            "loopback_bytes": loopback_tx_bytes() - lo, "rss_before_mb": before_mb,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "bytes_sent": fed.meter.as_dict().get("data/psi", {}).get("bytes_sent", 0)}


def _run_tls(job, parties: int, job_args: tuple) -> list:
    """``job`` in every party of a fresh federation file (keys, pins, 127.0.0.1 addresses) over the TLS mesh."""
    import socket
    import tempfile

    from vfltorch.comm import federation_file
    from vfltorch.comm.identity import generate
    from vfltorch.comm.link import launch_local

    folder = Path(tempfile.mkdtemp(prefix="psi-bench-"))
    keys, entries = {}, []
    for r in range(parties):
        name = f"party{r}"
        ident = generate(name, folder / f"{name}.pem")
        keys[name] = ident.path
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        entries.append(dict(name=name, rank=r, role="active" if r == 0 else "passive",
                            address=f"127.0.0.1:{port}", fingerprint=ident.fingerprint, certificate=f"{name}.crt"))
    federation_file.write(folder / "fed.json", entries, federation="psi-benchmark")
    return launch_local(job, folder / "fed.json", keys, args=job_args, timeout=3600)


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
    ap.add_argument("--engine", choices=psi.ENGINES, default=None,
                    help="rr22 (default when spu is installed) or ecdh")
    ap.add_argument("--tls", action="store_true",
                    help="run the parties over the TLS mesh of a generated federation file on 127.0.0.1 "
                         "(rr22: libpsi's TLS links behind the TLS-only gates), not gloo")
    ap.add_argument("--loopback-bytes", action="store_true",
                    help="also count the bytes sent on lo during the alignment (run in a network namespace)")
    ap.add_argument("--output-dir", default="results/psi")
    args = ap.parse_args(argv)
    engine = args.engine or psi.default_engine()
    print(f"engine {engine}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} cores", flush=True)
    out = []
    for n in args.sizes:
        res = _run_tls(_job, args.parties, (n, engine)) if args.tls else \
            launch(_job, args.parties, args=(n, engine), timeout=3600)
        seconds = max(r["seconds"] for r in res)
        sent = sum(r["bytes_sent"] for r in res)
        base = _plain(n, args.parties)
        row = {"engine": engine, "transport": "tls" if args.tls else "gloo", "method": res[0]["method"], "ids_per_party": n, "parties": args.parties,
               "aligned": res[0]["aligned"], "seconds": seconds,
               "bytes_sent_federation": sent, "peak_rss_mb": max(r["peak_rss_mb"] for r in res),
               "rss_before_mb": max(r["rss_before_mb"] for r in res), "plain_set_seconds": base,
               "ratio_to_plain": seconds / base if base > 0 else float("inf"),
               "load_average": os.getloadavg()}
        if args.loopback_bytes:
            row["loopback_bytes"] = res[0]["loopback_bytes"]
        assert row["aligned"] == n // 2
        wire = f", {row['loopback_bytes'] / 1e6:8.2f} MB on loopback" if args.loopback_bytes else ""
        print(f"n={n:>8} parties={args.parties}{' tls' if args.tls else ''}: {seconds:8.2f} s, {sent / 1e6:8.2f} MB through the federation"
              f"{wire}, peak RSS {row['peak_rss_mb']:.0f} MB (before: {row['rss_before_mb']:.0f} MB), "
              f"{row['ratio_to_plain']:.0f}x a plain set intersection", flush=True)
        out.append(row)
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "psi.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
