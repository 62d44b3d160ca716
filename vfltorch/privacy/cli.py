"""``vfl dpscd`` (DP-SCD and its variants, vertical) and ``vfl dpsgd`` (the opacus DP-SGD baseline).

    vfl dpscd --dataset phishing --task logistic --variant dual --epsilon 1 --L 100 --C 0.01 --parties 3
    vfl dpsgd --dataset phishing --task logistic --epsilon 1 --batch-size 100 --C 1 --lr 1

Both default to standardised columns (``--scale standard``; the paper scales
each column by its maximum absolute value, ``--scale maxabs``), then each row is
divided by its norm over all parties' columns (``--normalize-rows``, a masked
sum, the paper's preprocessing);
regression labels are centred at the active party. The JSON record carries
``sigma``, ``sample_rate``, ``steps``, ``epsilon`` (spent, towards an outsider,
from opacus), ``delta``, ``epsilon_by_observer``, ``randomness`` (where the
secret randomness came from - OS entropy, never recorded) and
``dp_guarantee`` at the top level; TensorBoard gets the epsilon spent against
epochs. ``--simulate-seed N`` seeds the schedule and the noise: every output
then says that the guarantee is void. The training objective is not private
and is computed only with ``--monitor-objective``.

The common ``--task`` option (the data task of your own file) is replaced in
these two commands by the model: ``ridge``, ``logistic`` or ``svm``; for
your own file the data task is detected from its labels.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..cli import Command, check_key_option, planned_parties
from ..data.validation import VFLInputError
from ..devices import to_numpy

# The parser's choices come from the torch-free config module, so that `vfl dpscd --help` and option errors
# import neither torch nor opacus.
from .config import DEFAULT_MECHANISM, MECHANISMS, PROTOCOLS, TASKS, VARIANTS

# Standardised columns, then unit rows (the sensitivity bound). The paper scales by the maximum absolute
# value (--scale maxabs) instead: on breast_cancer its all-positive unit rows are nearly parallel, so the
# bias-free model needs large coefficients, which a few noisy steps do not reach (docs/dpscd.md, "Defaults";
# the measurements: docs/design/2026-11-24-dpscd-defaults-and-issue-12.md).
DEFAULT_PREPROCESSING = {"scale": "standard", "normalize_rows": True}


# ------------------------------------------------------------------ arguments
def _replace_task_option(p) -> None:
    # The common --task (a user file's data task) would clash with the model's --task: replace it.
    g = p.add_argument_group("model", conflict_handler="resolve")
    g.add_argument("--task", dest="glm", choices=sorted(TASKS), default=None,
                   help="the model: ridge (regression), logistic or svm (L2-SVM, hinge loss); default: ridge for a "
                        "regression dataset, logistic for a binary one")
    p.set_defaults(task=None)


def _common_model_arguments(g) -> None:
    g.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (the paper: 0.1 to 2)")
    g.add_argument("--delta", type=float, default=1e-3, help="privacy budget delta (the paper: 1e-3)")
    g.add_argument("--C", "--clip", dest="C", type=float, default=None,
                   help="clipping bound (DP-SCD: of each coordinate step; DP-SGD: of each per-example gradient); "
                        "default 1 for DP-SGD, 0.01 for DP-SCD, inf for non-private SCD")
    g.add_argument("--lambda", dest="lam", type=float, default=1e-4, help="L2 regularisation lambda")
    g.add_argument("--accountant", choices=MECHANISMS, default=DEFAULT_MECHANISM,
                   help="opacus accountant for the noise calibration and the epsilon spent (prv: the tightest)")
    g.add_argument("--simulate-seed", type=int, default=None,
                   help="seed the batch schedule and the noise (reproducible simulation): the DP guarantee is then "
                        "VOID, and every output says so. Default: OS entropy, never recorded")
    g.add_argument("--monitor-objective", action="store_true",
                   help="log the training objective per epoch (computed from the raw data: NOT private)")
    g.add_argument("--center-labels", action=argparse.BooleanOptionalAction, default=True,
                   help="subtract the training mean from regression labels (the paper's preprocessing)")
    g.add_argument("--label-scale", type=float, default=1.0,
                   help="divide regression labels by this first (e.g. 1e5: cal_housing in units of $100k)")


def _dpscd_arguments(p) -> None:
    _replace_task_option(p)
    from ..cli import add_save_argument

    add_save_argument(p)
    g = p.add_argument_group("DP-SCD")
    g.add_argument("--variant", choices=VARIANTS, default="dual",
                   help="dual: DP-SCD (Algorithm 1); seq: seqDP-SCD (Algorithm 3); primal: primal DP-SCD "
                        "(Algorithm 2: L coordinates over all examples, unit-norm columns, one party only); "
                        "primal-rows: row-batch primal variant (one party); nonprivate: SCD")
    g.add_argument("--L", "--batch-size", dest="L", type=int, default=100, help="mini-batch size L (primal: coordinates per step)")
    g.add_argument("--epochs", type=float, default=10, help="passes over the training rows")
    g.add_argument("--sampling", choices=["poisson", "shuffle"], default=None,
                   help="batch sampling (default: poisson for dual/primal, shuffle for seq/nonprivate)")
    g.add_argument("--newton-steps", type=int, default=1, help="Newton steps per logistic coordinate step")
    g.add_argument("--vertical-protocol", choices=PROTOCOLS, default="shared",
                   help="shared (default): passive parties get only noisy updates; a dealer with no data deals "
                        "correlated randomness (a coordinator process is started on one machine; across "
                        "organisations the federation file lists a dealer); encrypted: the same guarantee with "
                        "Paillier (the active party's key) and no dealer, 40-150x slower; paper: the paper's "
                        "protocol, which sends the clipped steps in the clear and leaks labels")
    g.add_argument("--key-bits", type=int, default=2048, help="the active party's Paillier key size")
    g.add_argument("--insecure-key", action="store_true", help="allow Paillier keys under 1024 bits (tests only)")
    g.add_argument("--secure-sum", action="store_true",
                   help="sum partial inner products with ring masks instead of the plain tree (no party sees "
                        "another's partial sums)")
    g.add_argument("--monitor-every", type=int, default=1,
                   help="log epsilon (and the objective, if asked) every this many epochs (0: only at the end)")
    from ..cli import add_checkpoint_argument

    add_checkpoint_argument(g, " (variants dual, seq, nonprivate; DIR holds the noise's generator states)")
    _common_model_arguments(g)


def _dpsgd_arguments(p) -> None:
    _replace_task_option(p)
    from ..cli import add_save_argument

    add_save_argument(p)
    # DP-SGD is the centralised baseline: one party unless told otherwise.
    p.set_defaults(parties=1)
    g = p.add_argument_group("DP-SGD (opacus)")
    g.add_argument("--batch-size", type=int, default=100, help="expected batch size (Poisson sampling)")
    g.add_argument("--lr", type=float, default=2.0, help="learning rate eta (unit-norm rows: gradients are small)")
    g.add_argument("--epochs", type=int, default=10, help="passes over the training rows")
    g.add_argument("--non-private", action="store_true", help="plain mini-batch SGD (no clipping, no noise)")
    _common_model_arguments(g)


# ---------------------------------------------------------------------- runs
def resolve_task(glm: str | None, data_task: str) -> str:
    """The model for the data: checked at every party (each knows the data's task), so all fail alike."""
    if glm is None:
        if data_task == "regression":
            return "ridge"
        if data_task == "binary":
            return "logistic"
        raise VFLInputError(f"DP-SCD handles regression (ridge) and binary tasks (logistic, svm); this dataset "
                            f"is {data_task}")
    if glm in ("logistic", "svm") and data_task != "binary":
        raise VFLInputError(f"--task {glm} needs binary labels, but the dataset is a {data_task} task: use "
                            f"--task ridge for a regression target, or a binary dataset")
    return glm


def prepare_labels(data, task: str, args):
    """Labels at the active party: regression targets scaled and centred on the training mean."""
    from .glm import make_glm

    if data.y_train is None:
        return None, None, {}
    y_train, y_test = data.y_train, data.y_test
    info = {}
    if make_glm(task).kind == "regression":
        if not args.label_scale > 0:
            raise VFLInputError(f"--label-scale must be positive, got {args.label_scale}")
        y_train = y_train / args.label_scale
        y_test = None if y_test is None else y_test / args.label_scale
        mean = float(y_train.mean()) if args.center_labels else 0.0
        y_train = y_train - mean
        y_test = None if y_test is None else y_test - mean
        info = {"label_scale": args.label_scale, "label_mean": mean}
    return y_train, y_test, info


def test_metrics(glm, margins, y, label_scale: float = 1.0) -> dict:
    """Held-out metrics from the margins x^T theta (at the active party)."""
    import torch

    from ..devices import to_host

    m, yy = to_host(margins, torch.float64), to_host(y, torch.float64)     # (a report: on the host)
    out = {"test_loss": float(glm.loss(m, yy).mean())}
    if glm.kind == "regression":
        mse = float(((m - yy) ** 2).mean())
        out["test_mse"] = mse
        out["test_mse_original_units"] = mse * label_scale ** 2
        var = float(((yy - yy.mean()) ** 2).mean())
        out["test_r2"] = 1.0 - mse / var if var > 0 else float("nan")
    else:
        from sklearn.metrics import roc_auc_score

        out["test_accuracy"] = float(((m > 0).to(torch.float64) * 2 - 1 == yy).to(torch.float64).mean())
        if len(torch.unique(yy)) == 2:
            out["test_auc"] = float(roc_auc_score(to_numpy(yy), to_numpy(m)))
    return out


def _epoch_logger(log, simulated: bool = False):
    from .randomness import VOID_TAG

    prefix = VOID_TAG if simulated else ""

    def on_epoch(record):
        if record.get("objective") is not None:
            log.scalar(prefix + "objective/primal_NOT_PRIVATE", record["objective"], record["epoch"])
        if record.get("epsilon") is not None:
            log.scalar(prefix + "privacy/epsilon_spent", record["epsilon"], record["epoch"])
    return on_epoch


def _guarantee(fed, log, simulated: bool, private: bool) -> dict:
    """What every output says about the DP guarantee; the console and TensorBoard hear it too."""
    from .randomness import VOID_NOTE, VOID_TAG

    if not private:
        return {"dp_guarantee": "none (non-private run)"}
    if not simulated:
        return {"dp_guarantee": "holds for the epsilon stated per observer"}
    if fed.is_active:
        print(f"WARNING: {VOID_NOTE}", file=sys.stderr, flush=True)
        log.scalar(VOID_TAG + "guarantee_void", 1.0, 0)
    return {"dp_guarantee": "VOID: " + VOID_NOTE}


def _dpscd_config(args, task: str):
    """The DP-SCD configuration the options describe: one mapping for the launcher's check and the run."""
    from .config import DPSCDConfig

    C = args.C if args.C is not None else (math.inf if args.variant == "nonprivate" else 0.01)
    return DPSCDConfig(task=task, variant=args.variant, epsilon=args.epsilon, delta=args.delta, L=args.L, C=C,
                       lam=args.lam, epochs=args.epochs, accountant=args.accountant, sampling=args.sampling,
                       newton_steps=args.newton_steps, protocol=args.vertical_protocol, key_bits=args.key_bits,
                       insecure_key=args.insecure_key)


def _check_label_options(args, info: dict) -> str:
    """The model for the dataset's task (when the launcher knows it) and the label options; returns the model."""
    task = resolve_task(args.glm, info["task"]) if info.get("task") in ("binary", "regression") else (
        args.glm or "logistic")
    if not (math.isfinite(args.label_scale) and args.label_scale > 0):
        raise VFLInputError(f"--label-scale must be a positive number, got {args.label_scale:g}")
    return task


def _dpscd_check(args, info: dict) -> None:
    """Before any party starts, without torch: the configuration (config.validate, as at the parties), the
    variant against the parties, the batch against the training rows and the Paillier key size."""
    from .config import check_batch, check_primal_parties, check_vertical, validate

    cfg = _dpscd_config(args, _check_label_options(args, info))
    validate(cfg)
    if args.monitor_every < 0:
        raise VFLInputError(f"--monitor-every must be >= 0 (0: only at the end), got {args.monitor_every}")
    parties = planned_parties(args)
    if cfg.variant in ("primal", "primal-rows") and parties is not None:
        check_primal_parties(parties)
    if args.checkpoint is not None:
        from .solver import RESUMABLE

        if cfg.variant not in RESUMABLE:
            raise VFLInputError(f"--checkpoint: the {cfg.variant} variant runs on one machine and is not resumed; "
                                f"checkpoints are for the variants {', '.join(RESUMABLE)}")

    if parties is not None:
        check_vertical(cfg, parties)
    if cfg.variant != "primal" and info.get("rows"):
        check_batch(cfg.L, info["rows"])
    if cfg.private and cfg.protocol == "encrypted" and parties != 1:
        check_key_option(cfg.key_bits, cfg.insecure_key)
    if cfg.private and cfg.sigma is None and info.get("rows"):
        announce_steps(cfg.epochs * info["rows"] / max(1, cfg.L), cfg.accountant)


# Noisy steps beyond which the noise calibration before the first step takes long (PRV at 2 * 10^4 steps: 6 s on the
# 2-core machine; at 2 * 10^6 (issue 36: --epochs 100000): minutes): said before the parties start.
SLOW_CALIBRATION_STEPS = 100_000


def announce_steps(steps: float, accountant: str) -> None:
    """One line on stderr when the noise calibration for ``steps`` noisy steps will keep the run silent a while."""
    if steps > SLOW_CALIBRATION_STEPS:
        print(f"vfl: note: about {steps:,.0f} noisy steps: calibrating their noise ({accountant} accountant) takes "
              f"minutes before the first step, and the noise per step grows with their number; fewer --epochs start "
              f"sooner",
              file=sys.stderr, flush=True)


def _dpscd(fed, data, args, log):
    from .glm import make_glm
    from .solver import fit_glm
    from .vertical import ActiveLink

    if fed.is_coordinator:
        # The dealer of --vertical-protocol shared: no data; it deals each step's correlated randomness.
        from ..saving import save_arrays

        fit_glm(fed, None, None, _dpscd_config(args, args.glm or "logistic"))
        save_arrays(fed, args, None, "dpscd", arrays={}, state={})
        return None
    task = resolve_task(args.glm, data.task)
    cfg = _dpscd_config(args, task)
    C = cfg.C
    simulated = args.simulate_seed is not None
    y_train, y_test, label_info = prepare_labels(data, task, args)
    bar = log.progress(total=None, desc=f"dpscd {args.variant}", unit="step")
    try:
        result = fit_glm(fed, data.X_train, y_train, cfg, simulation_seed=args.simulate_seed,
                         secure=args.secure_sum, monitor_every=args.monitor_every,
                         monitor_objective=args.monitor_objective, on_epoch=_epoch_logger(log, simulated),
                         progress=bar, checkpoint_dir=args.checkpoint)
    finally:
        bar.close()
    if result.resumed_from and (fed.is_active or args.federation):
        print(f"vfl: {fed.name()} resumed after step {result.resumed_from} of {result.steps} from its checkpoint "
              f"in {args.checkpoint}", file=sys.stderr, flush=True)
    guarantee = _guarantee(fed, log, simulated, cfg.private)
    glm = make_glm(task)
    link = ActiveLink(fed, secure=args.secure_sum)
    objective = None
    if args.monitor_objective and fed.is_active and result.history:
        objective = result.history[-1].get("objective")
    margins = None
    if data.X_test is not None:
        with fed.phase("dpscd/predict"):
            margins = link.sum_at_active(data.X_test @ result.theta)
    from ..saving import save_arrays

    # theta is the private release (this party's block); labels' scaling and encoding at the active party.
    model_id = save_arrays(fed, args, data, "dpscd", arrays={"theta": to_numpy(result.theta)},
                           state={"epsilon": result.epsilon, "delta": result.delta,
                                  "dp_guarantee": guarantee.get("dp_guarantee")},
                           command={"glm": task, "secure_sum": bool(args.secure_sum), **label_info})
    if result.checkpoints is not None:
        result.checkpoints.finish()         # the model is kept; the checkpoints hold the noise's generator states
    if not fed.is_active:
        return None
    metrics = {} if objective is None else {"train_objective_not_private": objective}
    if margins is not None:
        metrics.update(test_metrics(glm, margins, y_test, label_info.get("label_scale", 1.0)))
    return {
        "metrics": metrics,
        "train_seconds": result.train_seconds,
        "sigma": result.sigma,
        "sample_rate": result.sample_rate,
        "steps": result.steps,
        "epsilon": result.epsilon,
        "delta": result.delta,
        "epsilon_by_observer": result.observers,
        "randomness": result.randomness,
        "vertical_protocol": args.vertical_protocol if fed.num_parties > 1 else None,
        **guarantee,
        "epsilon_target": args.epsilon if cfg.private else None,
        "noise_std": result.noise_std,
        "sensitivity": result.sensitivity,
        "accountant": args.accountant if cfg.private else None,
        "sampling": result.sampling,
        "task": task,
        "variant": args.variant,
        "L": args.L,
        "C": C if math.isfinite(C) else None,
        "lambda": args.lam,
        "epochs": args.epochs,
        "history": result.history,
        "resumed_from_step": result.resumed_from,
        **label_info,
        **({"model": {"dir": args.save_model, "model_id": model_id}} if model_id else {}),
    }


def _dpsgd_model(args, task: str):
    """The DP-SGD estimator the options describe: one mapping for the launcher's check and the run."""
    from .dpsgd import DPSGD

    return DPSGD(task=task, private=not args.non_private, epsilon=args.epsilon, delta=args.delta,
                 batch_size=args.batch_size, C=args.C if args.C is not None else 1.0, lr=args.lr, lam=args.lam,
                 epochs=args.epochs, accountant=args.accountant, simulation_seed=args.simulate_seed,
                 device=args.device, monitor_objective=args.monitor_objective)


def _dpsgd_check(args, info: dict) -> None:
    if args.parties not in (None, 1):
        raise VFLInputError(
            f"vfl dpsgd is the centralised DP-SGD baseline (opacus needs the whole model and every column in one "
            f"process), but {args.parties} parties were asked for: run it with --parties 1, or use "
            f"`vfl dpscd --parties {args.parties}` for the vertical method")
    model = _dpsgd_model(args, _check_label_options(args, info))
    model._validate(info.get("rows") or sys.maxsize)      # the estimator's own checks; rows when known
    if getattr(model, "sigma", None) is None and info.get("rows"):
        announce_steps(args.epochs * info["rows"] / max(1, args.batch_size), args.accountant)


def _dpsgd(fed, data, args, log):
    import torch

    from .glm import make_glm

    if fed.num_parties > 1:
        raise VFLInputError(
            f"vfl dpsgd is the centralised DP-SGD baseline (opacus needs the whole model and every column in one "
            f"process), but {fed.num_parties} parties were asked for: run it with --parties 1, or use "
            f"`vfl dpscd --parties {fed.num_parties}` for the vertical method")
    task = resolve_task(args.glm, data.task)
    y_train, y_test, label_info = prepare_labels(data, task, args)
    model = _dpsgd_model(args, task)
    C = model.C
    simulated = args.simulate_seed is not None
    model.fit(to_numpy(data.X_train), to_numpy(y_train))
    for record in model.history_:
        _epoch_logger(log, simulated)(record)
    private = not args.non_private
    guarantee = _guarantee(fed, log, simulated, private)
    glm = make_glm(task)
    metrics = {}
    if args.monitor_objective and model.history_:
        metrics["train_objective_not_private"] = model.history_[-1]["objective"]
    if data.X_test is not None:
        margins = torch.as_tensor(model.decision_function(to_numpy(data.X_test)))
        metrics.update(test_metrics(glm, margins, y_test, label_info.get("label_scale", 1.0)))
    from ..saving import save_estimator

    model_id = save_estimator(fed, args, data, model, command={"glm": task, **label_info})
    return {
        **({"model": {"dir": args.save_model, "model_id": model_id}} if model_id else {}),
        "epsilon_by_observer": {"outsider": {"epsilon": model.epsilon_, "sees": "the released model"}} if private
        else None,
        "randomness": "simulation seed (guarantee void)" if simulated else "os entropy (secret, not recorded)",
        **guarantee,
        "metrics": metrics,
        "train_seconds": model.train_seconds_,
        "sigma": model.sigma_,
        "sample_rate": model.sample_rate_,
        "steps": model.steps_,
        "epsilon": model.epsilon_,
        "delta": model.delta_,
        "epsilon_target": args.epsilon if private else None,
        "noise_std": model.sigma_ * C if private else 0.0,
        "sensitivity": C if private else 0.0,
        "accountant": args.accountant if private else None,
        "task": task,
        "variant": "dpsgd" if private else "sgd",
        "batch_size": args.batch_size,
        "C": C,
        "lr": args.lr,
        "lambda": args.lam,
        "epochs": args.epochs,
        "history": model.history_,
        **label_info,
    }


def _wants_dealer(args) -> bool:
    """The shared vertical protocol needs a dealer process, unless there is one party (no protocol)."""
    from ..cli import parties_beside_a_dealer

    return (getattr(args, "vertical_protocol", None) == "shared" and args.variant == "dual"
            and parties_beside_a_dealer(args) > 1)


COMMANDS = [
    Command("dpscd", "DP-SCD: differentially private stochastic coordinate descent for ridge, logistic regression "
                     "and the L2-SVM over vertically split columns (Damaskinos et al., AAAI 2021)",
            _dpscd, add_arguments=_dpscd_arguments, data_defaults=DEFAULT_PREPROCESSING, tasks=("binary", "regression"),
            check=_dpscd_check, coordinator=_wants_dealer,
            preload=("vfltorch.privacy.glm", "vfltorch.privacy.solver", "vfltorch.privacy.vertical",
                     "vfltorch.privacy.accountant", "vfltorch.model_store")),
    Command("dpsgd", "the DP-SGD baseline (opacus) on DP-SCD's linear model and data; centralised (--parties 1)",
            _dpsgd, add_arguments=_dpsgd_arguments, data_defaults=DEFAULT_PREPROCESSING, tasks=("binary", "regression"),
            check=_dpsgd_check),
]
