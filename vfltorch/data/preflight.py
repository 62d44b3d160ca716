"""Checks that run once in the launching process, before any party starts.

One mechanism for "answer mistakes early" (issue 15) and "every bad input a
clear answer" (issue 20): ``preflight(args, command, local=...)`` checks

1. option values (``--parties``, ``--timeout``, ``--test-fraction``,
   ``--clip-values``, ``--seed``, ``--partition`` / ``--feature-groups``, the
   options that only make sense for your own file);
2. output paths (``--output-json``, ``--logdir``, ``--save-model``): a run never
   trains for minutes and then finds it cannot write its result;
3. the dataset: a registered name and its files (a stat, no read), its
   column count against ``--parties``, its task against the method's
   ``Command.tasks``; for your own files when the parties are local
   (``local``), the files are read once here with the loaders the parties use,
   so file defects (empty, header only, one row, text, NaN / inf, damaged
   compression) and label defects (one class, too many classes, unknown
   ``--positive-label``) are refused before Q processes start.

Each failure raises ``VFLInputError`` with a message that names the option,
file, column or line and says what to change. Under torchrun / mpirun
(``local=False``) every process runs the option and path checks; the data
checks then happen inside each party, on its own files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .validation import VFLInputError

PEEK_LIMIT_BYTES = 256 * 2 ** 20     # own files up to this size are read in the launcher



def preflight(args, command, *, local: bool = True) -> dict:
    """Everything that can be checked before the parties start; returns what was learnt (task, features).

    Under ``--federation`` each organisation's machine holds only its own file: nothing here opens a data file
    then (another party's path means nothing on this machine, and this party's own file is checked inside the
    federation, where a defect stops every party with a message naming the file: ``party._load_own_file``)."""
    check_options(args)
    check_outputs(args)
    info = {} if _one_organisation(args) else check_dataset(args, local=local)
    tasks = getattr(command, "tasks", None)
    if tasks and info.get("task") and info["task"] not in tasks:
        raise VFLInputError(_task_refusal(command.name, tasks, info))
    return info


def _one_organisation(args) -> bool:
    """One party of a federation file with its own --party-files (docs/deployment.md): its data stays local."""
    return bool(getattr(args, "federation", None)) and bool(getattr(args, "party_files", None))


# ------------------------------------------------------------------ options
def check_options(args) -> None:
    parties = getattr(args, "parties", None)
    if parties is not None and parties < 1:
        raise VFLInputError(f"--parties must be at least 1, got {parties}")
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise VFLInputError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint is not None and os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
        raise VFLInputError(f"--checkpoint {checkpoint}: exists and is not a folder; name a folder (it is made if "
                            f"missing)")
    join = getattr(args, "join_timeout", None)
    if join is not None and not (math.isfinite(join) and join > 0):
        raise VFLInputError(f"--join-timeout must be a positive number of seconds, got {join:g}")
    tf = getattr(args, "test_fraction", None)
    if tf is not None and not (0.0 <= tf < 1.0):
        raise VFLInputError(f"--test-fraction must be in [0, 1), got {tf:g}: it is the share of rows held out")
    clip = getattr(args, "clip_values", None)
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise VFLInputError(f"--clip-values must be a positive number, got {clip:g}")
    seed = getattr(args, "seed", None)
    if seed is not None and not (0 <= seed < 2 ** 63):
        raise VFLInputError(f"--seed must be a non-negative integer below 2**63, got {seed}")
    if getattr(args, "partition", None) == "explicit" and not getattr(args, "feature_groups", None):
        raise VFLInputError("--partition explicit needs --feature-groups, e.g. '0-9;10-17;18-22' (one group per "
                            "party, 0-based inclusive ranges)")
    files = list(getattr(args, "party_files", None) or [])
    if getattr(args, "aligned_rows", None) and not files:
        raise VFLInputError("--aligned-rows reuses the alignment of --party-files: pass the same --party-files "
                            "and --id-column as `vfl align`")
    if files:
        if not getattr(args, "id_column", None):
            raise VFLInputError("--party-files needs --id-column: the rows of the parties' files are matched on it")
        from . import psi_rr22

        if getattr(args, "psi", None) == "rr22" and not getattr(args, "aligned_rows", None) and \
                not psi_rr22.available():
            raise VFLInputError("--psi rr22 needs SecretFlow's spu==0.9.5 (`make install`, or `pip install --no-deps "
                                "spu==0.9.5`; Linux or macOS, Python 3.10-3.11): install it, or pass --psi ecdh")
        if getattr(args, "federation", None):
            if len(files) != 1 and (parties is None or len(files) != parties):
                raise VFLInputError(f"--party-files gives {len(files)} files: across organisations give this "
                                    f"party's own file only (each machine holds just its own data)")
        elif parties is not None and len(files) != parties:
            raise VFLInputError(f"--party-files gives {len(files)} files for --parties {parties}: give one file "
                                f"per party (the first is the active party's, with the labels)")
        if getattr(args, "feature_groups", None):
            raise VFLInputError("--feature-groups splits one file's columns; with --party-files each party's "
                                "file is its columns: drop one of the two")
        if getattr(args, "test_dataset", None):
            raise VFLInputError("--test-dataset is for a single --dataset file, not for --party-files")


# ------------------------------------------------------------------ outputs
def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable_file(path: str, option: str) -> None:
    p = Path(path).expanduser()
    if str(path).endswith(os.sep) or p.is_dir():
        raise VFLInputError(f"{option} {path} is a directory: give a file path, e.g. {p / 'result.json'}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise VFLInputError(f"{option} {path} exists and cannot be written (permission denied)")
        if not os.access(p.parent, os.W_OK | os.X_OK):
            raise VFLInputError(f"{option} {path}: its folder {p.parent} is not writable (the file is replaced "
                                f"atomically, through a temporary file beside it)")
        return
    _check_creatable(p.parent, option, path)


def check_writable_dir(path: str, option: str) -> None:
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise VFLInputError(f"{option} {path} is a file, not a directory: give a directory path")
    if p.exists():
        if not os.access(p, os.W_OK | os.X_OK):
            raise VFLInputError(f"{option} {path} is not writable (permission denied)")
        return
    _check_creatable(p, option, path)


def _check_creatable(folder: Path, option: str, path: str) -> None:
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise VFLInputError(f"{option} {path}: {base} is a file, so no folder can be made under it")
    if not os.access(base, os.W_OK | os.X_OK):
        raise VFLInputError(f"{option} {path}: cannot create {folder} ({base} is not writable)")


def check_outputs(args) -> None:
    if getattr(args, "output_json", None):
        check_writable_file(args.output_json, "--output-json")
    if getattr(args, "logdir", None):
        check_writable_dir(args.logdir, "--logdir")
    for option in ("save_model", "model_dir"):
        if getattr(args, option, None):
            check_writable_dir(getattr(args, option), "--" + option.replace("_", "-"))
    if getattr(args, "save_model", None):
        folder = Path(args.save_model).expanduser()
        if folder.is_dir() and any(p.name.startswith("party-") for p in folder.iterdir()):
            # Shards of two runs in one folder would mix; a model is never overwritten by half.
            raise VFLInputError(f"--save-model {args.save_model} already holds a saved model (party-* folders): "
                                f"choose a new folder, or delete the old model first")


# ------------------------------------------------------------------ data
def _config(args):
    from .party import DataConfig

    return DataConfig(dataset=args.dataset, test_dataset=args.test_dataset, data_dir=args.data_dir,
                      task=getattr(args, "task", None), label_column=args.label_column,
                      positive_label=args.positive_label, id_column=args.id_column,
                      party_files=list(args.party_files or []), partition=args.partition,
                      feature_groups=args.feature_groups, test_fraction=args.test_fraction, seed=args.seed,
                      impute=args.impute, scale=args.scale, clip=args.clip_values,
                      normalize_rows=args.normalize_rows, scoring=getattr(args, "command", None) == "predict")


def check_dataset(args, *, local: bool) -> dict:
    """The dataset's existence, width against the parties, task; own files read once when ``local``."""
    if not hasattr(args, "dataset"):
        return {}
    if args.dataset is None and not args.party_files:
        raise VFLInputError("no data given: pass --dataset NAME (a registered dataset) or --dataset FILE (a saved "
                            "model names a registered dataset at most, never the files a command reads)")
    parties = 3 if getattr(args, "parties", None) is None else args.parties
    if args.party_files:
        return _check_party_files(args, parties, local)
    from .registry import REGISTRY

    if args.dataset in REGISTRY:
        return _check_registered(args, parties)
    path = Path(args.dataset).expanduser()
    if not path.exists():
        raise VFLInputError(f"unknown dataset {args.dataset!r}: not a registered name "
                            f"({', '.join(sorted(REGISTRY))}) and no such file")
    from .loaders import _exists

    _exists(path)
    if args.test_dataset:
        _exists(args.test_dataset)
    if not local or _size(path) + (_size(args.test_dataset) if args.test_dataset else 0) > PEEK_LIMIT_BYTES:
        _check_groups(args, parties, None)
        return {}
    from .party import _load_whole

    ds = _load_whole(_config(args))
    _check_groups(args, parties, ds.n_features)
    rows = ds.X.shape[0] if ds.X_test is not None else ds.X.shape[0] - int(round(ds.X.shape[0] * args.test_fraction))
    return {"task": ds.task, "features": ds.n_features, "labels": ds.label_note, "name": str(args.dataset),
            "rows": rows}


def _size(path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def _check_registered(args, parties) -> dict:
    from .registry import REGISTRY, SHAPES, _need, resolve_data_dir, training_rows

    spec = REGISTRY[args.dataset]
    given = [o for o, v in (("--label-column", args.label_column), ("--positive-label", args.positive_label),
                            ("--task", getattr(args, "task", None)), ("--id-column", args.id_column),
                            ("--test-dataset", args.test_dataset)) if v]
    if given:
        raise VFLInputError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for your own files; the "
                            f"registered dataset {spec.name!r} has fixed labels (a {spec.task} task): drop "
                            f"{'it' if len(given) == 1 else 'them'}, or pass the file's path as --dataset")
    if not spec.bundled:
        root = resolve_data_dir(args.data_dir)
        for rel in spec.files:
            _need(root, spec.name, rel)
    elif args.data_dir:
        resolve_data_dir(args.data_dir)
    n = SHAPES[spec.name][1] if spec.name in SHAPES else None
    _check_groups(args, parties, n)
    return {"task": spec.task, "features": n, "name": spec.name,
            "rows": training_rows(spec.name, getattr(args, "test_fraction", 0.0) or 0.0)}


def _check_groups(args, parties, n_features) -> None:
    from .partition import parse_groups, partition_columns

    if n_features is not None:
        if parties > n_features and not args.feature_groups:
            raise VFLInputError(f"{parties} parties but only {n_features} features in {args.dataset}: every "
                                f"party needs at least one column. Use at most {n_features} parties.")
        partition_columns(n_features, parties, args.partition, seed=args.seed, groups=args.feature_groups)
    elif args.feature_groups:
        groups = parse_groups(args.feature_groups)
        if len(groups) != parties:
            raise VFLInputError(f"--feature-groups gives {len(groups)} groups for {parties} parties: give one "
                                f"group per party, separated by ';'")


def _check_party_files(args, parties, local) -> dict:
    from .loaders import _exists, load_file

    for f in args.party_files:
        _exists(f)
    if not local or sum(_size(f) for f in args.party_files) > PEEK_LIMIT_BYTES:
        return {}
    from .labels import decide_task
    from .party import _check_unique_ids, check_user_table

    cfg = _config(args)
    info = {}
    for i, f in enumerate(args.party_files):
        table = load_file(f, label_column=args.label_column if i == 0 else None, id_column=args.id_column)
        check_user_table(table, cfg)
        _check_unique_ids(table.ids, f, args.id_column, table.first_line)
        if i == 0 and table.y is None and getattr(args, "command", None) == "predict":
            continue                          # rows without labels, scored by a saved model
        if i == 0:
            if table.y is None:
                raise VFLInputError(f"the active party's file {f} has no label column: pass --label-column")
            where = f"column {table.label_name!r} of {f}"
            labels = decide_task(table.y, task=cfg.task, positive_label=cfg.positive_label, where=where,
                                 first_line=table.first_line)
            info = {"task": labels.task, "labels": labels.note, "name": f}
    return info


def _task_refusal(method, tasks, info) -> str:
    what = {"binary": "binary classification", "regression": "regression", "multiclass": "multi-class "
            "classification", "unsupervised": "unlabelled data"}
    can = " and ".join(what.get(t, t) for t in tasks)
    name, task = info.get("name", "the dataset"), info["task"]
    fix = {"multiclass": "pass --positive-label VALUE to train that class against the rest" +
                         (", or --task regression for a numeric target" if "regression" in tasks else ""),
           "regression": "pass --positive-label VALUE (binary: VALUE against the rest)",
           "unsupervised": "name the label column with --label-column"}.get(task, "pick another dataset")
    note = f" ({info['labels']})" if info.get("labels") else ""
    return f"{method} does {can}; {name} is a {task} task{note}: {fix} (see `vfl datasets` for named ones)"

