"""Start-up of the `vfl` command: help, option errors and a whole small run, in seconds and as a ratio to
`python -c pass` measured the same way (a fresh interpreter each time, best of --repeat).

    python -m benchmarks.startup                 # help, option errors, 3 runs of the demo
    python -m benchmarks.startup --runs 0        # only help and option errors
    python -m benchmarks.startup --json out.json
    python -m benchmarks.startup --runs 4 --compare /tmp/old-checkout   # demo walls, old and this tree interleaved

For the demo (`vfl fdskl --dataset breast_cancer --parties 3`, what `make demo` runs) it splits the wall
time into the launcher's start-up (before any party starts), the parties' start (spawn, imports, joining
the federation), loading the data, training, and the rest (reporting, shutting down), from the run's JSON
record and the launcher's own timestamps (VFLTORCH_PROFILE_STARTUP=FILE), and gives the CPU seconds of every
process of the run (the launcher, the fork server and all it started), which a loaded machine disturbs far
less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CASES = [
    ("python -c pass", [sys.executable, "-c", "pass"], 0),
    ("vfl --help", [sys.executable, "-m", "vfltorch", "--help"], 0),
    ("vfl fdskl --help", [sys.executable, "-m", "vfltorch", "fdskl", "--help"], 0),
    ("vfl dpscd --help", [sys.executable, "-m", "vfltorch", "dpscd", "--help"], 0),
    ("vfl inspect --timeout 0", [sys.executable, "-m", "vfltorch", "inspect", "--timeout", "0"], 2),
    ("vfl fdskl --dataset nope", [sys.executable, "-m", "vfltorch", "fdskl", "--dataset", "nope"], 2),
    ("vfl pca --parties 40", [sys.executable, "-m", "vfltorch", "pca", "--parties", "40"], 2),
    ("vfl hetero-lr --lr 0", [sys.executable, "-m", "vfltorch", "hetero-lr", "--lr", "0"], 2),
    ("vfl pca --components 0", [sys.executable, "-m", "vfltorch", "pca", "--components", "0"], 2),
    ("vfl dpscd --epochs -1", [sys.executable, "-m", "vfltorch", "dpscd", "--epochs", "-1"], 2),
    ("vfl hetero-lr --key-bits 512", [sys.executable, "-m", "vfltorch", "hetero-lr", "--key-bits", "512"], 2),
]
DEMO = ["fdskl", "--dataset", "breast_cancer", "--parties", "3", "--quiet"]


def best_of(cmd, expect: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if r.returncode != expect:
            raise SystemExit(f"{' '.join(cmd)}: exit code {r.returncode}, expected {expect}\n{r.stderr}")
    return min(times)


def _adopt_orphans() -> None:
    """Become the subreaper of what the runs leave (the fork server outlives `vfl` by a moment): their CPU time
    then reaches this process's RUSAGE_CHILDREN once reaped (``_reap``). Linux only; elsewhere cpu is partial."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)          # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap(limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def demo_run(extra: list[str], tree: str | None = None) -> dict:
    """One demo run; ``tree``: run the vfltorch of that source tree instead of this one (on PYTHONPATH)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        profile = os.path.join(d, "profile.txt")
        env = {**os.environ, "VFLTORCH_PROFILE_STARTUP": profile}
        if tree is not None:
            env["PYTHONPATH"] = os.path.abspath(tree)
        _reap()
        cpu0 = _children_cpu()
        t0, t = time.time(), time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "vfltorch", *DEMO, *extra, "--output-json", out],
                           capture_output=True, text=True, env=env, cwd=tree)
        wall = time.perf_counter() - t
        _reap()                                  # the fork server and what it started: their CPU counts too
        cpu = _children_cpu() - cpu0
        if r.returncode != 0:
            raise SystemExit(f"demo run failed:\n{r.stderr}")
        record = json.load(open(out))
        marks = {}
        for line in open(profile):
            event, when = line.split()
            marks[event] = float(when) - t0
    spawn = marks["spawn"]
    joined = max(v for k, v in marks.items() if k.endswith("_joined"))    # the last party to join
    return {"load_avg": os.getloadavg()[0], "cpu": cpu, "wall": wall,
            "to_server": marks.get("server_start", float("nan")),      # when vfl started the parties' fork server
            "launcher_before_parties": spawn, "party_start": joined - spawn,
            "load": record["load_seconds"], "train": record["train_seconds"],
            "rest": wall - joined - record["load_seconds"] - record["train_seconds"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="fresh interpreters per case (best is kept)")
    ap.add_argument("--runs", type=int, default=3, help="demo runs (each reported)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--compare", metavar="TREE", help="another source tree (e.g. `git archive REV | tar -x -C DIR`): "
                    "run its demo and this tree's in turn, --runs times each, order alternating")
    ap.add_argument("--demo-only", action="store_true", help="skip help and option errors")
    args = ap.parse_args(argv)
    _adopt_orphans()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    figures = {}
    if not args.demo_only:
        base = best_of(CASES[0][1], 0, args.repeat)
        figures["python -c pass"] = base
        print(f"{'command':34s} {'seconds':>8s} {'x python -c pass':>17s}")
        for name, cmd, expect in CASES:
            s = base if name == "python -c pass" else best_of(cmd, expect, args.repeat)
            figures[name] = s
            print(f"{name:34s} {s:8.3f} {s / base:17.1f}")
    if args.compare:
        return compare(args, figures)
    runs = [demo_run([]) for _ in range(args.runs)]
    if runs:
        print(f"\n`vfl {' '.join(DEMO)}` ({args.runs} runs, seconds)")
        keys = ["wall", "to_server", "launcher_before_parties", "party_start", "load", "train", "rest", "cpu",
                "load_avg"]
        print("  ".join(f"{k:>23s}" if k == "launcher_before_parties" else f"{k:>9s}" for k in keys))
        for r in runs:
            print("  ".join(f"{r[k]:23.2f}" if k == "launcher_before_parties" else f"{r[k]:9.2f}" for k in keys))
        figures["demo_runs"] = runs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


def compare(args, figures: dict) -> int:
    """The demo from ``--compare TREE`` and from this tree, interleaved (ABBA...), with the load average."""
    keys = ["wall", "to_server", "launcher_before_parties", "party_start", "load", "train", "rest", "cpu",
            "load_avg"]
    rows = {"before": [], "after": []}
    print(f"\n`vfl {' '.join(DEMO)}`, {args.compare} (before) and this tree (after) interleaved, seconds")
    print(f"{'':7s}" + "  ".join(f"{k:>23s}" if k == "launcher_before_parties" else f"{k:>9s}" for k in keys))
    for i in range(args.runs):
        for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
            r = demo_run([], args.compare if which == "before" else None)
            rows[which].append(r)
            print(f"{which:7s}" + "  ".join(f"{r[k]:23.2f}" if k == "launcher_before_parties" else f"{r[k]:9.2f}"
                                            for k in keys), flush=True)
    for which, rs in rows.items():
        walls = sorted(r["wall"] for r in rs)
        cpus = sorted(r["cpu"] for r in rs)
        print(f"{which}: wall median {walls[len(walls) // 2]:.2f} s, best {walls[0]:.2f} s; CPU (all processes) "
              f"median {cpus[len(cpus) // 2]:.2f} s; "
              f"load average {min(r['load_avg'] for r in rs):.1f}-{max(r['load_avg'] for r in rs):.1f}")
    figures["compare"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
