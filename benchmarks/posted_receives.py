"""What a receive posted ahead saves: a ping-pong of two parties over gloo, plain against ``Federation.post_recv``.

gloo's send is a rendezvous: the sender's bytes leave once the receiver has posted its buffer. Where the receive
is posted late, both processes' gloo loop threads wake for the handshake; posted ahead, the sender writes at
once in its own thread. Per round trip (two messages) and per process: wall microseconds, and CPU microseconds
of the main thread and of gloo's loop thread (from /proc, Linux only; 10 ms ticks, so use a few thousand trips).
Plain and posted alternate ``--rounds`` times in the same processes (this machine's speed drifts).

    python -m benchmarks.posted_receives --sizes 8 200000 --trips 4000
"""

from __future__ import annotations

import argparse
import os
import time


def _thread_ticks() -> dict:
    """CPU ticks (user + system) of this process's threads, by thread name."""
    out: dict = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def job(fed, sizes, trips, rounds):
    import torch
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    peer = 1 - fed.rank
    rows = []
    for size in sizes:
        out = torch.ones(size, dtype=torch.uint8)
        for _ in range(rounds):
            for mode in ("plain", "posted"):
                fed.barrier()
                before, wall = _thread_ticks(), time.perf_counter()
                if mode == "posted":
                    fed.post_recv(peer, (size,), torch.uint8)
                for i in range(trips):
                    more = mode == "posted" and i + 1 < trips
                    if fed.rank == 0:
                        fed.send(out, 1)
                        fed.recv(1, (size,), torch.uint8)
                        if more:
                            fed.post_recv(1, (size,), torch.uint8)
                    else:
                        fed.recv(0, (size,), torch.uint8)
                        if more:
                            fed.post_recv(0, (size,), torch.uint8)
                        fed.send(out, 0)
                wall = time.perf_counter() - wall
                after = _thread_ticks()
                threads = {n: (after[n] - before.get(n, 0)) * tick_us / trips for n in after}
                rows.append({"size": size, "mode": mode, "wall_us": wall / trips * 1e6,
                             "main_us": sum(v for n, v in threads.items() if not n.startswith("gloo")),
                             "gloo_loop_us": sum(v for n, v in threads.items() if n.startswith("gloo"))})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 200000])
    parser.add_argument("--trips", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from vfltorch.comm import launch
    results = launch(job, 2, (args.sizes, args.trips, args.rounds))
    print("per round trip (two messages), medians over the rounds; CPU per process: main thread, gloo loop thread")
    print("| bytes | receive | wall us | rank 0 main / loop us | rank 1 main / loop us |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        for mode in ("plain", "posted"):
            cells = []
            for rows in results:
                mine = sorted((r for r in rows if r["size"] == size and r["mode"] == mode), key=lambda r: r["wall_us"])
                cells.append(mine[len(mine) // 2])
            print(f"| {size} | {mode} | {cells[0]['wall_us']:.0f} | {cells[0]['main_us']:.0f} / "
                  f"{cells[0]['gloo_loop_us']:.0f} | {cells[1]['main_us']:.0f} / {cells[1]['gloo_loop_us']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
