"""Who is who in a federation: the active party, passive parties, a coordinator.

Ranks ``0 .. Q-1`` are the data parties (each holds some columns); the active
party (label holder) is one of them, rank 0 unless told otherwise. An optional
coordinator takes the last rank ``Q``: it holds no data (Paillier LR's key
holder, VFedPCA's server).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Roles:
    world_size: int
    active: int = 0
    coordinator: int | None = None
    # The organisations' names by rank (a federation file), for messages only: not part of what the roles are.
    labels: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"a federation needs at least one process, got world_size={self.world_size}")
        if self.coordinator is not None and self.coordinator != self.world_size - 1:
            raise ValueError("the coordinator must be the last rank "
                             f"({self.world_size - 1}), got {self.coordinator}")
        if self.active not in self.parties:
            raise ValueError(f"the active party must be a data party (one of {self.parties}), got {self.active}")

    @classmethod
    def for_parties(cls, parties: int, *, coordinator: bool = False, active: int = 0) -> "Roles":
        world = parties + (1 if coordinator else 0)
        return cls(world_size=world, active=active, coordinator=world - 1 if coordinator else None)

    @property
    def parties(self) -> list[int]:
        """Ranks of the data parties, in order."""
        n = self.world_size - (1 if self.coordinator is not None else 0)
        return list(range(n))

    @property
    def num_parties(self) -> int:
        return len(self.parties)

    @property
    def passive(self) -> list[int]:
        return [r for r in self.parties if r != self.active]

    def name(self, rank: int) -> str:
        """Human name of a rank for messages: 'party 2 (passive)'; across organisations the name the federation
        file gives it first, 'shop (party 2, passive)', so that every party's message says which organisation."""
        role = "coordinator" if rank == self.coordinator else "active" if rank == self.active else "passive"
        if self.labels is not None and 0 <= rank < len(self.labels):
            return f"{self.labels[rank]} (party {rank}, {role})"
        return f"party {rank} ({role})"
