"""Integer masks that hide a party's gradient block from the key holder.

In an SGD step (and in SQN's first 2L steps) party l sends the coordinator
[[G_l + r_l]] = [[G_l]] (1 + r_l n): r_l is a vector of integers uniform in
[0, 2^(b + sigma)), where 2^b is the public bound of G_l (``bounds.py``). The
coordinator decrypts G_l + r_l, which is within statistical distance 2^-sigma
of uniform on its range whatever G_l is, returns it, and the party subtracts
r_l. The masks act on the fixed-point integers, so unmasking is exact; float
masks would lose the low bits of G_l to rounding.

Masks must be unpredictable: by default they come from the operating
system (``secrets``). A seed gives the reproducible *simulation* stream
(``vfltorch.comm.MaskStream``, seeded): whoever knows the seed removes the
masks, so the estimator warns and marks the run as carrying no guarantee.
"""

from __future__ import annotations

import secrets

from ..comm.masking import MaskStream


class MaskSource:
    """A party's private supply of uniform integer masks (OS entropy; seeded = simulation only)."""

    def __init__(self, seed: int | None = None, rank: int = 0):
        self._stream = None if seed is None else MaskStream(int(seed), int(rank))

    def draw(self, count: int, bits: int) -> list[int]:
        """``count`` integers uniform in [0, 2^bits)."""
        if self._stream is None:
            return [secrets.randbits(bits) for _ in range(count)]
        words = -(-bits // 64)
        raw = [int(v) for v in self._stream.words(count * words)]
        out = []
        for i in range(count):
            value = 0
            for w in raw[i * words:(i + 1) * words]:
                value = (value << 64) | w
            out.append(value >> (64 * words - bits))
        return out


def unmask(masked: list[int], masks: list[int]) -> list[int]:
    """(G + r) - r, elementwise on the integers."""
    if len(masked) != len(masks):
        raise ValueError(f"got {len(masked)} masked values for {len(masks)} masks")
    return [int(a) - int(b) for a, b in zip(masked, masks)]


__all__ = ["MaskSource", "unmask"]
