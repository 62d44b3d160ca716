"""What authenticated encryption costs: the same run over gloo (plain TCP) and over the TLS mesh.

Each workload runs as the real command, gloo and TLS paired in each repeat (the order alternates
from one repeat to the next, so that a load that drifts during the benchmark falls on both):

* gloo:  plain TCP, no authentication, no encryption;
* TLS:   one ``vfl METHOD ... --federation fed.json --party NAME --identity KEY`` process per
  party (TLS 1.3, pinned certificates, sequence-numbered frames),

with the same torch threads per process. Reported: the active party's ``train_seconds``
(start-up, joining and data loading excluded), median over repeats, the median of the paired
ratios TLS / gloo, and the load average of the machine around each run.

On loopback (the default) gloo runs through the launcher (``vfl METHOD --parties Q``):

    python -m benchmarks.link_overhead --repeats 3

Across simulated hosts (root; ``vfltorch.comm.netns``): every party in its own network
namespace with its own address, behind a veth link limited by ``tc ... tbf`` to ``--rate`` in
each direction. gloo then runs as torchrun would start it (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` = party 0's address), TLS from a federation file with those addresses:

    python -m benchmarks.link_overhead --netns --rate 1gbit 100mbit --repeats 5

``--stream`` measures the link alone instead: 4 MB float32 tensors from party 0 to party 1
(throughput, CPU seconds at each end) and a 64-byte ping-pong (round trip), gloo and TLS::

    python -m benchmarks.link_overhead --stream --netns --rate 1gbit --repeats 2

Workloads: FDSKL (a9a if found, else breast_cancer; 0.2 epoch; 2 data parties and the dealer of
the default shared protocol) and one epoch of the Paillier-encrypted hetero-LR (``--protocol
paper``, 2048-bit keys, 2 data parties + the key-holding coordinator; credit_default if found;
``--lr-test-fraction`` trains the epoch on fewer rows: a full credit_default epoch takes about
6 minutes on a loaded 2-core machine).
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
import time
from pathlib import Path

from benchmarks.comm_topologies import add_worker_arguments
from vfltorch.comm import federation_file as ff
from vfltorch.comm.identity import Identity, generate
from vfltorch.data import available

PORT_GLOO, PORT_TLS = 29431, 29432   # on simulated hosts every party has its own address


def workloads(dataset_fdskl: str, lr_dataset: str = "breast_cancer", lr_test_fraction: float = 0.25,
              lr_batch: int = 1000) -> dict:
    """name -> (vfl arguments, data parties, coordinator process?)"""
    return {
        "fdskl": (["fdskl", "--dataset", dataset_fdskl, "--epochs", "0.2", "--quiet"], 2, True),
        "hetero-lr epoch": (["hetero-lr", "--protocol", "paper", "--key-bits", "2048", "--dataset", lr_dataset,
                             "--test-fraction", str(lr_test_fraction),
                             "--max-epochs", "1", "--batch-size", str(lr_batch), "--quiet"], 2, True),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(world: int, **extra) -> dict:
    threads = max(1, (os.cpu_count() or 1) // world)
    return {**os.environ, "OMP_NUM_THREADS": str(threads),
            "VFLTORCH_TIMEOUT": os.environ.get("VFLTORCH_TIMEOUT", "600"), **extra}


def _names(parties: int, coordinator: bool) -> list[str]:
    return [f"p{r}" for r in range(parties)] + (["coord"] if coordinator else [])


def _wait(procs, what: str) -> float:
    """Wait for every party; returns the CPU seconds (user + system) they used, start-up included."""
    codes, cpu = [], 0.0
    try:
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            codes.append(p.returncode)
            cpu += usage.ru_utime + usage.ru_stime
    except BaseException:   # Ctrl-C: stop the parties too, before the namespaces go
        for p in procs:
            if p.returncode is None:
                p.terminate()
        raise
    if any(codes):
        raise SystemExit(f"{what}: a party failed, exit codes {codes}")
    return cpu


class Loopback:
    """Every party a process on this host's loopback."""

    label = "loopback"

    def prefix(self, rank: int) -> list[str]:
        return []

    def address(self, rank: int) -> str:
        return "127.0.0.1"

    def gloo(self, argv, parties, coordinator, out: Path) -> float | None:
        subprocess.run([sys.executable, "-m", "vfltorch", *argv, "--parties", str(parties), "--output-json",
                        str(out)], check=True, env=_env(parties + coordinator))
        return None   # the launcher's parties are not its children (fork server): no CPU total here

    def close(self):
        pass


class Hosts(Loopback):
    """Every party on its own simulated host (network namespace, tbf-limited veth link)."""

    def __init__(self, world: int, rate: str):
        from vfltorch.comm import netns

        ok, why = netns.available()
        if not ok:
            raise SystemExit(f"--netns: {why}")
        self.label = f"netns {rate}"
        self.hosts = netns.SimulatedHosts(world, rate=rate).__enter__()

    def prefix(self, rank: int) -> list[str]:
        return self.hosts.exec_prefix(rank)

    def address(self, rank: int) -> str:
        return self.hosts.addresses[rank]

    def gloo(self, argv, parties, coordinator, out: Path) -> float:
        """As torchrun starts a multi-node run, minus the agent: env:// rendezvous at party 0's address."""
        world = parties + coordinator
        procs = []
        for r in range(world):
            env = _env(world, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR=self.address(0), MASTER_PORT=str(PORT_GLOO), GLOO_SOCKET_IFNAME="eth0")
            extra = ["--output-json", str(out)] if r == 0 else []
            procs.append(subprocess.Popen(self.prefix(r) + [sys.executable, "-m", "vfltorch", *argv, *extra],
                                          env=env))
        return _wait(procs, f"gloo on {self.label}")

    def close(self):
        self.hosts.close()


def tls(place, argv, parties, coordinator, out: Path, workdir: Path) -> float:
    names = _names(parties, coordinator)
    entries, keys = [], {}
    for r, name in enumerate(names):
        ident = generate(name, workdir / f"{name}.pem", overwrite=True)
        keys[name] = ident.path
        role = "coordinator" if name == "coord" else ("active" if r == 0 else "passive")
        port = PORT_TLS if isinstance(place, Hosts) else _free_port()
        entries.append(dict(name=name, rank=r, role=role, address=f"{place.address(r)}:{port}",
                            fingerprint=ident.fingerprint, certificate=f"{name}.crt"))
    ff.write(workdir / "fed.json", entries, federation="bench")
    procs = []
    for r, name in enumerate(names):
        extra = ["--output-json", str(out)] if r == 0 else []
        procs.append(subprocess.Popen(place.prefix(r) + [
            sys.executable, "-m", "vfltorch", *argv, "--federation", str(workdir / "fed.json"), "--party", name,
            "--identity", str(keys[name]), *extra], env=_env(len(names))))
    return _wait(procs, f"TLS on {place.label}")


def _timed(run, out: Path) -> tuple[float, float, float | None, str]:
    """(train seconds of the active party, 1-minute load average just before the run, CPU seconds of all parties,
    the backend the run reports)."""
    load = os.getloadavg()[0]
    out.unlink(missing_ok=True)
    cpu = run()
    rec = json.loads(out.read_text())
    return rec["train_seconds"], load, cpu, rec["config"]["backend"]


def measure(place, name, cmd, parties, coordinator, repeats, tmp: Path) -> dict:
    gloo, tls_, loads, cpu = [], [], [], {"gloo": [], "tls": []}
    for k in range(repeats):
        runs = [("gloo", lambda: place.gloo(cmd, parties, coordinator, tmp / "gloo.json"), tmp / "gloo.json"),
                ("tls", lambda: tls(place, cmd, parties, coordinator, tmp / "tls.json", tmp), tmp / "tls.json")]
        if k % 2:
            runs.reverse()   # paired and alternating: gloo first, then TLS first, ...
        got = {}
        for kind, run, out in runs:
            got[kind], load, used, backend = _timed(run, out)
            if backend != kind:
                raise SystemExit(f"the {kind} run reports backend {backend!r}")
            loads.append(load)
            cpu[kind].append(used)
        gloo.append(got["gloo"])
        tls_.append(got["tls"])
        used = "" if cpu["gloo"][-1] is None else f", CPU {cpu['gloo'][-1]:.1f} / {cpu['tls'][-1]:.1f} s"
        print(f"  {place.label} {name} repeat {k + 1}: gloo {got['gloo']:.2f} s, TLS {got['tls']:.2f} s "
              f"(x{got['tls'] / got['gloo']:.2f}){used}, load {loads[-2]:.1f}/{loads[-1]:.1f}", flush=True)
    ratios = [t / g for g, t in zip(gloo, tls_)]
    extra_cpu = (statistics.median(t - g for g, t in zip(cpu["gloo"], cpu["tls"]))
                 if None not in cpu["gloo"] + cpu["tls"] else None)
    return dict(workload=name, place=place.label, command=" ".join(cmd), gloo_seconds=gloo, tls_seconds=tls_,
                cpu_seconds=cpu, extra_cpu_median=extra_cpu, gloo_median=statistics.median(gloo),
                tls_median=statistics.median(tls_),
                ratio=statistics.median(ratios), ratios=ratios, load_min=min(loads), load_max=max(loads),
                load_median=statistics.median(loads))


# ------------------------------------------------------------------------------------ --stream
STREAM_MB, STREAM_COUNT, PINGS = 4, 40, 300


def _stream(fed) -> dict:
    """Party 0 streams tensors to party 1, then they ping-pong a small one (run by both transports)."""
    import torch

    big, small = torch.randn(STREAM_MB << 18), torch.zeros(16)
    fed.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(STREAM_COUNT):
        if fed.rank == 0:
            fed.send(big, 1)
        else:
            fed.recv(0, big.shape, big.dtype)
    fed.barrier()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rtt = []
    for _ in range(PINGS):
        t0 = time.perf_counter()
        if fed.rank == 0:
            fed.send(small, 1)
            fed.recv(1, small.shape, small.dtype)
        else:
            fed.recv(0, small.shape, small.dtype)
            fed.send(small, 0)
        rtt.append(time.perf_counter() - t0)
    nbytes = STREAM_COUNT * big.numel() * 4
    return dict(mb_per_s=nbytes / 1e6 / seconds, cpu_seconds=cpu, cpu_ns_per_byte=cpu * 1e9 / nbytes,
                rtt_median_us=statistics.median(rtt) * 1e6)


def _stream_worker(args) -> None:
    from vfltorch.comm import connect_federation, init_from_env

    if args.federation:
        fed = connect_federation(args.federation, args.party, args.identity, timeout=300)
    else:
        fed = init_from_env(timeout=300)
    out = _stream(fed)
    fed.close()
    Path(args.result).write_text(json.dumps(out))


def stream(place, repeats: int, tmp: Path) -> list[dict]:
    rows = []
    keys = {r: generate(f"p{r}", tmp / f"p{r}.pem", overwrite=True).path for r in range(2)}
    for k in range(repeats):
        for kind in (("gloo", "tls") if k % 2 == 0 else ("tls", "gloo")):
            if kind == "tls":
                ports = [PORT_TLS if isinstance(place, Hosts) else _free_port() for _ in range(2)]
                ff.write(tmp / "fed.json", [dict(name=f"p{r}", rank=r, role="active" if r == 0 else "passive",
                                                 address=f"{place.address(r)}:{ports[r]}",
                                                 fingerprint=Identity.load(keys[r]).fingerprint,
                                                 certificate=f"p{r}.crt") for r in range(2)], federation="stream")
            port = PORT_GLOO if isinstance(place, Hosts) else _free_port()
            load, procs = os.getloadavg()[0], []
            for r in range(2):
                env = _env(2) if kind == "tls" else _env(
                    2, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=place.address(0), MASTER_PORT=str(port),
                    **({"GLOO_SOCKET_IFNAME": "eth0"} if isinstance(place, Hosts) else {}))
                extra = ["--federation", str(tmp / "fed.json"), "--party", f"p{r}", "--identity", str(keys[r])] \
                    if kind == "tls" else []
                procs.append(subprocess.Popen(place.prefix(r) + [
                    sys.executable, "-m", "benchmarks.link_overhead", "--stream-worker", "--result",
                    str(tmp / f"s{r}.json"), *extra], env=env))
            _wait(procs, f"{kind} stream on {place.label}")
            send, recv = (json.loads((tmp / f"s{r}.json").read_text()) for r in range(2))
            rows.append(dict(place=place.label, transport=kind, repeat=k + 1, load=load, mb_per_s=recv["mb_per_s"],
                             send_ns_per_byte=send["cpu_ns_per_byte"], recv_ns_per_byte=recv["cpu_ns_per_byte"],
                             rtt_median_us=send["rtt_median_us"]))
            r = rows[-1]
            print(f"  {place.label} {kind:<4} repeat {k + 1}: {r['mb_per_s']:6.0f} MB/s, CPU ns/byte send "
                  f"{r['send_ns_per_byte']:.2f} receive {r['recv_ns_per_byte']:.2f}, ping-pong "
                  f"{r['rtt_median_us']:.0f} us, load {load:.1f}", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="+", help="run only these workloads (fdskl, 'hetero-lr epoch')")
    p.add_argument("--fdskl-dataset", default=None, help="default: a9a if found, else breast_cancer")
    p.add_argument("--lr-dataset", default=None, help="hetero-LR data (default: credit_default if found, "
                   "else breast_cancer)")
    p.add_argument("--lr-test-fraction", type=float, default=0.25,
                   help="hetero-LR held-out fraction: raise it to train the epoch on fewer rows")
    p.add_argument("--lr-batch-size", type=int, default=1000)
    p.add_argument("--netns", action="store_true",
                   help="every party on its own simulated host (network namespaces; root)")
    p.add_argument("--rate", nargs="+", default=["1gbit"], help="with --netns: link rates, e.g. 1gbit 100mbit")
    p.add_argument("--stream", action="store_true", help="the link alone: tensor stream and ping-pong, 2 parties")
    p.add_argument("--output-dir", default="results/comm")
    add_worker_arguments(p, "--stream-worker", "worker (internal: one party of --stream)")
    args = p.parse_args(argv)
    if args.stream_worker:
        return _stream_worker(args)
    if args.stream:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for rate in (args.rate if args.netns else [None]):
                place = Hosts(2, rate) if rate else Loopback()
                try:
                    rows += stream(place, args.repeats, Path(tmp))
                finally:
                    place.close()
        (out / "link_stream.json").write_text(json.dumps({"rows": rows, "mb": STREAM_MB, "count": STREAM_COUNT,
                                                          "cpus": os.cpu_count()}, indent=2))
        print(f"wrote {out}/link_stream.json")
        return None
    dataset = args.fdskl_dataset or ("a9a" if available("a9a") else "breast_cancer")
    lr_dataset = args.lr_dataset or ("credit_default" if available("credit_default") else "breast_cancer")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen = {k: v for k, v in workloads(dataset, lr_dataset, args.lr_test_fraction, args.lr_batch_size).items()
              if not args.only or k in args.only}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rate in (args.rate if args.netns else [None]):
            for name, (cmd, parties, coord) in chosen.items():
                place = Hosts(parties + coord, rate) if rate else Loopback()
                try:
                    rows.append(measure(place, name, cmd, parties, coord, args.repeats, tmp))
                finally:
                    place.close()
    stem = "link_overhead_netns" if args.netns else "link_overhead"
    (out / f"{stem}.json").write_text(json.dumps({"repeats": args.repeats, "cpus": os.cpu_count(), "rows": rows,
                                                  "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
    print(f"train seconds of the active party, median of {args.repeats}; ratio = median of the paired "
          f"TLS/gloo ratios; same threads per process; {os.cpu_count()} cpus")
    print("extra CPU = median over repeats of (CPU seconds of all TLS parties - of all gloo parties), start-up "
          "included (netns only)")
    print(f"{'where':<14} {'workload':<16} {'gloo':>8} {'TLS':>8} {'TLS/gloo':>9} {'extra CPU s':>12} "
          f"{'load (min-max)':>15}")
    for r in rows:
        extra = "" if r["extra_cpu_median"] is None else f"{r['extra_cpu_median']:.2f}"
        print(f"{r['place']:<14} {r['workload']:<16} {r['gloo_median']:>8.2f} {r['tls_median']:>8.2f} "
              f"{r['ratio']:>9.2f} {extra:>12} {r['load_min']:>7.1f}-{r['load_max']:<7.1f}")
    print(f"wrote {out}/{stem}.json")


if __name__ == "__main__":
    main()
