"""What every experiment writes: JSON records, CSV tables, PNG plots, and a note on the machine.

One place for it, so that every experiment's files look the same: JSON through
``vfltorch.runlog.write_json`` (tensors and numpy values become lists and
numbers), CSV with the union of the rows' keys as header, matplotlib on the
Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import os
import platform
from pathlib import Path

import torch

from vfltorch.runlog import write_json as _write_record


def machine_note() -> dict:
    """Where a run's timings come from (this machine is shared, so wall times are noisy)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "load_average": load, "torch": torch.__version__,
            "note": "shared machine: other jobs ran at the same time, wall times are noisy; "
                    "compare ratios measured in the same run"}


def write_json(path: Path | str, record) -> None:
    _write_record(str(path), record)


def write_csv(path: Path | str, rows: list[dict]) -> None:
    """One row per dict; the header is the union of the keys in first-seen order (missing cells empty)."""
    if not rows:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, restval="")
        w.writeheader()
        w.writerows(rows)


def write_outputs(out_dir: Path | str, name: str, record: dict, rows: list[dict] | None = None) -> None:
    """``out_dir/name.json`` and, if there are rows, ``out_dir/name.csv``."""
    out_dir = Path(out_dir)
    write_json(out_dir / f"{name}.json", record)
    write_csv(out_dir / f"{name}.csv", rows or [])


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
