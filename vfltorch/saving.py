"""``vfl METHOD ... --save-model DIR``: what every method's CLI writes into each party's shard besides its model.

The training side of a saved model (``vfl predict`` is its scoring side, in ``predict.py``): the party's
columns, its fitted preprocessing, the public data layout and, at the active party, the label encoding, added to
the estimator's own state and written through ``model_store``. The method CLIs import it; it imports no CLI.
"""

from __future__ import annotations

import numpy as np


def data_manifest(fed, args, data) -> tuple[dict, dict]:
    """What the CLI adds to a data party's shard: columns, preprocessing, data layout, label encoding."""
    if data is None:
        return {}, {}
    meta, arrays = data.preprocessing.state() if data.preprocessing is not None else ({}, {})
    out = {"columns": [int(c) for c in data.columns], "feature_names": list(data.feature_names),
           "n_features_total": int(data.n_features_total), "preprocessing": {**meta,
                                                                            "normalize_rows": bool(args.normalize_rows)},
           "data": {"dataset": args.dataset, "task": data.task, "partition": args.partition,
                    "feature_groups": args.feature_groups, "seed": args.seed, "test_fraction": args.test_fraction,
                    "party_files": bool(args.party_files),
                    # How to read a file given as --dataset again (`vfl predict` without --dataset re-reads it).
                    "file_options": {"label_column": args.label_column, "positive_label": args.positive_label,
                                     "task": getattr(args, "task", None), "test_dataset": args.test_dataset}}}
    if fed.is_active:
        out["labels"] = {"classes": _plain(data.classes), "note": data.label_note}
    arrays = {**arrays, "columns": np.asarray(data.columns, dtype=np.int64)}
    return out, arrays


def _plain(values):
    if values is None:
        return None
    return [v.item() if hasattr(v, "item") else (v if isinstance(v, (int, float, str, bool)) else str(v))
            for v in values]


def save_estimator(fed, args, data, est, *, command: dict | None = None, fed_arg: bool = False) -> str | None:
    """``--save-model``: every rank writes its shard of ``est`` plus the CLI's data facts (collective)."""
    if not getattr(args, "save_model", None):
        return None
    extra, arrays = data_manifest(fed, args, data)
    extra["command"] = command or {}
    est.save(args.save_model, fed if fed_arg else None, extra=extra, extra_arrays=arrays)
    return est.model_id_


def save_arrays(fed, args, data, method: str, *, state: dict, arrays: dict, command: dict | None = None,
                predict_coordinator: bool = False) -> str | None:
    """``--save-model`` for a method run without an estimator object (``vfl dpscd``): same shard layout."""
    if not getattr(args, "save_model", None):
        return None
    from . import __version__
    from .model_store import role_of, save_collective

    extra, data_arrays = data_manifest(fed, args, data)
    manifest = {"method": method, "estimator": None, "vfltorch_version": __version__, "role": role_of(fed),
                "parties": fed.num_parties, "coordinator": fed.coordinator is not None,
                "predict_coordinator": predict_coordinator, "hyperparameters": {}, "state": state,
                "command": command or {}, **extra}
    return save_collective(fed, args.save_model, manifest, {**arrays, **data_arrays})
