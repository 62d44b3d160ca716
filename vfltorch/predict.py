"""``vfl METHOD ... --save-model DIR`` and ``vfl predict --model DIR``: keep a model, score new rows later.

    vfl fdskl --dataset breast_cancer --parties 3 --save-model models/bc
    vfl predict --model models/bc --dataset new_rows.csv --label-column diagnosis --output-csv scores.csv

Training writes one shard per rank under DIR (``vfltorch.model_store``): each
party its own. ``vfl predict`` starts the same federation as training (the same
number of data parties, and the coordinator if training had one: FDSKL's dealer
takes part in scoring, the others only check their shard), through the same launcher (local processes,
torchrun or the same federation file). Every party reads ONLY its own shard
``party-<rank>``, loads ITS columns of the new rows and applies ITS saved
preprocessing (the imputation values and scaling fitted on the training rows,
never refitted); the parties compare model ids before anything else; then the
method's own prediction protocol runs (the same code and messages as the
scoring at the end of training). The active party gets the predictions (with
labels: metrics) and writes them with ``--output-csv``; PCA's scores reach
every data party (the masked sum of ``transform``), the active party writes them.

``--rows all`` (default) scores every row of the given data; ``--rows test``
the held-out rows of training's split (same ``--test-fraction`` and seed as
saved), which reproduces the scores training reported.
"""

from __future__ import annotations

import argparse
import io

import numpy as np

from .cli import SAVE_HELP, Command, add_save_argument  # noqa: F401 - defined in cli.py: no numpy to parse options
from .data.validation import VFLInputError
from .model_store import ModelStoreError, describe, load_collective, settle
from .devices import to_host, to_numpy

# ----------------------------------------------------------------------------------- predict side
def _add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("predict")
    g.add_argument("--model", required=True, metavar="DIR", help="a folder written by `vfl METHOD --save-model DIR`")
    g.add_argument("--rows", choices=["all", "test"], default="all",
                   help="all: score every row of the data given; test: the held-out rows of training's split "
                        "(the same --test-fraction and --seed as saved: reproduces training's test scores)")
    g.add_argument("--output-csv", metavar="PATH", help="the active party writes one line per scored row here")
    g.add_argument("--output", choices=["decision", "probability"], default="decision",
                   help="the score column of --output-csv: decision (the decision value f(x) or margin, as "
                        "before) or probability (P(positive class): FDSKL's Platt-calibrated on rows held out "
                        "in training with `vfl fdskl --calibration`, hetero-lr's and logistic dpscd's the sigmoid "
                        "of the margin); regression and hinge-loss models have no probability")
    g.add_argument("--max-scores-per-row", type=int, default=None, metavar="N",
                   help="this party's scoring policy (every data party but the one that gets the scores): each of "
                        "its rows, keyed by content, is scored at most N times by this model, across runs (a "
                        "ledger beside its shard), and never twice in one request; 0: no policy (INSECURE against "
                        "chosen-input scoring; default: 1)")


def _resolve(args) -> None:
    """``--dataset`` left out: the registered dataset the model was trained on (each party reads its own shard's
    manifest: across organisations each machine holds only its own). A model trained on a file asks for
    ``--dataset FILE`` (with its ``--label-column``) and one trained from ``--party-files`` for the files: a model
    folder supplies model state, never a path or an option of the command."""
    if args.dataset is not None:
        return
    try:
        saved = describe(args.model).get("data") or {}
    except ModelStoreError:
        saved = {}                       # the check names the missing or unreadable model
    from .data.registry import REGISTRY

    # A model folder supplies model state, never a path or an option of this command (issue 36): only a
    # registered dataset's name is taken from it; a model trained on a file needs --dataset FILE again.
    saved = saved if isinstance(saved, dict) else {}
    name = saved.get("dataset")
    args.trained_from_party_files = bool(saved.get("party_files"))
    if isinstance(name, str) and name in REGISTRY:
        args.dataset = name
    elif name is None or args.trained_from_party_files:
        # No data in this shard (a coordinator's; or the model is missing, which the check names), or new party
        # files to come (_check asks for them): a placeholder no party reads.
        args.dataset = "breast_cancer"
    else:
        args.dataset = None                      # trained on a file: the pre-run check asks for --dataset FILE


def _check(args) -> None:
    from .comm import under_mpirun, under_torchrun
    from .data.preflight import check_writable_file
    from .model_store import check_local_shards

    if args.max_scores_per_row is not None and not 0 <= args.max_scores_per_row <= 10 ** 6:
        raise VFLInputError(f"--max-scores-per-row must be between 0 (no limit) and 1000000, got "
                            f"{args.max_scores_per_row}")
    if args.dataset is None:
        raise VFLInputError(f"the model in {args.model} was trained on a file: give the rows to score with "
                            f"--dataset FILE (a saved model never names the files a command reads)")
    local = not (args.federation or args.backend == "mpi" or under_torchrun() or under_mpirun())
    info = check_local_shards(args.model, complete=local)
    parties = info["parties"]
    if args.parties is not None and args.parties != parties:
        raise VFLInputError(f"--parties {args.parties}, but the model in {args.model} was trained by {parties} "
                            f"parties: drop --parties, or give {parties}")
    args.parties = parties
    if getattr(args, "trained_from_party_files", False) and not args.party_files:
        raise VFLInputError(f"the model in {args.model} was trained from --party-files: give each party's file of "
                            f"the rows to score with --party-files FILE ... --id-column NAME (or --dataset)")
    if args.output_csv:
        check_writable_file(args.output_csv, "--output-csv")


def _wants_coordinator(args) -> bool:
    """The federation of training: with its coordinator if it had one (FDSKL's dealer takes part in
    scoring; hetero-LR's key holder and PCA's server only check their shard), so one federation file
    serves training and prediction."""
    try:
        return bool(describe(args.model)["coordinator"])
    except ModelStoreError:
        return False                      # the check reports the missing model


def _data_config(fed, args):
    """This party's data options: the given rows, with the layout and preprocessing of its shard."""
    from .cli import data_config
    from .data.preprocess import ColumnPreprocessing
    from .model_store import model_key, read_shard

    config = data_config(args)
    config.scoring = True
    try:
        manifest, arrays = read_shard(args.model, fed.rank, key=model_key(fed))
    except ModelStoreError:
        return config                     # load_collective names the problem at every party
    saved = manifest.get("data") or {}
    config.partition = saved.get("partition", config.partition)
    config.feature_groups = saved.get("feature_groups", config.feature_groups)
    if args.rows == "test":
        config.test_fraction = float(saved.get("test_fraction") or 0.0)
        config.seed = int(saved.get("seed", config.seed))
    else:
        config.seed = int(saved.get("seed", config.seed))      # a random partition is drawn from it
        if not args.test_dataset:
            config.test_fraction = 0.0
    pre = manifest.get("preprocessing") or {}
    config.preprocessing = ColumnPreprocessing.from_state(pre, arrays)
    config.normalize_rows = bool(pre.get("normalize_rows", False))
    return config


def _rows(fed, data, args):
    if data is None:
        return None, None, None
    if args.rows == "test" or args.test_dataset:
        if data.X_test is None:
            raise VFLInputError("--rows test: the model was trained on every row (test fraction 0): there are no "
                                "held-out rows; score --rows all")
        return data.X_test, data.y_test, None
    ids = data.aligned_ids if data.aligned_ids is not None else None
    return data.X_train, data.y_train, ids


def _run(fed, data, args, log):
    import time

    started = time.perf_counter()
    manifest, arrays = load_collective(fed, args.model)
    problem = None
    if data is not None:
        saved = [int(c) for c in arrays.get("columns", np.zeros(0, dtype=np.int64))]
        mine = [int(c) for c in data.columns]
        if len(saved) != len(mine):
            problem = (f"the data gives this party {len(mine)} columns, its shard was trained on {len(saved)}: "
                       f"give the same columns (and --party-files order) as in training")
        elif saved != mine and not manifest.get("data", {}).get("party_files"):
            problem = (f"the data gives this party columns {mine[:6]}..., its shard was trained on "
                       f"{saved[:6]}...: use the same dataset layout as in training")
    settle(fed, problem)
    X, y, ids = _rows(fed, data, args)
    _apply_scoring_policy(fed, args, manifest, X)
    if y is not None and data.task == "multiclass":
        # Multi-class labels are coded 0..k-1 by the values present in *this* data: compare by value.
        y = np.asarray(data.classes, dtype=object)[to_numpy(y, np.int64)]
    method = manifest.get("method")
    runners = {"fdskl": _predict_fdskl, "hetero-lr": _predict_hetero_lr, "dpscd": _predict_dpscd,
               "dpsgd": _predict_dpsgd, "pca": _predict_pca}
    runner = runners.get(method) if isinstance(method, str) else None
    if runner is None:
        raise ModelStoreError(f"{args.model} holds a model of method {str(method)[:40]!r}, which `vfl predict` "
                              f"cannot score (it scores {', '.join(runners)})")
    out = runner(fed, manifest, arrays, X, y)
    if not fed.is_active:
        return None
    table, metrics = out
    table = _score_column(table, getattr(args, "output", "decision"), method)
    written = None
    if args.output_csv:
        from .runlog import write_atomic

        write_atomic(args.output_csv, _csv(table, ids))
        written = args.output_csv
    n = len(next(iter(table.values()))) if table else 0
    return {"metrics": metrics, "train_seconds": 0.0, "task": manifest.get("data", {}).get("task"),
            "predict": {"model": str(args.model), "model_id": manifest["model_id"], "method": method,
                        "seconds": time.perf_counter() - started,
                        "rows": args.rows, "scored_rows": n, "output_csv": written}}


def _score_column(table: dict, output: str, method: str) -> dict:
    """``--output decision`` (the default): the table as before (the new probability columns left out);
    ``--output probability``: the probability column instead of the decision values."""
    table = dict(table)
    if output == "probability":
        if "probability" not in table:
            raise VFLInputError(f"this {method} model gives no probabilities (a regression, a hinge-loss model, "
                                f"one-vs-rest, or an FDSKL model trained without --calibration, whose sigmoid(f) "
                                f"is nearly always 0 or 1): score it with --output decision, or train with "
                                f"`vfl fdskl --calibration 0.1`")
        table.pop("decision", None)
        return {"probability": table.pop("probability"), **table}      # in the decision column's place
    elif method != "hetero-lr":                       # (hetero-lr's table has had both columns all along)
        table.pop("probability", None)
    return table


def _apply_scoring_policy(fed, args, manifest: dict, X) -> None:
    """Each data party that does not get the scores answers each of its rows at most N times per model
    (``vfltorch.scoring_policy``): the request is refused at every party, naming who refused and why, or the
    rows are counted in the party's ledger before any score leaves it."""
    from .model_store import model_key, shard_dir
    from .scoring_policy import DEFAULT_MAX_SCORES, ScoringLedger, row_keys

    limit = DEFAULT_MAX_SCORES if args.max_scores_per_row is None else int(args.max_scores_per_row)
    guarded = X is not None and fed.is_data_party and not fed.is_active and limit > 0
    if X is not None and fed.is_data_party and not fed.is_active and limit <= 0:
        import warnings

        warnings.warn(f"{fed.name()}: --max-scores-per-row 0: no scoring policy; a party that gets the scores and "
                      f"chooses its own columns can solve for this party's columns from repeated scoring of a row "
                      f"(docs/deployment.md, \"What scoring reveals\")", stacklevel=2)
    problem, ledger, keys = None, None, None
    if guarded:
        try:
            ledger = ScoringLedger.open(shard_dir(args.model, fed.rank), manifest["model_id"])
            keys = row_keys(model_key(fed), manifest["model_id"], X)
            problem = ledger.refusal(keys, limit, fed.name())
        except ValueError as exc:
            problem = str(exc)
    settle(fed, problem)
    if guarded:
        try:
            ledger.record(keys)
        except OSError as exc:
            problem = f"{fed.name()} cannot write its scoring ledger ({exc}): it answers nothing it cannot count"
    settle(fed, problem)


def _csv(table: dict, ids) -> str:
    buf = io.StringIO()
    cols = (["id"] if ids is not None else []) + list(table)
    buf.write(",".join(cols) + "\n")
    n = len(next(iter(table.values())))
    for i in range(n):
        row = ([str(ids[i])] if ids is not None else []) + [_fmt(table[c][i]) for c in table]
        buf.write(",".join(row) + "\n")
    return buf.getvalue()


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(v.item() if hasattr(v, "item") else v)


def _restore(manifest, arrays, fed, classes: dict):
    from .model_store import restore_estimator

    name = manifest.get("estimator")
    cls = classes.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ModelStoreError(f"the shard names the estimator {str(name)[:40]!r}, which is not one of "
                              f"{', '.join(sorted(classes))}: the model is damaged or not a vfltorch model")
    return restore_estimator(cls, manifest, arrays, fed)


def _labels_out(manifest, signs: np.ndarray) -> np.ndarray:
    """-1 / +1 decisions as the data's own labels where the shard knows them (binary: classes[-1] is +1)."""
    classes = (manifest.get("labels") or {}).get("classes")
    if classes and len(classes) == 2:
        return np.where(signs > 0, classes[1], classes[0]).astype(object)
    return signs


def _predict_fdskl(fed, manifest, arrays, X, y):
    import torch

    from .kernels.cli import _test_metrics
    from .kernels.estimator import FDSKLClassifier, FDSKLRegressor

    est = _restore(manifest, arrays, fed, {"FDSKLClassifier": FDSKLClassifier, "FDSKLRegressor": FDSKLRegressor})
    if X is not None:
        X = X.to(est.feature_map_.dtype)
    f = est.decision_function(X) if not fed.is_coordinator else est.decision_function()
    if not fed.is_active:
        return None
    f = to_host(torch.as_tensor(f))                  # (the report and the table are made on the host)
    task = manifest.get("data", {}).get("task")
    if f.dim() == 2:                                   # one-vs-rest: the class of the largest f
        pred = np.asarray(est.classes_)[to_numpy(f.argmax(dim=1))]
        names = (manifest.get("labels") or {}).get("classes")
        if names:                                      # training's label codes -> the data's own labels
            pred = np.asarray(names, dtype=object)[pred.astype(np.int64)]
        metrics = {}
        if y is not None:
            accuracy = float(np.mean(pred == np.asarray(y, dtype=object)))
            metrics = {"test_accuracy": accuracy, "test_error": 1.0 - accuracy}
        return {"prediction": pred, **({} if y is None else {"label": np.asarray(y, dtype=object)})}, metrics
    metrics = {} if y is None else _test_metrics(f, y, task)
    if task == "binary":
        signs = np.where(to_numpy(f) >= 0, 1.0, -1.0)
        table = {"decision": to_numpy(f), "prediction": _labels_out(manifest, signs)}
        platt = getattr(est, "platt_", None)
        if platt is not None:                         # Platt-calibrated (trained with --calibration)
            table["probability"] = to_numpy(torch.sigmoid(platt[0] * f.to(torch.float64) + platt[1]))
    else:
        table = {"prediction": to_numpy(f)}
    return _with_labels(table, y, manifest), metrics


def _predict_hetero_lr(fed, manifest, arrays, X, y):
    import torch

    from .linear.cli import _test_metrics
    from .linear.estimator import HeteroLogisticRegression

    est = _restore(manifest, arrays, fed, {"HeteroLogisticRegression": HeteroLogisticRegression})
    u = est.decision_function(X) if fed.is_data_party else None
    if not fed.is_active:
        return None
    u = to_host(u)
    metrics = {} if y is None else _test_metrics(u, y)
    signs = np.where(to_numpy(u) >= 0, 1.0, -1.0)
    table = {"decision": to_numpy(u), "probability": to_numpy(torch.sigmoid(u)),
             "prediction": _labels_out(manifest, signs)}
    return _with_labels(table, y, manifest), metrics


def _glm_outputs(manifest, margins: torch.Tensor, y):
    import torch

    from .privacy.cli import test_metrics
    from .privacy.glm import make_glm

    command = manifest.get("command") or {}
    glm = make_glm(command["glm"])
    scale, mean = command.get("label_scale", 1.0), command.get("label_mean", 0.0)
    metrics = {}
    if y is not None:
        yy = to_host(y, torch.float64)
        if glm.kind == "regression":
            yy = yy / scale - mean
        metrics = test_metrics(glm, to_host(margins), yy, scale)
    m = to_numpy(margins, np.float64)
    if glm.kind == "regression":
        table = {"prediction": (m + mean) * scale}
    else:
        table = {"decision": m, "prediction": _labels_out(manifest, np.where(m > 0, 1.0, -1.0))}
        if command["glm"] == "logistic":
            table["probability"] = 1.0 / (1.0 + np.exp(-np.clip(m, -500, 500)))
    return _with_labels(table, y, manifest), metrics


def _predict_dpscd(fed, manifest, arrays, X, y):
    import torch

    from .privacy.vertical import ActiveLink

    if not fed.is_data_party:
        # The shared protocol's dealer: its shard holds no model (it dealt training's randomness only), and scoring
        # is the data parties' sum of their partial margins.
        return None
    theta = torch.as_tensor(arrays["theta"], dtype=torch.float64)
    link = ActiveLink(fed, secure=bool((manifest.get("command") or {}).get("secure_sum", False)))
    with fed.phase("dpscd/predict"):
        margins = link.sum_at_active(X.to(torch.float64) @ theta.to(X.device))
    if not fed.is_active:
        return None
    return _glm_outputs(manifest, margins, y)


def _predict_dpsgd(fed, manifest, arrays, X, y):
    import torch

    from .privacy.dpsgd import DPSGD

    est = _restore(manifest, arrays, fed, {"DPSGD": DPSGD})
    margins = torch.as_tensor(est.decision_function(to_numpy(X)))
    return _glm_outputs(manifest, margins, y)


def _predict_pca(fed, manifest, arrays, X, y):
    import torch

    from .comm import allreduce
    from .pca.akpca import VFedAKPCA
    from .pca.exact import ExactFederatedPCA
    from .pca.exact_kernel import ExactFederatedKernelPCA
    from .pca.rff_kpca import RandomFeatureKernelPCA
    from .pca.vfedpca import VFedPCA

    est = _restore(manifest, arrays, fed, {"VFedPCA": VFedPCA, "ExactFederatedPCA": ExactFederatedPCA,
                                           "VFedAKPCA": VFedAKPCA, "ExactFederatedKernelPCA": ExactFederatedKernelPCA,
                                           "RandomFeatureKernelPCA": RandomFeatureKernelPCA})
    if not fed.is_data_party:
        if isinstance(est, RandomFeatureKernelPCA) and fed.world_size > 1:
            est.transform(None, fed)     # rffkpca: the coordinator deals the new rows' feature products
        return None
    X = X.to(torch.float64)
    scores = est.transform(X, fed)
    if not est.linear:                   # kernel scores: no explained variance of the columns to report
        if not fed.is_active:
            return None
        s = to_numpy(scores)
        return {f"pc{j + 1}": s[:, j] for j in range(s.shape[1])}, {}
    part = ((X - est._mean_.to(X.device)) ** 2).sum().reshape(1)
    with fed.phase("pca/transform"):
        total = allreduce(fed, part, "tree", parties=fed.parties) if fed.num_parties > 1 else part
    if not fed.is_active:
        return None
    total = to_host(total)
    ratio = float(to_host((scores ** 2).sum()) / total) if float(total) > 0 else 0.0
    s = to_numpy(scores)
    return {f"pc{j + 1}": s[:, j] for j in range(s.shape[1])}, {"test_explained_variance_ratio": ratio}


def _with_labels(table: dict, y, manifest) -> dict:
    if y is None:
        return table
    yy = to_numpy(y)
    classes = (manifest.get("labels") or {}).get("classes")
    if classes and len(classes) == 2 and manifest.get("data", {}).get("task") == "binary":
        yy = np.where(yy > 0, classes[1], classes[0]).astype(object)
    return {**table, "label": yy}


COMMANDS = [
    Command("predict", "score new rows with a model saved by `vfl METHOD --save-model DIR` (each party its shard)",
            _run, add_arguments=_add_arguments, coordinator=_wants_coordinator, check=_check,
            data_config=_data_config, data_defaults={"dataset": None}, resolve=_resolve),
]
