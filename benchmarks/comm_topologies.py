"""FDSKL Figure 4: summing per-party linear-kernel matrices by tree, star and ring.

Each party computes K_l = X_l X_l^T on the first n rows of a9a (its own
columns only) and the Q matrices are summed, over real gloo processes on this
machine, by

* the FDSKL pairwise tree (reduce to the root, then the reverse-order broadcast),
* a star (every party sends to the centre, which sends the total back),
* a ring (bandwidth-optimal reduce-scatter + all-gather).

Reported per structure: the wall time of one all-reduce (the slowest party,
median of ``--repeats``), the time until the root holds the sum (reduce
only; the ring's reduce is its all-reduce), and bytes sent in total and by
the busiest party.

    python -m benchmarks.comm_topologies --rows 2000 4000 8000 --parties 2 4 8

writes ``comm_topologies.json``, ``comm_topologies.csv`` and
``comm_topologies.png`` to ``--output-dir`` (default ``results/comm``).

Across simulated hosts (root only): ``--hosts 100mbit 1gbit`` runs every
party in its own network namespace, behind a veth link rate-limited to that
rate in each direction (``tc ... tbf``), over the deployment transport (the
federation file, TLS 1.3 with pinned certificates), and puts the link model
at that rate next to each measured all-reduce::

    python -m benchmarks.comm_topologies --hosts 100mbit 1gbit --rows 1000 --parties 2 4 8 --repeats 2
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from vfltorch.comm import allreduce, build, launch, reduce
from vfltorch.data import available, load_dataset, partition_columns

STRUCTURES = ("tree", "star", "ring")


def _local_kernel(rank: int, parties: int, rows: int, dataset: str) -> torch.Tensor:
    ds = load_dataset(dataset)
    cols = partition_columns(ds.n_features, parties)[rank]
    X = torch.as_tensor(ds.X[:rows][:, cols], dtype=torch.float32)
    return X @ X.T   # the linear kernel on this party's columns


def _party(fed, rows_list, repeats, dataset):
    out = []
    for rows in rows_list:
        K = _local_kernel(fed.rank, fed.num_parties, rows, dataset)
        for name in STRUCTURES:
            topo = build(name, fed.parties)
            for op in ("allreduce", "reduce"):
                times = []
                before = fed.meter.totals()["bytes_sent"]
                for _ in range(repeats):
                    fed.barrier()
                    t0 = time.perf_counter()
                    if op == "allreduce":
                        allreduce(fed, K, topo)
                    else:
                        reduce(fed, K, topo)
                    times.append(time.perf_counter() - t0)
                sent = (fed.meter.totals()["bytes_sent"] - before) // repeats
                out.append(dict(rows=rows, structure=name, op=op, seconds=times, bytes_sent=sent))
    return out


def link_model_seconds(structure: str, q: int, nbytes: int, gbps: float = 1.0) -> float:
    """All-reduce time if every party had its own full-duplex link of ``gbps`` and nothing else cost.

    A model, not a measurement: on one machine all parties share memory
    bandwidth and cores, so loopback times do not show the per-link
    bottleneck that decides the time on a real network. Tree: 2 ceil(log2 Q)
    rounds of one matrix each; star: the centre receives Q - 1 matrices and
    sends Q - 1; ring: 2 (Q - 1) steps of 1/Q of a matrix.
    """
    per_matrix = nbytes * 8 / (gbps * 1e9)
    if q == 1:
        return 0.0
    if structure == "tree":
        return 2 * int(np.ceil(np.log2(q))) * per_matrix
    if structure == "star":
        return 2 * (q - 1) * per_matrix
    if structure == "ring":
        return 2 * (q - 1) / q * per_matrix
    raise ValueError(structure)


def run(rows_list, parties_list, repeats, dataset):
    table = []
    for q in parties_list:
        per_party = launch(_party, q, args=(rows_list, repeats, dataset))
        table += _assemble(per_party, q, repeats, 1.0)
    return table


def _rate_gbps(rate: str) -> float:
    units = {"kbit": 1e-6, "mbit": 1e-3, "gbit": 1.0}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[:-len(u)]) * f
    raise ValueError(f"rate {rate!r}: give e.g. 100mbit or 1gbit")


def _assemble(per_party, q, repeats, gbps, link=None):
    table = []
    for i, entry in enumerate(per_party[0]):
        # One operation's time is that of its slowest party, repeat by repeat.
        slowest = [max(p[i]["seconds"][k] for p in per_party) for k in range(repeats)]
        sent = [p[i]["bytes_sent"] for p in per_party]
        nbytes = entry["rows"] ** 2 * 4
        row = dict(parties=q, rows=entry["rows"], structure=entry["structure"], op=entry["op"],
                   seconds=statistics.median(slowest), bytes_total=int(sum(sent)), bytes_max_party=int(max(sent)),
                   matrix_bytes=nbytes)
        model = link_model_seconds(entry["structure"], q, nbytes, gbps) if entry["op"] == "allreduce" else None
        if link is None:
            row["model_seconds_1gbps"] = model
        else:
            row.update(link=link, model_seconds=model)
        table.append(row)
    return table


def _worker(args):
    """One party inside its namespace: join the federation file, measure, write JSON (never a pickle)."""
    from vfltorch.comm import connect_federation

    fed = connect_federation(args.federation, args.party, args.identity, timeout=600)
    out = _party(fed, args.rows, args.repeats, args.dataset)
    fed.close()
    Path(args.result).write_text(json.dumps(out))


def run_hosts(rows_list, parties_list, repeats, dataset, rates, workdir):
    """The same measurement with every party on its own simulated host (namespaces + tbf links + TLS)."""
    import os
    import subprocess
    import sys
    import tempfile

    from vfltorch.comm import federation_file as ff, netns
    from vfltorch.comm.identity import generate

    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"--hosts: {why}")
    table = []
    for rate in rates:
        for q in parties_list:
            with tempfile.TemporaryDirectory(dir=workdir) as tmp, netns.SimulatedHosts(q, rate=rate) as hosts:
                tmp = Path(tmp)
                parties, keys = [], {}
                for r in range(q):
                    ident = generate(f"p{r}", tmp / f"p{r}.pem")
                    keys[r] = ident.path
                    parties.append(dict(name=f"p{r}", rank=r, role="active" if r == 0 else "passive",
                                        address=f"{hosts.addresses[r]}:29418", fingerprint=ident.fingerprint,
                                        certificate=f"p{r}.crt"))
                ff.write(tmp / "fed.json", parties, federation="bench", max_message_bytes=1 << 31)
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                procs = [subprocess.Popen(hosts.exec_prefix(r) + [
                    sys.executable, "-m", "benchmarks.comm_topologies", "--worker", "--federation", str(tmp / "fed.json"),
                    "--party", f"p{r}", "--identity", str(keys[r]), "--result", str(tmp / f"r{r}.json"),
                    "--rows", *map(str, rows_list), "--repeats", str(repeats), "--dataset", dataset], env=env)
                    for r in range(q)]
                codes = [p.wait() for p in procs]
                if any(codes):
                    raise SystemExit(f"a party failed at Q={q}, {rate}: exit codes {codes}")
                per_party = [json.loads((tmp / f"r{r}.json").read_text()) for r in range(q)]
            rows = _assemble(per_party, q, repeats, _rate_gbps(rate), link=rate)
            table += rows
            for r in rows:   # as it goes: a long run that is cut off still says what it measured
                print(f"  {rate} Q={q} rows={r['rows']} {r['structure']} {r['op']}: {r['seconds']:.3f} s"
                      + ("" if r["model_seconds"] is None else f" (model {r['model_seconds']:.3f} s)"), flush=True)
    return table


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows_list = sorted({r["rows"] for r in table})
    fig, axes = plt.subplots(1, len(rows_list), figsize=(4.2 * len(rows_list), 3.6), squeeze=False)
    for ax, rows in zip(axes[0], rows_list):
        for name, marker in zip(STRUCTURES, "osd"):
            pts = sorted((r["parties"], r["seconds"]) for r in table
                         if r["rows"] == rows and r["structure"] == name and r["op"] == "allreduce")
            ax.plot([p for p, _ in pts], [s for _, s in pts], marker=marker, label=name)
        ax.set_title(f"{rows} x {rows} kernel matrix")
        ax.set_xlabel("parties Q")
        ax.set_ylabel("all-reduce time (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_worker_arguments(p: argparse.ArgumentParser, flag: str, title: str) -> None:
    """The hidden options a benchmark gives the copy of itself it starts as one party on a simulated host."""
    w = p.add_argument_group(title)
    w.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for name in ("--result", "--federation", "--party", "--identity"):
        w.add_argument(name, help=argparse.SUPPRESS)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[2000, 4000])
    p.add_argument("--parties", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dataset", default=None, help="default: a9a if found, else breast_cancer (rows capped)")
    p.add_argument("--output-dir", default="results/comm")
    p.add_argument("--hosts", nargs="+", metavar="RATE",
                   help="run on simulated hosts (network namespaces, root) with links of these rates, e.g. 1gbit")
    add_worker_arguments(p, "--worker", "worker (internal: one party inside its namespace)")
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    dataset = args.dataset or ("a9a" if available("a9a") else "breast_cancer")
    n_max = load_dataset(dataset).X.shape[0]
    rows_list = [min(r, n_max) for r in args.rows]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.hosts:
        table = run_hosts(rows_list, args.parties, args.repeats, dataset, args.hosts, out)
        stem = "comm_topologies_hosts"
        (out / f"{stem}.json").write_text(json.dumps({"dataset": dataset, "repeats": args.repeats,
                                                      "transport": "tls (federation file)", "table": table},
                                                     indent=2))
        print(f"dataset {dataset}; float32 matrices; median of {args.repeats}; time = slowest party; "
              "one namespace per party, tbf-limited links, TLS 1.3")
        print(f"{'link':>7} {'Q':>3} {'rows':>6} {'structure':<6} {'op':<10} {'seconds':>9} {'MB busiest':>11} "
              f"{'model':>8}")
        for r in table:
            model = "" if r["model_seconds"] is None else f"{r['model_seconds']:.3f}"
            print(f"{r['link']:>7} {r['parties']:>3} {r['rows']:>6} {r['structure']:<6} {r['op']:<10} "
                  f"{r['seconds']:>9.3f} {r['bytes_max_party'] / 1e6:>11.1f} {model:>8}")
        print(f"wrote {out}/{stem}.json")
        return None
    table = run(rows_list, args.parties, args.repeats, dataset)
    (out / "comm_topologies.json").write_text(json.dumps({"dataset": dataset, "repeats": args.repeats,
                                                          "table": table}, indent=2))
    with open(out / "comm_topologies.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    plot(table, out / "comm_topologies.png")
    print(f"dataset {dataset}; float32 matrices; median of {args.repeats}; time = slowest party")
    print(f"{'Q':>3} {'rows':>6} {'structure':<6} {'op':<10} {'seconds':>9} {'MB total':>10} {'MB busiest':>11} "
          f"{'model 1Gb/s':>12}")
    for r in table:
        model = "" if r["model_seconds_1gbps"] is None else f"{r['model_seconds_1gbps']:.3f}"
        print(f"{r['parties']:>3} {r['rows']:>6} {r['structure']:<6} {r['op']:<10} {r['seconds']:>9.3f} "
              f"{r['bytes_total'] / 1e6:>10.1f} {r['bytes_max_party'] / 1e6:>11.1f} {model:>12}")
    print(f"wrote {out}/comm_topologies.{{json,csv,png}}")


if __name__ == "__main__":
    main()
