"""``vfl fdskl``: train and evaluate FDSKL across the parties.

    vfl fdskl --dataset breast_cancer --parties 3          # `make demo`
    vfl fdskl --dataset a9a --parties 4 --epochs 5 --output-json results/a9a.json --logdir runs/a9a

Every party loads its own columns (``--scale minmax`` by default: FDSKL
assumes normalised columns), the active party holds the labels. Training
curves (mini-batch loss, full training loss, held-out error against
iterations, training milliseconds and kilobytes sent) go to TensorBoard with
``--logdir``; the JSON record holds the metrics, the curve, sigma, the number
of random features and the training bytes per party and per iteration.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import warnings

from ..cli import Command
from ..devices import to_host, to_numpy

# The choices the parser offers, declared here so that `vfl fdskl --help` and option errors import no torch;
# tests/test_startup.py checks that they equal the library's (random_features.KERNELS, losses.LOSSES).
KERNELS = ("rbf", "laplace")
LOSSES = ("logistic", "smooth_hinge", "square")
SUPPORTS = ("public", "alpha")          # compress.SUPPORTS
IF_FAITHFUL = "if-faithful"            # compress.IF_FAITHFUL, the estimator's default compress_to
PREDICT_RINGS = (20, 24, 32)            # shared.PREDICT_RINGS
SIGMA_GRID = (2.0 ** -0.5, 1.0, 2.0 ** 0.5, 2.0)     # estimator.SIGMA_GRID


def _sigma(text: str):
    if text == "median":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sigma takes a positive number or 'median', got {text!r}") from None


def _mask_seed(text: str):
    if text in ("random", "seed"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mask-seed takes 'random', 'seed' or an integer, got {text!r}") from None


def _n_components(text: str):
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n-components takes a positive integer or 'none', got {text!r}") from None


def _compress_to(text: str):
    low = text.lower()
    if low in ("auto", IF_FAITHFUL) or (low.startswith(IF_FAITHFUL + ":") and low[12:].isdigit()):   # compress.py
        return low
    try:
        return _n_components(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--compress-to takes 'if-faithful', 'auto', a positive integer or 'none', "
                                         f"got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("FDSKL")
    g.add_argument("--protocol", choices=["shared", "sealed", "paper"], default="sealed",
                   help="'sealed' (default): the coefficients and gradients stay in shares between the active "
                        "party and a passive holder, the active party learns f on its batch rows and, once, the "
                        "trained coefficients (momentum SGD; the width selection runs under it too, no "
                        "compression; a dealer process is started). 'shared': phases masked by a dealer's fresh "
                        "masks, but the active party is opened the gradient sums, which give it passive columns "
                        "(issue 35). 'paper': Gu et "
                        "al.'s masked phases, which let the active party rebuild the passive columns (for "
                        "reproducing the paper only)")
    g.add_argument("--kernel", choices=KERNELS, default="rbf", help="shift-invariant kernel of the random features")
    g.add_argument("--sigma", type=_sigma, default="median",
                   help="kernel width, or 'median': the median heuristic over all parties' columns (a secure sum)")
    g.add_argument("--loss", choices=sorted(LOSSES), default=None,
                   help="loss (the paper's Table 1); default logistic for classification, square for regression")
    g.add_argument("--lam", "--lambda", dest="lam", type=float, default=None,
                   help="regularisation lambda (default for classification: D / (30 n) under 5,000 training rows, "
                        "else 1e-5; regression: 1e-5)")
    g.add_argument("--gamma", type=float, default=None,
                   help="step size; default for the bounded model with --solver adam: Adam rate = the loss step / 320 (logistic 0.05), else per loss: "
                        "logistic 16, smooth hinge 4, square 1 (constant)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="rows B per iteration (B = 1: the paper); default n / 32 clipped to [32, 1024]")
    g.add_argument("--features-per-step", type=int, default=32,
                   help="random features r per block (r = 1: the paper); the growing model adds a block per "
                        "iteration, the bounded one has n_components / r blocks")
    g.add_argument("--n-components", type=_n_components, default=1536, metavar="D",
                   help="random features D of the bounded model (default 1536): O(n D) per epoch, O(m D) to "
                        "score m rows; 'none': the paper's model, which grows by r features per iteration")
    g.add_argument("--compress-to", type=_compress_to, default=IF_FAITHFUL, metavar="D'",
                   help="bounded model with adam: after training keep D' of the D features (see "
                        "--compress-support) and distil the model into them (--compress-epochs passes, default 1), "
                        "so that scoring m rows costs O(m D') ('auto': 496 at --predict-bits 24 (544 at 20, 432 "
                        "at 32) from 2 D training rows on: a9a's test rows under 100 MB at Q = 4). Default "
                        "'if-faithful': 'auto', then keep the distilled model only if it is as good as the full one "
                        "on 3,000 training rows (the active party's decision, one label-dependent bit to every "
                        "party and the dealer); 'if-faithful:N': N features, checked; 'none' or an integer avoids "
                        "that bit")
    g.add_argument("--compress-support", choices=SUPPORTS, default="public",
                   help="which D' features --compress-to keeps: 'public' (default): a random subset drawn from "
                        "the public seed, independent of the data and labels; 'alpha': the largest |alpha_j| "
                        "(more accurate, but every party and the dealer learn which features the labels made "
                        "important: a label-dependent leak)")
    g.add_argument("--calibration", type=float, default=None, metavar="FRACTION",
                   help="binary logistic: hold out this fraction of the training rows (e.g. 0.1; drawn from the "
                        "public seed) and fit Platt scaling on their decision values at the active party, for "
                        "`vfl predict --output probability` (docs/fdskl.md, *Probabilities*); default: none")
    g.add_argument("--predict-bits", type=int, choices=PREDICT_RINGS, default=24,
                   help="shared protocol: ring width of f's product at prediction (bytes per row and feature at "
                        "Q = 4: 11, 12 (default) or 14; at 24 bits the rms error of f is 1-2e-3 of max |f|, "
                        "docs/fdskl.md)")
    g.add_argument("--product-bits", type=int, choices=[20, 32], default=20,
                   help="shared protocol, bounded model: ring width of training's two products. 20 (default): f in "
                        "Z_2^20 and the gradient sums in Z_2^16, packed (at most 3x the paper's bytes at every Q; "
                        "two runs agree to about 3%% of alpha); 32: both in Z_2^32 (about 0.1%%; 4.5x the paper's "
                        "bytes at Q = 2)")
    g.add_argument("--f-delay", choices=["auto", "0", "1"], default="auto",
                   help="bounded model: f on batch t from the coefficients before step t - 1 (1, with a "
                        "delay-compensated step: one message each way per iteration at Q = 2, the same bytes and openings, about "
                        "20%% less time) or after it (0: the paper's algorithm). auto (the default): 0 "
                        "(docs/design/2026-11-24-fdskl-shared-protocol-cost.md, "
                        "*Delay compensation*: 1 cost credit_default 0.16 point at the defaults)")
    g.add_argument("--compress-epochs", type=float, default=1.0, help="passes of the distillation (default 1)")
    g.add_argument("--solver", choices=["adam", "dsg"], default="adam",
                   help="bounded model: 'adam' (default: Adam steps on all D coefficients, step decayed as "
                        "1/sqrt(epoch), averaged iterates) or 'dsg' (the paper's constant step on one block)")
    g.add_argument("--epochs", type=float, default=None,
                   help="passes over the training rows (default 4; for classification 16 under 5,000 training rows), "
                        "unless --time-budget is given alone")
    g.add_argument("--sigma-grid", type=float, nargs="+", default=list(SIGMA_GRID), metavar="C",
                   help="with --sigma median: multipliers of the median width tried on a held-out split of the "
                        "training rows before training (n >= 5000; default 0.707 1 1.414 2; the passive parties "
                        "learn which one won: 2 bits) under every protocol; '--sigma-grid 1' keeps the median "
                        "width")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop training after this many seconds (with --epochs: whichever comes first)")
    g.add_argument("--schedule", choices=["cached", "paper"], default="cached",
                   help="'paper' (needs --protocol paper): phases of the batch on all features every iteration "
                        "(O(B t r) values); "
                        "'cached': phases of all rows on the new features (O(n r)), f kept at the active party")
    g.add_argument("--prefetch", type=int, default=1, metavar="K",
                   help="cached schedule: fetch the new features of K iterations in one round of masked sums "
                        "(same values and bytes, K times fewer synchronisations; the time budget is checked "
                        "once per round)")
    g.add_argument("--angle-bits", type=int, choices=[16, 32, 64], default=16,
                   help="fixed-point angle width of the masked phases (16: half the bytes, features within 1e-4; "
                        "--protocol shared uses 16)")
    g.add_argument("--mask-seed", type=_mask_seed, default="random",
                   help="each party's private masks (and, with --protocol paper, phases): 'random' (default: from "
                        "the OS, per party), 'seed' (derived from --seed: a reproducible simulation in which any "
                        "party could recompute them: NO privacy guarantee) or an integer")
    g.add_argument("--precision", choices=["float64", "float32"], default="float64",
                   help="floating-point type of the projections and coefficients")
    g.add_argument("--monitor-rows", type=int, default=2000,
                   help="held-out rows for the learning curve (0: none, -1: all)")
    g.add_argument("--log-every", type=int, default=None, help="iterations between curve points (default: ~50 points)")
    from ..cli import add_save_argument

    add_save_argument(p)
    from ..cli import add_checkpoint_argument

    add_checkpoint_argument(p, " (bounded model, every protocol; binary or regression; the dealer its own DIR "
                               "too)")


def _show_warnings(caught, *, quiet: bool) -> None:
    """A protocol's leak warning as one line on stderr (each text once; none under --quiet, which asked for no
    summary); every other warning as Python shows it."""
    from .estimator import LeakWarning

    seen = set()
    for w in caught:
        if issubclass(w.category, LeakWarning):
            text = str(w.message)
            if not quiet and text not in seen:
                print(f"vfl: warning: {text}", file=sys.stderr, flush=True)
            seen.add(text)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _wants_dealer(args) -> bool:
    """The shared protocol needs a dealer process, unless there is one party (plain DSG, no protocol)."""
    from ..cli import parties_beside_a_dealer

    return args.protocol in ("shared", "sealed") and parties_beside_a_dealer(args) > 1


def _guarantee(args, parties: int) -> str:
    if parties == 1:
        return "centralised: no protocol, nothing crosses a wire"
    if args.mask_seed != "random":
        return ("NONE: --mask-seed derives the masks from a seed (reproducible simulation); any party that "
                "knows it can remove them")
    if args.protocol == "paper":
        return ("WEAK: protocol 'paper' gives the active party the phases of every row it evaluates, from which "
                "it can rebuild the passive columns (docs/fdskl.md)")
    return ("shared: the active party learns f on its batch rows, gradient sums and f on predicted rows; "
            "semi-honest parties, a non-colluding dealer (docs/fdskl.md)")


def _estimator(fed, args, task: str):
    """The estimator the command trains: one place for the option -> hyperparameter mapping."""
    from .estimator import FDSKLClassifier, FDSKLRegressor

    # (classification: the estimator's 'auto', which follows the rows: small_data.py; regression: 4 and 1e-5)
    auto = "auto" if task != "regression" else None
    epochs = args.epochs if args.epochs is not None else (None if args.time_budget is not None else (auto or 4.0))
    lam = args.lam if args.lam is not None else (auto or 1e-5)
    Estimator = FDSKLRegressor if task == "regression" else FDSKLClassifier      # multiclass: one-vs-rest
    extra = {} if task == "regression" else {"calibration": getattr(args, "calibration", None)}
    return Estimator(fed, **extra, kernel=args.kernel, sigma=args.sigma, loss=args.loss, lam=lam, gamma=args.gamma,
                     batch_size=args.batch_size, features_per_step=args.features_per_step, epochs=epochs,
                     max_time=args.time_budget, schedule=args.schedule, random_state=args.seed,
                     mask_seed=args.mask_seed, angle_bits=args.angle_bits, log_every=args.log_every,
                     prefetch=args.prefetch, protocol=args.protocol, device=args.device,
                     n_components=args.n_components, solver=args.solver,
                     sigma_grid=tuple(getattr(args, "sigma_grid", None) or (1.0,)), compress_to=args.compress_to,
                     compress_epochs=args.compress_epochs, product_bits=args.product_bits,
                     compress_support=args.compress_support, predict_bits=args.predict_bits,
                     f_delay=args.f_delay if args.f_delay == "auto" else int(args.f_delay))


def check(args, info: dict) -> None:
    """Hyperparameters, in the launching process before any party starts (where the launcher does not know
    the task, the square loss is checked as a regressor and every other loss as a classifier)."""
    from ..data.validation import VFLInputError
    from .checks import check_hyperparameters

    if info.get("task") == "multiclass" and getattr(args, "save_model", None) and args.protocol == "paper":
        raise VFLInputError("--save-model keeps a multi-class (one-vs-rest) FDSKL model trained with --protocol "
                            "shared only (under --protocol paper each class has its own private phase keys): "
                            "drop --save-model or --protocol paper")
    task = info.get("task") if info.get("task") in ("binary", "regression") else (
        "regression" if args.loss == "square" else "binary")
    check_hyperparameters(_estimator(None, args, task))


def run(fed, data, args, log):
    import numpy as np
    import torch

    from ..data.validation import VFLInputError

    if fed.is_coordinator:
        return _run_dealer(fed, args)
    if data.task not in ("binary", "regression", "multiclass"):
        raise VFLInputError(f"FDSKL does classification and regression; {data.dataset} is a {data.task} "
                            f"task. Pick a classification or regression dataset (see `vfl datasets`).")
    dtype = getattr(torch, args.precision)
    X_train, X_test = data.X_train.to(dtype), None if data.X_test is None else data.X_test.to(dtype)
    est = _estimator(fed, args, data.task)
    if fed.coordinator is not None and fed.is_active:
        fed.send_json(data.task, fed.coordinator)   # the dealer builds the same estimator (regression: no classes)
    monitor = None
    if X_test is not None and args.monitor_rows != 0:
        m = data.n_test if args.monitor_rows < 0 else min(args.monitor_rows, data.n_test)
        rows = np.sort(np.random.default_rng(args.seed + 17).permutation(data.n_test)[:m])
        monitor = (X_test[rows], None if data.y_test is None else data.y_test[rows])
    from .estimator import LeakWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LeakWarning)
        est.fit(X_train, data.y_train, columns=data.columns, monitor=monitor, log=log, progress=True,
                checkpoint=args.checkpoint)
    _show_warnings(caught, quiet=args.quiet)
    if getattr(est, "resumed_from_", 0) and (fed.is_active or args.federation):
        print(f"vfl: {fed.name()} resumed after iteration {est.resumed_from_} from its checkpoint in "
              f"{args.checkpoint}", file=sys.stderr, flush=True)
    from ..comm.start import profile_mark

    profile_mark(f"party{fed.rank}_trained")
    metrics = {}
    if fed.coordinator is not None and fed.is_active:
        fed.send_json(X_test is not None, fed.coordinator)   # the dealer takes part in prediction too
    if X_test is not None:
        f = est.decision_function(X_test)
        if f is not None:
            if data.task == "multiclass":
                pred = est.classes_[to_numpy(torch.as_tensor(f).argmax(dim=1))]     # f: rows x classes
                metrics["test_accuracy"] = float(np.mean(pred == to_numpy(data.y_test)))
                metrics["test_error"] = 1.0 - metrics["test_accuracy"]
            else:
                metrics.update(_test_metrics(f, data.y_test, data.task))
    from ..saving import save_estimator

    model_id = save_estimator(fed, args, data, est)
    if not fed.is_active:
        return None
    if np.isfinite(est.train_loss_):               # the shared protocol never opens f on all training rows
        metrics["train_loss"] = est.train_loss_
    metrics["batch_loss"] = est.batch_loss_
    metrics["bytes_per_iteration"] = est.comm_["bytes_per_iteration"]
    alpha = to_numpy(est.alpha_, np.float64)          # (tobytes: C order, as the contiguous tensor's)
    return {"metrics": metrics, "train_seconds": est.train_seconds_, "task": data.task,
            "privacy_guarantee": _guarantee(args, fed.num_parties),
            "fdskl": {"protocol": args.protocol if fed.num_parties > 1 else "centralised",
                      "alpha_sha256": hashlib.sha256(alpha.tobytes()).hexdigest(), "sigma": est.sigma_,
                      "sigma_seconds": est.sigma_seconds_,
                      "sigma_multiplier": getattr(est, "sigma_multiplier_", 1.0),
                      "sigma_selection": getattr(est, "sigma_scores_", None),
                      "selection_seconds": getattr(est, "selection_seconds_", 0.0), "iterations": est.n_iter_,
                      "random_features": est.n_random_features_, "gamma": est._step_size(),
                      # (lam='auto' and epochs='auto' follow the training rows: small_data.py)
                      "lam": _first(est, "lam_"), "epochs": _first(est, "epochs_"),
                      "loss": est._loss().name, "train_comm": est.comm_, "history": est.history_,
                      # compression (compress.py): per class for one-vs-rest; "decision": student or teacher
                      "compress": ([getattr(e, "compress_", None) for e in est.estimators_]
                                   if getattr(est, "estimators_", None) else getattr(est, "compress_", None))},
            **({"model": {"dir": args.save_model, "model_id": model_id}} if model_id else {})}


def _first(est, name: str):
    """A learned attribute of the model, or of its first class's for one-vs-rest (the same for every class)."""
    owner = est.estimators_[0] if getattr(est, "estimators_", None) else est
    return getattr(owner, name, None)


def _run_dealer(fed, args):
    """The coordinator's part of `vfl fdskl --protocol shared`: deal masks and triples; it holds no data."""
    task = fed.recv_json(fed.active)
    est = _estimator(fed, args, "regression" if task == "regression" else "binary")
    est.fit(None, checkpoint=args.checkpoint)
    if fed.recv_json(fed.active):
        est.decision_function()
    from ..saving import save_estimator

    save_estimator(fed, args, None, est)
    return None


def _test_metrics(f, y, task) -> dict:
    import torch

    from .trainer import held_out_metrics

    f, y = to_host(f), to_host(y)                    # (a report: on the host, wherever the party computed)
    out = held_out_metrics(f, y, task, prefix="test_")
    if task == "binary" and len(torch.unique(y)) == 2:
        from sklearn.metrics import roc_auc_score

        out["test_auc"] = float(roc_auc_score(to_numpy(y), to_numpy(f)))
    if task == "regression":
        out["test_rmse"] = float(out["test_mse"] ** 0.5)
    return out


COMMANDS = [
    Command("fdskl", "FDSKL: kernel classification / regression with doubly stochastic random features "
                     "(Gu et al., KDD 2020)", run, add_arguments=add_arguments,
            coordinator=_wants_dealer, data_defaults={"scale": "minmax", "test_fraction": 0.25},
            tasks=("binary", "regression", "multiclass"), server_check=check,
            preload=("vfltorch.kernels.estimator", "vfltorch.kernels.shared", "vfltorch.kernels.protocol",
                     "vfltorch.kernels.checks", "vfltorch.model_store")),
]
