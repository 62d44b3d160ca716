"""What a party that owns columns answers when a saved model scores rows: each of its rows at most N times.

Prediction is a protocol too (DESIGN.md, "Privacy invariants"). The party that receives the scores (the
active party) chooses its own columns of every row it submits and knows everything in a kernel model except
the other parties' values; with K requests that carry one customer's passive row and K chosen active rows it
solves K equations for that customer's passive columns (issue 41: breast_cancer, d_P = 15, K = 30: every
column within 0.01). A linear model gives the same one number w_P . x_P per customer whatever the requests,
a kernel model a new equation per request.

So every data party other than the one that gets the scores keeps a **scoring ledger** per saved model, beside
its own shard, and refuses a request that would score one of its rows more than ``max_scores`` times
(default 1), or that holds one of its rows twice; ``max_scores`` 0 turns the policy off (and warns). A row is keyed by its content (the values of
this party's columns as scored), never by an ID the other side chooses, through an HMAC under the party's
model key, so the ledger names no row. The ledger is written before the party answers, so a requester that
aborts after getting the scores still used its turn; it persists across runs and restarts. The refusal
reaches every party (``model_store.settle``) with the party's name and the counts.

What this leaves: a customer scored once gives the active party one equation in that customer's passive
values, per allowed scoring; rows that equal another customer's (a party with few discrete columns) share a
key, so such a party may need a higher limit, which also allows that many equations per row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import numpy as np

LEDGER = "scoring-ledger.json"
FORMAT = "vfltorch-scoring-ledger"
DEFAULT_MAX_SCORES = 1


def row_keys(key: bytes, model_id: str, X) -> list[str]:
    """One HMAC-SHA256 per row of ``X`` (this party's columns as scored, float64): the ledger's keys."""
    from .devices import to_numpy

    rows = np.ascontiguousarray(to_numpy(X, np.float64))
    head = b"vfltorch/scoring-row/v1\0" + str(model_id).encode() + b"\0"
    return [hmac.new(key, head + rows[i].tobytes(), hashlib.sha256).hexdigest()[:32] for i in range(rows.shape[0])]


class ScoringLedger:
    """How often each of this party's rows was scored by one saved model (the file beside its shard)."""

    def __init__(self, path: Path, model_id: str, counts: dict[str, int] | None = None):
        self.path, self.model_id, self.counts = Path(path), str(model_id), dict(counts or {})

    @classmethod
    def open(cls, shard_folder, model_id: str) -> "ScoringLedger":
        path = Path(shard_folder) / LEDGER
        if not path.exists():
            return cls(path, model_id)
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the scoring ledger {path} cannot be read ({exc}): restore it from a backup; deleting "
                             f"it would let every row be scored again") from None
        counts = doc.get("counts") if isinstance(doc, dict) else None
        if doc.get("format") != FORMAT or doc.get("model_id") != model_id or not isinstance(counts, dict) or \
                not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in counts.items()):
            raise ValueError(f"the scoring ledger {path} is not this model's (or is damaged): restore it from a "
                             f"backup; deleting it would let every row be scored again")
        return cls(path, model_id, counts)

    def refusal(self, keys: list[str], max_scores: int, who: str) -> str | None:
        """Why this request must be refused under the policy (None: it may be answered). ``max_scores`` 0: no
        policy at all (the paper's scoring: any row, any number of times)."""
        if max_scores <= 0:
            return None
        seen: dict[str, int] = {}
        repeated = 0
        for k in keys:
            seen[k] = seen.get(k, 0) + 1
            if seen[k] == 2:
                repeated += 1
        if repeated:
            return (f"{who} refuses to score: {repeated} of its rows {'appears' if repeated == 1 else 'appear'} "
                    f"more than once in this request (each row is scored once per request, whatever IDs the rows "
                    f"carry)")
        over = sum(1 for k in seen if self.counts.get(k, 0) + 1 > max_scores)
        if over:
            return (f"{who} refuses to score: {over} of the {len(seen)} rows were already scored {max_scores} "
                    f"time{'s' if max_scores != 1 else ''} by this model (its scoring policy, "
                    f"--max-scores-per-row {max_scores}; repeated scoring with chosen inputs lets the receiver "
                    f"solve for this party's columns)")
        return None

    def record(self, keys: list[str]) -> None:
        """Count this request's rows and write the ledger (atomically, mode 0600) before any score is sent."""
        from .runlog import write_atomic

        for k in keys:
            self.counts[k] = self.counts.get(k, 0) + 1
        doc = {"format": FORMAT, "model_id": self.model_id, "counts": self.counts}
        write_atomic(self.path, (json.dumps(doc, sort_keys=True) + "\n").encode(), mode=0o600)
