"""The two messages of vertical DP-SCD: partial sums up to the active party, its answer back down.

Parties hold column blocks X_l of the same rows. Anything linear in the
columns, such as x_j^T v = sum_l x_{j,l}^T v_l or ||x_j||^2, is a sum of
per-party parts. ``sum_at_active`` adds the parts up the FDSKL pairwise tree
rooted at the active party (``vfltorch.comm.reduce``), or, with
``secure=True``, through ring-masked secure aggregation
(``vfltorch.comm.secure_sum``), so that only the active party learns the
total and no party sees another's part. ``from_active`` sends the active
party's answer (the clipped coordinate steps zeta of a batch) back down the
same tree (``vfltorch.comm.broadcast``).

With one party both are the identity: the centralised algorithm is the same
code with no messages.
"""

from __future__ import annotations

import secrets

import torch

from ..comm import Federation, MaskStream, broadcast, pairwise_tree, reduce, secure_sum


class ActiveLink:
    def __init__(self, fed: Federation, *, secure: bool = False):
        self.fed = fed
        self.secure = secure
        order = [fed.active] + [p for p in fed.parties if p != fed.active]
        self.tree = pairwise_tree(order)
        # Masks only hide parts in transit; the sums are exact whatever the masks, so fresh entropy is right.
        self.stream = MaskStream(secrets.randbits(62), fed.rank) if secure else None

    @property
    def single(self) -> bool:
        return self.fed.num_parties == 1

    def sum_at_active(self, part: torch.Tensor) -> torch.Tensor | None:
        """The sum of every party's ``part`` at the active party; ``None`` elsewhere."""
        if self.single:
            return part
        if self.secure:
            return secure_sum(self.fed, part, out=self.fed.active, stream=self.stream)
        total = reduce(self.fed, part, self.tree)
        return total if self.fed.is_active else None

    def from_active(self, value: torch.Tensor | None, shape, dtype) -> torch.Tensor:
        """The active party's ``value`` at every party (others pass ``None`` and the expected shape and dtype)."""
        if self.single:
            return value
        return broadcast(self.fed, value if self.fed.is_active else None, self.tree, shape=tuple(shape),
                         dtype=dtype)
