"""Transcript hook: a copy of every tensor a party sends, for privacy tests.

Attach one to a ``Federation`` (``fed.transcript = Transcript()``, or
``record_transcript=True`` in the launcher) and every outgoing message is kept
with its phase and destination. Tests then assert that nothing a party sent
equals, or linearly reveals, the raw columns it owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Message:
    phase: str
    src: int
    dst: int
    tensor: torch.Tensor


class Transcript:
    def __init__(self):
        self.messages: list[Message] = []

    def record(self, phase: str, src: int, dst: int, tensor: torch.Tensor) -> None:
        self.messages.append(Message(phase, src, dst, tensor.detach().to("cpu", copy=True)))

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self):
        return iter(self.messages)

    def in_phase(self, phase: str) -> list[Message]:
        return [m for m in self.messages if m.phase == phase]

    def floats(self) -> list[torch.Tensor]:
        """Every message payload as a flat float64 tensor (integers included)."""
        return [m.tensor.reshape(-1).to(torch.float64) for m in self.messages
                if m.tensor.dtype != torch.uint8 and m.tensor.dtype != torch.bool]
