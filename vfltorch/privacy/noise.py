"""Private Gaussian noise streams, one per block of coordinates.

DP-SCD adds N(0, sigma^2 S^2) to every coordinate of the shared vector v and
to the touched coordinates of alpha. In the vertical setting v splits into the
parties' blocks v_l; each party draws the noise for its own block from its own
stream, so the total noise on v is exactly N(0, sigma^2 S^2 I_d) and nobody
else knows it (a party that knew another's noise could subtract it from the
released model).

Streams are named: ``"v/<b>"`` for the b-th column block (block b = party b
in a federation) and ``"alpha"`` for the dual variables (the active party).
Each stream's generator comes from ``Randomness`` (``randomness.py``): by
default seeded from 128 bits of OS entropy that nobody, the party included,
can replay; in simulation mode from (simulation seed, name), so that a
centralised run given the same column blocks draws exactly the noise of the
federated run - that is how "federated == centralised" is tested.
"""

from __future__ import annotations

import torch

from .randomness import Randomness


class NoiseStream:
    """Standard normal draws from a private generator (always on the CPU, so every device gets the same numbers)."""

    def __init__(self, randomness: Randomness, name: str):
        self.name = name
        self.generator = randomness.numpy(f"noise/{name}")

    def normal(self, n: int, std: float, *, device=None, dtype=torch.float64) -> torch.Tensor:
        z = torch.from_numpy(self.generator.standard_normal(int(n)))
        return (z * float(std)).to(device=device, dtype=dtype)


class BlockNoise:
    """Noise for a party's coordinates of v, drawn block by block.

    ``blocks`` is a list of (block id, local column positions). In a
    federation a party has one block (its own columns, id = its party index);
    a centralised run may split its columns into the federation's blocks to
    reproduce a federated run draw for draw.
    """

    def __init__(self, randomness: Randomness, blocks, n_local: int):
        self.n_local = int(n_local)
        self.blocks = [(NoiseStream(randomness, f"v/{int(b)}"), torch.as_tensor(cols, dtype=torch.long))
                       for b, cols in blocks]
        covered = torch.cat([c for _, c in self.blocks]) if self.blocks else torch.empty(0, dtype=torch.long)
        if sorted(covered.tolist()) != list(range(self.n_local)):
            raise ValueError("noise blocks must cover each local column exactly once")

    def normal(self, std: float, *, device=None, dtype=torch.float64) -> torch.Tensor:
        out = torch.empty(self.n_local, dtype=torch.float64)
        for stream, cols in self.blocks:
            out[cols] = stream.normal(len(cols), std)
        return out.to(device=device, dtype=dtype)
