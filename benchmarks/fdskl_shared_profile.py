"""Where one iteration of FDSKL's default (bounded, ``shared``) training spends its bytes and seconds.

Runs ``FDSKLClassifier`` at its defaults (D = 1024, B = n / 128, Adam) on Q parties plus the dealer
for a few iterations, with timers around each step of ``budget.train_budget`` at every rank, and
reports per rank: wall seconds per iteration in each step (the active party's wall time is the
critical path), process CPU seconds per iteration, and bytes sent per iteration by sub-phase
(``fdskl/train/deal``: the dealer's seeds and corrections; ``star-sum``: the phases;
``forward`` / ``gradient``: the two products and their openings; ``products``: the same, pipelined, where
they ride on one message each way: ``operand`` / ``share`` / ``open`` time their steps). ``--protocol paper`` profiles
the paper's protocol the same way (phases and the active party's local products).

    python -m benchmarks.fdskl_shared_profile --dataset credit_default --parties 4 --iterations 20

Steady state (issue 11's second CPU round): ``--sigma-grid 1`` skips the width selection (one multiplier,
nothing to choose), and the last table gives each process's wall and CPU milliseconds per iteration from the
end of iteration 20 to the last one (set-up excluded), and their CPU sum: three processes on two cores, so
wall time follows that sum.

    python -m benchmarks.fdskl_shared_profile --dataset phishing --parties 2 --iterations 300 --sigma-grid 1

The critical path (``--timeline``): per process and steady iteration, the work before each blocking message (wall
and CPU) and the wall inside its call, in the order of the iteration; one process's wait is another's work.
``--log-every N`` sets the log points (each a synchronisation of every process, the dealer included).
At ``f_delay`` 0 ``phases local`` / ``phases send`` time the star's two parts (the local part of round t + 1 is
made during round t's ``forward begin`` / ``forward end``).

    python -m benchmarks.fdskl_shared_profile --dataset phishing --parties 2 --iterations 300 --sigma-grid 1 \
        --timeline --log-every 1000
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections import defaultdict


def _timed(store, name, fn):
    def wrapper(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            store[name][0] += time.perf_counter() - w
            store[name][1] += time.process_time() - c
    return wrapper


def _waits(store, name, fn):
    """Wall seconds a rank spends inside ``fn`` (a blocking send or recv) during training, by peer."""
    def wrapper(fed, tensor_or_src, *args, **kwargs):
        if not fed.current_phase.startswith("fdskl/train"):
            return fn(fed, tensor_or_src, *args, **kwargs)
        peer = tensor_or_src if name == "recv" else args[0] if args else kwargs.get("dst")
        w = time.perf_counter()
        try:
            return fn(fed, tensor_or_src, *args, **kwargs)
        finally:
            store[f"{name} {'<-' if name == 'recv' else '->'} {peer}"][0] += time.perf_counter() - w
    return wrapper


def _events(log, kind, fn):
    """Each blocking send / recv (and the start of each send_nowait) during training: (kind, peer, phase, bytes,
    start, end) on the machine's monotonic clock (the same in every process), for ``--timeline``."""
    def wrapper(fed, tensor_or_src, *args, **kwargs):
        if not fed.current_phase.startswith("fdskl/train"):
            return fn(fed, tensor_or_src, *args, **kwargs)
        peer = tensor_or_src if kind == "recv" else args[0] if args else kwargs.get("dst")
        w, c = time.perf_counter(), time.process_time()
        out = fn(fed, tensor_or_src, *args, **kwargs)
        size = out if kind == "recv" else tensor_or_src
        log.append((kind, int(peer), fed.current_phase[len("fdskl/train"):], size.numel() * size.element_size(),
                    w, time.perf_counter(), c, time.process_time()))
        return out
    return wrapper


STEADY_FROM = 20        # steady state: CPU and wall between the end of this training iteration and the last one


def job(fed, dataset, protocol, iterations, f_delay="auto", sigma_grid=None, timeline=False, log_every=None):
    from vfltorch.data import DataConfig, load_party_data
    from vfltorch.kernels import FDSKLClassifier
    from vfltorch.kernels import budget
    from vfltorch.kernels.protocol import FederatedFeatureMap
    from vfltorch.kernels.trainer import BatchSampler, TrainingLoop

    warnings.simplefilter("ignore")
    store = defaultdict(lambda: [0.0, 0.0])
    # The star: in one call (before the split), or its local part (made a round ahead at f_delay 0) and its messages.
    for name, step in (("star_phases", "phases"), ("star_local", "phases local"), ("star_send", "phases send")):
        if hasattr(budget, name):
            setattr(budget, name, _timed(store, step, getattr(budget, name)))
    FederatedFeatureMap.phases = _timed(store, "phases", FederatedFeatureMap.phases)
    P = budget.StarProducts
    P.__init__ = _timed(store, "deal", P.__init__)
    P.forward = _timed(store, "forward", P.forward)
    for name in ("forward_begin", "forward_end"):         # f_delay 0's forward in two halves (round t + 1 between)
        if hasattr(P, name):
            setattr(P, name, _timed(store, name.replace("_", " "), getattr(P, name)))
    P.gradient = _timed(store, "gradient", P.gradient)
    # The pipelined iteration (f_delay 1, the default) uses the split form of the two products.
    P.operand = _timed(store, "operand", P.operand)
    P.share = _timed(store, "share", P.share)
    P.open = _timed(store, "open", P.open)
    budget._Optimizer.step = _timed(store, "adam step", budget._Optimizer.step)
    # Steady state: (wall, CPU) of this process at the end of every training iteration (every rank ticks,
    # the dealer too); the width selection's loops tick as well, so only the last fit's ticks are kept.
    ticks = []
    tick = TrainingLoop.tick

    def timed_tick(self, started):
        tick(self, started)
        ticks.append((time.perf_counter(), time.process_time()))
    TrainingLoop.tick = timed_tick
    init = TrainingLoop.__init__

    def fresh_loop(self, *args, **kwargs):
        init(self, *args, **kwargs)
        ticks.clear()
    TrainingLoop.__init__ = fresh_loop
    from vfltorch.comm import Federation
    log = []
    if timeline:
        Federation.send = _events(log, "send", Federation.send)
        Federation.recv = _events(log, "recv", Federation.recv)
        Federation.send_nowait = _events(log, "nowait", Federation.send_nowait)
    Federation.send = _waits(store, "send", Federation.send)
    Federation.recv = _waits(store, "recv", Federation.recv)
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="minmax", seed=0)) if fed.is_data_party else None
    n = data.X_train.shape[0] if data is not None else None
    n = fed.broadcast_json(n, fed.active)
    per_epoch = BatchSampler(n, min(256, max(32, n // 128)), 0).per_epoch
    grid = {} if sigma_grid is None else {"sigma_grid": tuple(sigma_grid)}
    if log_every is not None:
        grid["log_every"] = log_every
    est = FDSKLClassifier(fed, protocol=protocol, epochs=iterations / per_epoch, compress_to=None,   # training only
                          f_delay=f_delay, **grid)
    wall, cpu = time.perf_counter(), time.process_time()
    if data is None:
        est.fit(None)
    else:
        est.fit(data.X_train, data.y_train, columns=data.columns)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    meter = {k: v for k, v in fed.meter.as_dict().items() if k.startswith("fdskl/train")}
    return {"rank": fed.rank, "role": "active" if fed.is_active else ("dealer" if fed.is_coordinator else "passive"),
            "iterations": est.n_iter_, "train_seconds": est.train_seconds_, "fit_wall": wall, "fit_cpu": cpu,
            "steady": _steady(ticks), "timeline": _timeline(ticks, log) if timeline else None,
            "steps": {k: v for k, v in store.items()}, "meter": meter}


def _steady(ticks):
    """(iterations, wall ms / it, CPU ms / it) from the end of iteration STEADY_FROM to the last one."""
    if len(ticks) <= STEADY_FROM + 1:
        return None
    (w0, c0), (w1, c1) = ticks[STEADY_FROM - 1], ticks[-1]
    k = len(ticks) - STEADY_FROM
    return k, (w1 - w0) / k * 1000, (c1 - c0) / k * 1000


def _label(kind, peer, phase, nbytes, dealer):
    if peer == dealer:
        return f"{kind} {'->' if kind != 'recv' else '<-'} {peer} {phase}"
    return f"{kind} {'->' if kind != 'recv' else '<-'} {peer} {phase} {nbytes} B"


def _timeline(ticks, log):
    """Per steady iteration, the segments of this process's wall time in order: the work before each message
    ("work", and its CPU) and the time inside the message's call ("in"), by message; returns (label, position,
    work ms, in ms, count, work CPU ms) averaged per iteration (position: the median index of the message in its
    iteration). Work wall above work CPU is time the process was ready but not running (other processes)."""
    if len(ticks) <= STEADY_FROM + 1:
        return None
    ends = [w for w, _ in ticks]
    rows = defaultdict(lambda: [0.0, 0.0, 0, [], 0.0])
    k = len(ticks) - STEADY_FROM
    it, prev, index = STEADY_FROM, ends[STEADY_FROM - 1], 0
    prev_cpu = ticks[STEADY_FROM - 1][1]
    for kind, peer, phase, nbytes, start, end, cpu_start, cpu_end in log:
        if start < ends[STEADY_FROM - 1]:
            continue
        while it < len(ends) and start >= ends[it]:
            prev, prev_cpu, it, index = ends[it], ticks[it][1], it + 1, 0
        if it >= len(ends):
            break
        label = (kind, peer, phase, nbytes)
        row = rows[label]
        row[0] += max(0.0, start - prev)
        row[1] += end - start
        row[2] += 1
        row[3].append(index)
        row[4] += max(0.0, cpu_start - prev_cpu)
        prev, prev_cpu, index = end, cpu_end, index + 1
    out = []
    for label, (work, inside, count, idx, work_cpu) in rows.items():
        idx.sort()
        out.append((label, idx[len(idx) // 2], work / k * 1000, inside / k * 1000, count / k, work_cpu / k * 1000))
    out.sort(key=lambda r: (r[1], -r[4]))
    return out


def main(argv=None) -> int:
    from vfltorch.comm import launch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="credit_default")
    ap.add_argument("--parties", type=int, default=4)
    ap.add_argument("--protocol", default="shared", choices=["shared", "paper"])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--f-delay", default="auto", choices=["auto", "0", "1"],
                    help="f from the coefficients before the last step (1: pipelined, opt-in) or not (0: the default)")
    ap.add_argument("--sigma-grid", type=float, nargs="+", default=None,
                    help="the width multipliers tried (default the estimator's; one value, e.g. 1, skips the "
                         "selection, so that the whole fit is the training run)")
    ap.add_argument("--timeline", action="store_true",
                    help="also report, per process and steady iteration, the work before each message and the time "
                         "inside its call (the critical path: a process's wait is another's work)")
    ap.add_argument("--log-every", type=int, default=None,
                    help="iterations between log points (default the estimator's: about 50 per run; they send nothing "
                         "since issue 11's curve round, so they no longer synchronise the dealer)")
    args = ap.parse_args(argv)
    delay = args.f_delay if args.f_delay == "auto" else int(args.f_delay)
    out = launch(job, args.parties, (args.dataset, args.protocol, args.iterations, delay, args.sigma_grid,
                                                args.timeline, args.log_every),
                 coordinator=args.protocol == "shared")
    it = max(r["iterations"] for r in out)
    print(f"{args.dataset}, Q = {args.parties}, protocol {args.protocol}, {it} iterations; "
          f"active party's training clock {out[0]['train_seconds'] / it * 1000:.1f} ms per iteration")
    print("rank role     step         wall ms/it  cpu ms/it   (send -> p / recv <- p: wall inside the "
          "blocking call during training, i.e. waiting for the peer)")
    for r in out:
        for step, (w, c) in sorted(r["steps"].items()):
            print(f"{r['rank']:4d} {r['role']:8s} {step:12s} {w / it * 1000:10.1f} {c / it * 1000:10.1f}")
        print(f"{r['rank']:4d} {r['role']:8s} {'fit (all)':12s} {r['fit_wall'] / it * 1000:10.1f} "
              f"{r['fit_cpu'] / it * 1000:10.1f}")
    print(f"steady state (iterations {STEADY_FROM + 1} to the last), per process: wall and CPU ms per iteration")
    total = 0.0
    for r in out:
        if r["steady"] is not None:
            k, w, c = r["steady"]
            total += c
            print(f"{r['rank']:4d} {r['role']:8s} {k:5d} it {w:8.2f} wall {c:8.2f} cpu")
    print(f"     CPU sum {total:8.2f} ms per iteration")
    print("bytes and messages (each a blocking send: a rendezvous of two processes) per iteration by sub-phase,"
          " all ranks:")
    phases, messages = defaultdict(int), defaultdict(int)
    for r in out:
        for k, v in r["meter"].items():
            phases[k] += v.get("bytes_sent", 0)
            messages[k] += v.get("messages_sent", 0)
    for k, v in sorted(phases.items()):
        print(f"  {k:28s} {v / it:12.0f} {messages[k] / it:8.2f}")
    print(f"  {'total':28s} {sum(phases.values()) / it:12.0f} {sum(messages.values()) / it:8.2f}")
    if args.timeline:
        dealer = args.parties if args.protocol == "shared" else None
        print("timeline per steady iteration (ms): the work before each message, then the time inside its call; "
              "messages per iteration (dealer messages merged)")
        for r in out:
            if r["timeline"] is None:
                continue
            merged = {}
            for (kind, peer, phase, nbytes), pos, work, inside, count, work_cpu in r["timeline"]:
                key = _label(kind, peer, phase, nbytes, dealer)
                m = merged.setdefault(key, [pos, 0.0, 0.0, 0.0, 0.0])
                m[1] += work
                m[2] += inside
                m[3] += count
                m[4] += work_cpu
            for key, (pos, work, inside, count, work_cpu) in sorted(merged.items(), key=lambda kv: kv[1][0]):
                print(f"{r['rank']:4d} {r['role']:8s} {key:44s} work {work:6.2f} (cpu {work_cpu:5.2f}) "
                      f"in {inside:6.2f} ({count:.2f}/it)")
    print(json.dumps({"load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VFLTORCH_TIMEOUT", "600")
    raise SystemExit(main())
