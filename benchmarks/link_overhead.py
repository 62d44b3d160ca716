"""What authenticated encryption costs: the same run over gloo (plain TCP) and over the TLS mesh.

Each workload runs as the real command twice per repeat, alternating, on loopback:

* gloo:  ``vfl METHOD ... --parties Q`` (the launcher's local processes, plain TCP),
* TLS:   one ``vfl METHOD ... --federation fed.json --party NAME --identity KEY`` process per
  party (TLS 1.3, pinned certificates, sequence-numbered frames),

with the same torch threads per process, and reports the active party's ``train_seconds``
(start-up and data loading excluded), median over repeats, and the ratio TLS / gloo.

    python -m benchmarks.link_overhead --repeats 3

Workloads: FDSKL (a9a if found, else breast_cancer; 0.2 epoch) and one epoch of the Paillier
hetero-LR (2 data parties + coordinator). Loopback has no bandwidth limit, so the ratio is an
upper bound on what TLS adds on a real 1 Gbit/s link, where the wire time grows and the
encryption cost does not.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from vfltorch.comm import federation_file as ff
from vfltorch.comm.identity import generate
from vfltorch.data import available


def workloads(dataset_fdskl: str) -> dict:
    return {
        "fdskl": (["fdskl", "--dataset", dataset_fdskl, "--epochs", "0.2", "--quiet"], 2, False),
        "hetero-lr epoch": (["hetero-lr", "--dataset", "breast_cancer", "--max-epochs", "1", "--batch-size", "100",
                                            "--quiet"], 2, True),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(world: int) -> dict:
    threads = max(1, (os.cpu_count() or 1) // world)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "VFLTORCH_TIMEOUT": os.environ.get("VFLTORCH_TIMEOUT", "300")}


def run_gloo(argv, parties, coordinator, out: Path) -> float:
    subprocess.run([sys.executable, "-m", "vfltorch", *argv, "--parties", str(parties), "--output-json", str(out)],
                   check=True, env=_env(parties + coordinator))
    return json.loads(out.read_text())["train_seconds"]


def run_tls(argv, parties, coordinator, out: Path, workdir: Path) -> float:
    names = [f"p{r}" for r in range(parties)] + (["coord"] if coordinator else [])
    entries, keys = [], {}
    for r, name in enumerate(names):
        ident = generate(name, workdir / f"{name}.pem", overwrite=True)
        keys[name] = ident.path
        role = "coordinator" if name == "coord" else ("active" if r == 0 else "passive")
        entries.append(dict(name=name, rank=r, role=role, address=f"127.0.0.1:{_free_port()}",
                            fingerprint=ident.fingerprint, certificate=f"{name}.crt"))
    ff.write(workdir / "fed.json", entries, federation="bench")
    procs = []
    for r, name in enumerate(names):
        extra = ["--output-json", str(out)] if r == 0 else []
        procs.append(subprocess.Popen([sys.executable, "-m", "vfltorch", *argv, "--federation",
                                       str(workdir / "fed.json"), "--party", name, "--identity", str(keys[name]),
                                       *extra], env=_env(len(names))))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a TLS party failed: exit codes {codes}")
    return json.loads(out.read_text())["train_seconds"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="+", help="run only these workloads (fdskl, 'hetero-lr epoch')")
    p.add_argument("--fdskl-dataset", default=None, help="default: a9a if found, else breast_cancer")
    p.add_argument("--output-dir", default="results/comm")
    args = p.parse_args(argv)
    dataset = args.fdskl_dataset or ("a9a" if available("a9a") else "breast_cancer")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, (cmd, parties, coord) in workloads(dataset).items():
            if args.only and name not in args.only:
                continue
            gloo, tls = [], []
            for _ in range(args.repeats):
                gloo.append(run_gloo(cmd, parties, coord, tmp / "gloo.json"))
                tls.append(run_tls(cmd, parties, coord, tmp / "tls.json", tmp))
            g, t = statistics.median(gloo), statistics.median(tls)
            rows.append(dict(workload=name, command=" ".join(cmd), gloo_seconds=gloo, tls_seconds=tls,
                             gloo_median=g, tls_median=t, ratio=t / g))
    (out / "link_overhead.json").write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2))
    print(f"train seconds, median of {args.repeats}; loopback; same threads per process")
    print(f"{'workload':<18} {'gloo':>8} {'TLS':>8} {'TLS/gloo':>9}")
    for r in rows:
        print(f"{r['workload']:<18} {r['gloo_median']:>8.2f} {r['tls_median']:>8.2f} {r['ratio']:>9.2f}")
    print(f"wrote {out}/link_overhead.json")


if __name__ == "__main__":
    main()
