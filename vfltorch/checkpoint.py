"""Checkpoints of a long run, each party its own folder: resume after any party restarts (issue 33).

Between organisations a party can stop mid-run (a reboot, a killed job, a network cut). Every party then stops
with an error naming it (``vfltorch.comm``); with ``--checkpoint DIR`` the run is started again with the same
command and goes on from the last step that *every* party saved, instead of from the start.

Layout: ``DIR/step-<t>/party-<rank>/`` is one model-store shard (``model_store.write_shard``): numpy arrays only,
read back without unpickling, authenticated with an HMAC under the party's model key (across organisations
derived from its own ``--identity``), files 0600 in folders 0700, written atomically with the manifest last.
Across organisations each party passes its own DIR and holds only its own ``party-<rank>`` folders; on one
machine (``--parties Q``) the parties share DIR, each writing and reading only its own subfolder.

Agreement. The parties save at the same steps (epoch ends). A party killed while saving has the step before; one
that saved cannot get further without the others, whose messages every step needs, so the parties' newest steps
are at most one save apart. Each party keeps its newest ``KEEP`` = 2 and, at the start, tells the active party
which steps it holds for this run (same method, same settings, same own data: ``fingerprint``); the active party
picks the newest step that every party holds (0: start afresh) and tells everyone. Nothing but step numbers and
a settings digest travels: a party's checkpoint never leaves its machine.

What a checkpoint holds is as secret as the run's randomness: DP-SCD's, for example, the generator states of
the batch schedule and of the noise - whoever reads them removes the noise from the released model. So the
folders are private, and a run that ends normally deletes its party's checkpoints (``finish``); a run that is
abandoned should have its DIR deleted by hand.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from .data.validation import VFLInputError
from .model_store import ModelStoreError, model_key, read_shard, write_shard

KEEP = 2
STEP_PREFIX = "step-"
log = logging.getLogger("vfltorch.checkpoint")


class CheckpointError(VFLInputError):
    """A checkpoint folder that cannot be used (not writable, not a folder)."""


def digest(obj) -> str:
    """SHA-256 of ``obj`` as canonical JSON: settings compared between runs without sending them."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def array_digest(*arrays) -> str:
    """SHA-256 over numpy arrays' dtypes, shapes and bytes: this party's data, so that a restart on other rows or
    columns is not taken for the same run."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none")
            continue
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes(order="C"))
    return h.hexdigest()


class Checkpoints:
    """This party's checkpoints of one run under ``root`` (see the module docstring).

    ``method`` names what is saved ("dpscd", ...); ``fingerprint`` is what must be equal for a checkpoint to be
    of this run at this party (settings every party shares and a digest of its own data); the manifests keep
    its digest only.
    """

    def __init__(self, fed, root, *, method: str, fingerprint: dict):
        self.fed = fed
        self.root = Path(root)
        self.method = f"checkpoint/{method}"
        self.run = digest({"method": method, **fingerprint})
        if self.root.exists() and not self.root.is_dir():
            raise CheckpointError(f"--checkpoint {self.root}: exists and is not a folder; name a folder (it is made "
                                  f"if missing)")
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"--checkpoint {self.root}: cannot make the folder ({exc.strerror or exc})") from None
        self.key = model_key(fed, create=True)
        self.resumed_from = 0
        self._kept: list[int] = []            # this run's steps at this party, newest first (pruned to KEEP)

    # ------------------------------------------------------------------ local
    def _step_dir(self, step: int) -> Path:
        return self.root / f"{STEP_PREFIX}{int(step)}"

    def _own_steps(self) -> list[int]:
        """Steps with a folder of this party (complete or not), newest first."""
        steps = []
        for p in self.root.glob(f"{STEP_PREFIX}*"):
            tail = p.name[len(STEP_PREFIX):]
            if tail.isdigit() and (p / f"party-{self.fed.rank}").is_dir():
                steps.append(int(tail))
        return sorted(steps, reverse=True)

    def _read(self, step: int):
        return read_shard(self._step_dir(step), self.fed.rank, method=self.method, key=self.key)

    def usable_steps(self) -> list[int]:
        """This party's steps of this run whose shard reads and authenticates, newest first; others are noted."""
        good = []
        for step in self._own_steps():
            try:
                manifest, _ = self._read(step)
            except ModelStoreError as exc:
                log.warning("checkpoint %s is not used: %s", self._step_dir(step), exc)
                continue
            if manifest.get("run") != self.run or manifest.get("step") != step:
                log.warning("checkpoint %s is of another run (other settings or data): not used",
                            self._step_dir(step))
                continue
            good.append(step)
        return good

    def save(self, step: int, state: dict, arrays: dict) -> None:
        """Write this party's checkpoint after ``step`` steps, then drop its older ones beyond the newest KEEP."""
        write_shard(self._step_dir(step), self.fed.rank,
                    {"method": self.method, "run": self.run, "step": int(step), "state": state}, arrays,
                    key=self.key)
        self._kept = sorted({int(step), *self._kept}, reverse=True)
        for old in self._kept[KEEP:]:
            self._remove(old)
        self._kept = self._kept[:KEEP]

    def _remove(self, step: int) -> None:
        folder = self._step_dir(step)
        shutil.rmtree(folder / f"party-{self.fed.rank}", ignore_errors=True)
        try:
            folder.rmdir()                   # only once every party sharing the folder has removed its own
        except OSError:
            pass

    def finish(self) -> None:
        """The run ended: remove this party's checkpoints of it (they hold the run's secret randomness)."""
        for step in self._kept:
            self._remove(step)
        self._kept = []
        try:
            self.root.rmdir()
        except OSError:
            pass

    # ------------------------------------------------------------- collective
    def resume(self, ranks=None):
        """Every party: the newest step all parties hold, and this party's (manifest state, arrays) of it;
        ``None`` to start afresh. Collective over ``ranks`` (default: every rank of the federation; a method whose
        dealer keeps nothing between starts passes the data parties, and tells the dealer the step itself)."""
        fed = self.fed
        mine = self.usable_steps()
        self._kept = list(mine)
        if fed.world_size == 1:
            step = mine[0] if mine else 0
        else:
            held = fed.gather_json(mine, fed.active, ranks=ranks)
            step = None
            if fed.is_active:
                common = set(held[0]).intersection(*map(set, held[1:]))
                step = max(common) if common else 0
                if step == 0 and any(held):
                    log.warning("no checkpoint is held by every party (%s): starting from the first step",
                                ", ".join(f"{fed.name(r)}: {h[:KEEP] or 'none'}" for r, h in
                                          zip(range(fed.world_size) if ranks is None else ranks, held)))
            step = int(fed.broadcast_json(step, fed.active, ranks=ranks))
        if not step:
            return None
        manifest, arrays = self._read(step)
        self.resumed_from = step
        return manifest["state"], arrays


__all__ = ["CheckpointError", "Checkpoints", "KEEP", "array_digest", "digest"]
