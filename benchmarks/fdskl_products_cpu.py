"""CPU per role of the shared FDSKL training iteration's two products (Q = 2), in one process, one thread.

The whole-run profile (``benchmarks/fdskl_shared_profile.py``) measures three processes on shared cores, and on
a loaded machine its CPU figures move by a factor of two between identical runs. This runs the same code
(``StarProducts``: the dealer's material, A's operands and openings, the keeper's shares; the dealt masks
beta) for the active party A, the keeper K and the dealer one after the other in one thread, with their
messages handed over in memory (no gloo, no phases' star, no optimiser), and reports each role's CPU
milliseconds per iteration. The products run in their split form (``operand`` / ``share`` / ``open``), the
same arithmetic as ``mul_dealt`` / ``open_shares`` at ``f_delay`` 0.

    python -m benchmarks.fdskl_products_cpu --batch 64 --iterations 150

To compare two trees, run it under each (``PYTHONPATH=<tree>``), alternating.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import time


class _Fed:
    """Just enough of a ``Federation`` for ``StarProducts`` and ``deal_dealt``: messages go through a dict."""

    def __init__(self, rank: int, queues):
        self.rank, self.active, self.parties, self.current_phase = rank, 0, [0, 1], "fdskl/train"
        self.queues = queues

    @property
    def is_active(self) -> bool:
        return self.rank == self.active

    @contextlib.contextmanager
    def phase(self, name):
        yield

    def send(self, tensor, dst):
        self.queues[(self.rank, dst)].append(tensor.detach().reshape(-1).clone())

    def recv(self, src, shape, dtype=None, device=None):
        t = self.queues[(src, self.rank)].popleft()
        return t.view(__import__("torch").uint8).view(dtype).reshape(tuple(shape))


def main(argv=None) -> int:
    import torch

    from vfltorch.comm.sharing import fresh_seed
    from vfltorch.kernels.shared import (TRAIN_BITS, DealtPhases, StarProducts, _masks, cosine_table,
                                         pair_table)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="B, the batch rows (phishing 64, credit_default 175)")
    ap.add_argument("--features", type=int, default=1536, help="D")
    ap.add_argument("--iterations", type=int, default=150)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    B, D, N = args.batch, args.features, args.iterations
    queues = collections.defaultdict(collections.deque)
    A, K, dealer = _Fed(0, queues), _Fed(1, queues), _Fed(2, queues)
    table = pair_table(cosine_table().to(torch.int64))
    g = torch.Generator().manual_seed(0)
    cols = torch.arange(D)
    cpu = dict.fromkeys(("A", "K", "dealer"), 0.0)

    def timed(who, fn):
        started = time.process_time()
        out = fn()
        cpu[who] += time.process_time() - started
        return out

    def material(fed, beta_seed, prod_seed):
        beta = _masks(beta_seed, (B, D))
        ph = DealtPhases(None, [(1, cols, beta)])
        ph.product_seed = prod_seed
        return StarProducts(fed, ph, table, 2, B, grad_cols=cols, bits=TRAIN_BITS)

    for it in range(N + 10):                     # 10 iterations of warm-up
        if it == 10:
            cpu = dict.fromkeys(cpu, 0.0)
        beta_seed, prod_seed = fresh_seed(), fresh_seed()
        S = torch.randint(-2 ** 15, 2 ** 15, (B, D), dtype=torch.int16, generator=g)
        coef = torch.randn(D, dtype=torch.float64, generator=g)
        weights = torch.rand(B, dtype=torch.float64, generator=g)
        timed("dealer", lambda: material(dealer, beta_seed, prod_seed))
        pk = timed("K", lambda: material(K, beta_seed, prod_seed))
        pa = timed("A", lambda: StarProducts(A, DealtPhases(S, [(1, cols, None)]), None, 2, B, grad_cols=cols,
                                             bits=TRAIN_BITS))
        e = timed("A", lambda: pa.operand(0, coef))
        z = timed("K", lambda: pk.share(0, e))
        timed("A", lambda: pa.open(0, z))
        e = timed("A", lambda: pa.operand(1, weights))
        z = timed("K", lambda: pk.share(1, e))
        timed("A", lambda: pa.open(1, z))
    per = {k: v / N * 1000 for k, v in cpu.items()}
    print(f"B = {B}, D = {D}, {N} iterations: CPU ms per iteration A {per['A']:.3f}, K {per['K']:.3f}, "
          f"dealer {per['dealer']:.3f}, sum {sum(per.values()):.3f}  (load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
