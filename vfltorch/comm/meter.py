"""Communication meter: bytes and messages per named phase, sent and received.

Every tensor that crosses the wire through a ``Federation`` is counted here by
its payload size (``numel * element_size``); transport framing of gloo/MPI is
not counted, the headers that vfltorch itself sends are.
"""

from __future__ import annotations

import logging
from collections import defaultdict

log = logging.getLogger("vfltorch.comm")

_FIELDS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")


def _zero_counts() -> dict[str, int]:
    # A module-level factory, not a lambda: a meter (and every estimator holding one) must pickle.
    return dict.fromkeys(_FIELDS, 0)


class CommMeter:
    def __init__(self):
        self._phases: dict[str, dict[str, int]] = defaultdict(_zero_counts)

    @classmethod
    def from_dict(cls, phases: dict) -> "CommMeter":
        """Rebuild a meter from ``as_dict()`` output (for example one gathered from another party)."""
        m = cls()
        for name, counts in phases.items():
            m._phases[name].update(counts)
        return m

    def record_send(self, phase: str, nbytes: int) -> None:
        p = self._phases[phase]
        p["bytes_sent"] += nbytes
        p["messages_sent"] += 1

    def record_recv(self, phase: str, nbytes: int) -> None:
        p = self._phases[phase]
        p["bytes_received"] += nbytes
        p["messages_received"] += 1

    def as_dict(self) -> dict[str, dict[str, int]]:
        """``{phase: {bytes_sent, bytes_received, messages_sent, messages_received}}``."""
        return {k: dict(v) for k, v in self._phases.items()}

    def totals(self, phases=None) -> dict[str, int]:
        out = dict.fromkeys(_FIELDS, 0)
        for name, p in self._phases.items():
            if phases is None or name in phases:
                for f in _FIELDS:
                    out[f] += p[f]
        return out

    def reset(self) -> None:
        self._phases.clear()

    def log(self, rank: int, level: int = logging.INFO) -> None:
        for name, p in sorted(self._phases.items()):
            log.log(level, "party %d phase %-24s sent %12d B in %7d msgs, received %12d B in %7d msgs",
                    rank, name, p["bytes_sent"], p["messages_sent"], p["bytes_received"], p["messages_received"])
