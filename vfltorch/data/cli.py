"""Data commands: ``vfl datasets`` (what is registered and found) and ``vfl inspect`` (a federated dry run).

``vfl inspect`` runs the whole data path of a method - every party loads its
own columns, rows are checked to agree, preprocessing runs, row norms go
through a masked sum if asked - and reports what each party holds. Use it to
check a set-up (files, partition, torchrun across machines) before training.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..cli import Command
from .validation import VFLInputError


def _datasets(_fed, _data, args, _log):
    from .registry import REGISTRY, available, resolve_data_dir

    try:
        root = resolve_data_dir(args.data_dir)
    except VFLInputError as exc:
        print(f"vfl: error: {exc}")
        return 2
    print(f"data folder: {root if root else '(none found: pass --data-dir or set VFLTORCH_DATA)'}")
    for name, spec in REGISTRY.items():
        mark = "bundled" if spec.bundled else ("found" if available(name, args.data_dir) else "missing")
        print(f"  {name:<20} {spec.task:<11} {mark:<8} {spec.description}")
    return 0


def _datasets_args(p):
    p.add_argument("--data-dir", help="folder of the named datasets (default: $VFLTORCH_DATA, else ../shared/data)")


def _inspect(fed, data, args, log):
    import numpy as np
    import torch

    started = time.perf_counter()
    info = {"party": fed.rank, "role": fed.name(), "columns": len(data.columns),
            "feature_names": data.feature_names[:5], "train_rows": data.n_train, "test_rows": data.n_test}
    # The mean squared row norm over all columns, through a masked sum: exercises the secure path.
    from ..comm import secure_sum

    part = (data.X_train.to(torch.float64) ** 2).sum(dim=1).mean().reshape(1)
    with fed.phase("inspect/row-norm"):
        total = secure_sum(fed, part, out=fed.active)
    parties = fed.gather_json(info, fed.active, ranks=fed.parties)
    if not fed.is_active:
        return None
    metrics = {"train_rows": data.n_train, "test_rows": data.n_test,
               "features": sum(p["columns"] for p in parties), "mean_sq_row_norm": float(total[0])}
    if data.y_train is not None and data.task == "binary":
        metrics["positive_fraction"] = float((data.y_train > 0).double().mean())
    if not args.quiet:
        for p in parties:
            print(f"{p['role']}: {p['columns']} columns ({', '.join(map(str, p['feature_names']))}"
                  f"{', ...' if p['columns'] > 5 else ''}), {p['train_rows']} train / {p['test_rows']} test rows")
        if data.y_train is not None:
            from ..devices import to_numpy

            values, counts = np.unique(to_numpy(data.y_train), return_counts=True)
            print(f"labels at {fed.name()}: " + ", ".join(f"{v:g}: {c}" for v, c in zip(values, counts))
                  if data.task != "regression" else f"labels at {fed.name()}: regression target")
    return {"metrics": metrics, "train_seconds": time.perf_counter() - started, "party_info": parties,
            "task": data.task}


def _align(fed, data, args, log):
    """Every party writes its own file's aligned row order (``--rows-out``, ``{party}`` filled in)."""
    from .party import own_party_file
    from .psi import canonical_id

    started = time.perf_counter()
    if data.aligned_rows is None:
        raise VFLInputError("vfl align aligns --party-files: pass one file per party and --id-column")
    path = args.rows_out.replace("{party}", str(data.party))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"# aligned rows of {own_party_file(args.party_files, data.party, data.num_parties)} "
                f"(row: 0-based data row of the file)\n")
        f.write(f"row,{args.id_column}\n")
        for r, i in zip(data.aligned_rows.tolist(), data.aligned_ids):
            f.write(f"{r},{canonical_id(i)}\n")
    a = data.alignment
    if fed.is_active and not args.quiet:
        print(f"aligned {a['aligned']} rows; rows per file: "
              + ", ".join(f"party {r}: {n} ({a['dropped'][r]} dropped)" for r, n in a["rows"].items())
              + f"; each party wrote {args.rows_out}", flush=True)
    return {"metrics": {"aligned_rows": a["aligned"]}, "train_seconds": time.perf_counter() - started,
            "rows_out": args.rows_out}


def _align_args(p):
    p.add_argument("--rows-out", default="aligned_rows_party{party}.csv", metavar="PATTERN",
                   help="where each party writes its aligned row order ({party} is its index; each party "
                        "writes only its own file)")


def _align_check(args):
    if not args.party_files:
        raise VFLInputError("vfl align aligns --party-files: pass one file per party and --id-column")


COMMANDS = [
    Command("datasets", "list the registered datasets and whether their files are found", _datasets,
            add_arguments=_datasets_args, needs_data=False),
    Command("inspect", "load and split the data across the parties and report what each holds (a dry run)",
            _inspect),
    Command("align", "align the rows of --party-files by private set intersection and write each party's "
            "row order", _align, add_arguments=_align_args, check=_align_check,
            data_defaults={"test_fraction": 0.0}),
]
