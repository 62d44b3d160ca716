"""``vfl hetero-lr``: encrypted vertical logistic regression (Hardy et al.'s SGD, Yang et al.'s SQN).

    vfl hetero-lr --dataset credit_default --optimizer sqn                  # shared model (default protocol)
    vfl hetero-lr --dataset credit_default --protocol paper --optimizer sqn # the paper's Paillier protocol (leaks)
    vfl hetero-lr --dataset credit_default --protocol paper --insecure-plaintext   # no encryption!

Q data parties (the guest, rank 0, holds the labels; the others are hosts;
default Q = 2 as in the paper) plus a coordinator process: with
``--protocol shared`` (default) it deals Beaver triples and the model stays
secret-shared between guest and host until the end; with ``--protocol paper``
it holds the Paillier private key (Hardy / Yang; the host learns its
gradients, which leak labels - the run warns). The defaults are the paper's
setting: an 80/20 split, standardised columns split contiguously (the guest
gets the first half), batch min(1000, training rows), L = 4, S_H = S, stop
when the epoch loss changes by less than 1e-5, 2048-bit keys. TensorBoard
(``--logdir``): training loss and test AUC against epochs, the loss against
protocol rounds and online milliseconds, bytes per epoch. The JSON record
(``--output-json``) holds ``test_auc``, ``train_loss``, ``epochs``, rounds,
seconds and bytes per epoch (per party), the encryption mode and the history.
"""

from __future__ import annotations

import argparse
import sys

from ..cli import Command, check_key_option
from ..data.validation import VFLInputError

# The parser's choices and defaults, declared here so that `vfl hetero-lr --help` imports no torch;
# tests/test_startup.py checks that they equal vfltorch.linear.estimator's.
PROTOCOLS = ("shared", "paper")
OPTIMIZERS = ("sgd", "sqn")
PRECOMPUTE = ("batch", "epoch", "background", "none")
DEFAULT_LR = {"sgd": 0.15, "sqn": 0.3}
DEFAULT_DECAY = {"sgd": 0.0, "sqn": 1.0}


def _number(kind, low, strict, what):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{what} must be {'>' if strict else '>='} {low:g}, got {text}")
        return value
    return parse


def _positive_int(what):
    return _number(int, 0, True, what)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import add_save_argument

    add_save_argument(p)
    g = p.add_argument_group("hetero-LR")
    from ..cli import add_checkpoint_argument

    add_checkpoint_argument(g)
    g.add_argument("--protocol", choices=PROTOCOLS, default="shared",
                   help="shared: the model as additive shares between guest and host, no per-step gradient at any "
                        "party (2 data parties); paper: Hardy / Yang under Paillier (the host learns its gradients, "
                        "which leak labels; the coordinator sees SQN gradients and curvature pairs)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sqn",
                   help="sgd: Hardy et al. 2017; sqn: stochastic quasi-Newton (Yang et al.)")
    g.add_argument("--batch-size", type=_positive_int("--batch-size"), default=None,
                   help="rows |S| per iteration (default: min(1000, training rows); the paper: 1000 or 3000)")
    g.add_argument("--lr", type=_number(float, 0.0, True, "--lr"), default=None,
                   help=f"learning rate (default: {DEFAULT_LR['sgd']} for sgd, {DEFAULT_LR['sqn']} for sqn)")
    g.add_argument("--decay", type=_number(float, 0.0, False, "--decay"), default=None,
                   help=f"step decay per epoch e: lr / (1 + decay e) (default: {DEFAULT_DECAY['sgd']:g} for sgd, "
                        f"{DEFAULT_DECAY['sqn']:g} for sqn)")
    g.add_argument("--decay-sqrt", action="store_true", help="lr / sqrt(1 + decay e) instead")
    g.add_argument("--L", "--update-interval", dest="L", type=_positive_int("--L"), default=4,
                   help="SQN: a curvature pair every L iterations (the first 2L are SGD steps)")
    g.add_argument("--M", "--memory", dest="M", type=_positive_int("--M"), default=10,
                   help="SQN: curvature pairs kept (L-BFGS memory)")
    g.add_argument("--hessian-batch", type=_positive_int("--hessian-batch"), default=None,
                   help="SQN: rows |S_H| per Hessian-vector product (default: the batch size)")
    g.add_argument("--l2", type=_number(float, 0.0, False, "--l2"), default=1e-3,
                   help="L2 penalty lambda (the intercept is not penalised)")
    g.add_argument("--no-intercept", dest="fit_intercept", action="store_false", help="no intercept at the guest")
    g.add_argument("--max-epochs", type=_positive_int("--max-epochs"), default=100,
                   help="stop after this many epochs at the latest")
    g.add_argument("--tol", type=_number(float, 0.0, False, "--tol"), default=1e-5,
                   help="stop when the epoch loss changes by less than this")
    e = p.add_argument_group("encryption")
    e.add_argument("--insecure-plaintext", action="store_true",
                   help="run the same protocol WITHOUT encryption (INSECURE: debugging, cost of encryption)")
    e.add_argument("--key-bits", type=int, default=2048, help="Paillier modulus size")
    e.add_argument("--insecure-key", action="store_true", help="allow keys under 1024 bits (tests only)")
    e.add_argument("--feature-frac-bits", type=int, default=None,
                   help="fractional bits of features in the products (paper: the exponent size, default 16; "
                        "shared: default 10)")
    e.add_argument("--mask-bits", type=int, default=64, help="statistical security of the gradient masks")
    e.add_argument("--precompute", choices=PRECOMPUTE, default="batch",
                   help="obfuscators: made before each iteration or each epoch (timed as offline; with 'epoch' "
                        "raise --timeout), by a background process, or inline")
    e.add_argument("--obfuscation", choices=("djn", "full"), default="djn",
                   help="paper protocol: Paillier obfuscators by DJN's fixed base (fast) or r^n as phe (full)")
    e.add_argument("--crypto-processes", type=_positive_int("--crypto-processes"), default=None,
                   help="paper protocol: processes per party for obfuscators, [[d]]^T X and decryption (default: "
                        "the machine's cores; 1: none)")
    e.add_argument("--packed-features", action="store_true",
                   help="paper protocol, 2 parties: encrypt each party's columns once, packed, instead of "
                        "2 x batch fresh encryptions per batch (same gradients and leakage; much faster epochs)")
    e.add_argument("--mask-seed", type=int, default=None,
                   help="SIMULATION ONLY: seed the masks (reproducible; whoever knows the seed removes them; the "
                        "run warns and its record says it carries no privacy guarantee). Default: OS entropy")
    g.add_argument("--monitor", action=argparse.BooleanOptionalAction, default=False,
                   help="paper protocol only, INSECURE: score the test rows after every epoch for a test-AUC "
                        "curve (hands the guest the host's partial score of every test row per epoch)")


def check(args, info: dict) -> None:
    """Before any process starts: 2 data parties by default (the paper), combinations that cannot work,
    the batch against the training rows where the launcher knows them, then the hyperparameters and key
    size (``_check_hyperparameters``)."""
    from ..comm import under_mpirun, under_torchrun

    spawned = not (args.backend == "mpi" or under_torchrun() or under_mpirun())
    if args.parties is None and spawned:
        args.parties = 2
    if args.protocol == "shared":
        if args.parties is not None and args.parties != 2:
            raise VFLInputError(f"--protocol shared runs between one guest and one host: use --parties 2 (got "
                                f"{args.parties}), or --protocol paper for several hosts")
        if args.insecure_plaintext:
            raise VFLInputError("--insecure-plaintext runs the paper protocol without encryption: add "
                                "--protocol paper")
        if args.monitor:
            raise VFLInputError("--monitor hands the guest the host's partial test scores every epoch; the shared "
                                "protocol refuses it (use --protocol paper on public data)")
    if args.packed_features:
        from .packed_check import check_packed       # torch-free

        problem = check_packed(args.protocol, not args.insecure_plaintext, args.parties)
        if problem:
            raise VFLInputError(problem)
    if not args.insecure_plaintext:
        check_key_option(args.key_bits, args.insecure_key)   # before the estimator: answered without torch
    if info.get("rows"):
        from .batches import batch_too_large      # numpy only: no torch

        if batch_too_large(args.batch_size, info["rows"]):
            raise VFLInputError(batch_too_large(args.batch_size, info["rows"]))


def check_estimator(args, info: dict) -> None:
    """After ``check``, where torch is imported (the parties' fork server): the estimator's hyperparameters."""
    _check_hyperparameters(args)


def _check_hyperparameters(args) -> None:
    """Hyperparameters and key size, in the launching process before any party starts."""
    from .estimator import HeteroLogisticRegression

    HeteroLogisticRegression(
        None, protocol=args.protocol, optimizer=args.optimizer, batch_size=args.batch_size, lr=args.lr, decay=args.decay, L=args.L,
        M=args.M, hessian_batch=args.hessian_batch, l2=args.l2, max_epochs=args.max_epochs, tol=args.tol,
        encryption=not args.insecure_plaintext, key_bits=args.key_bits, insecure_key=args.insecure_key,
        feature_frac_bits=args.feature_frac_bits, mask_bits=args.mask_bits,
        precompute=args.precompute, decay_sqrt=args.decay_sqrt, obfuscation=args.obfuscation,
        crypto_processes=args.crypto_processes, packed_features=args.packed_features)._check_params()


def run(fed, data, args, log_):
    from .estimator import HeteroLogisticRegression

    if data is not None and data.task != "binary":
        raise VFLInputError(f"hetero-lr does binary classification; {data.dataset} is a {data.task} task. Pick a "
                            f"binary dataset (see `vfl datasets`).")
    est = HeteroLogisticRegression(
        fed, protocol=args.protocol, optimizer=args.optimizer, batch_size=args.batch_size, lr=args.lr, decay=args.decay,
        decay_sqrt=args.decay_sqrt, L=args.L, M=args.M, hessian_batch=args.hessian_batch, l2=args.l2,
        fit_intercept=args.fit_intercept, max_epochs=args.max_epochs, tol=args.tol,
        # The loader has already scaled each party's columns as --scale asks (standard by default, with the
        # same routine), and a saved model is scored through that preprocessing: no second scaling here.
        standardize=False, encryption=not args.insecure_plaintext, key_bits=args.key_bits, insecure_key=args.insecure_key,
        feature_frac_bits=args.feature_frac_bits, mask_bits=args.mask_bits, precompute=args.precompute,
        obfuscation=args.obfuscation, crypto_processes=args.crypto_processes,
        packed_features=args.packed_features, random_state=args.seed,
        mask_seed=args.mask_seed, device=args.device)
    X_train = None if data is None else data.X_train
    X_test = None if data is None else data.X_test
    monitor = None
    if data is not None and X_test is not None and args.monitor:
        monitor = (X_test, data.y_test)
    est.fit(X_train, None if data is None else data.y_train, monitor=monitor, log=log_, progress=True,
            checkpoint=args.checkpoint)
    if est.resumed_from_epoch_ and (fed.is_active or args.federation):
        print(f"vfl: {fed.name()} resumed after epoch {est.resumed_from_epoch_} from its checkpoint in "
              f"{args.checkpoint}", file=sys.stderr, flush=True)
    scores = est.decision_function(X_test) if (X_test is not None or fed.is_coordinator) else None
    from ..saving import save_estimator

    model_id = save_estimator(fed, args, data, est)
    if not fed.is_active:
        return None
    metrics = {"train_loss": est.train_loss_, "epochs": est.n_epochs_, "iterations": est.n_iter_}
    if scores is not None and data.y_test is not None:
        metrics.update(_test_metrics(scores, data.y_test))
    history = est.history_
    epochs = max(len(history), 1)
    metrics["rounds"] = history[-1]["rounds"] if history else 0
    metrics["seconds_per_epoch"] = est.train_seconds_ / epochs
    metrics["offline_seconds_per_epoch"] = est.offline_seconds_ / epochs
    metrics["wall_seconds_per_epoch"] = est.wall_seconds_ / epochs
    per_party = {r: sum(h["bytes_per_party"][r] for h in history) / epochs for r in history[0]["bytes_per_party"]} \
        if history else {}
    metrics["bytes_per_epoch"] = sum(per_party.values())
    for r, b in per_party.items():
        metrics[f"bytes_per_epoch_rank{r}"] = b
    return {"metrics": metrics, "train_seconds": est.train_seconds_, "task": data.task,
            "encryption": est.encryption_, "privacy": est.privacy_,
            "hetero_lr": {"protocol": args.protocol, "optimizer": args.optimizer, "lr": est._lr(),
                          "decay": est._decay(),
                          "converged": est.converged_, "setup_seconds": est.setup_seconds_,
                          "offline_seconds": est.offline_seconds_,
                          "online_seconds": est.train_seconds_, "wall_seconds": est.wall_seconds_,
                          "bytes_per_epoch_per_party": per_party,
                          "curvature_pairs": est.n_curvature_pairs_, "timings": est.timings_,
                          "roles": {str(fed.active): "guest", str(fed.coordinator): "coordinator",
                                    **{str(r): "host" for r in fed.parties if r != fed.active}},
                          "history": history},
            **({"model": {"dir": args.save_model, "model_id": model_id}} if model_id else {})}


def _test_metrics(scores, y) -> dict:
    import torch
    from sklearn.metrics import roc_auc_score

    from ..devices import to_host, to_numpy

    scores, y = to_host(torch.as_tensor(scores)), to_host(torch.as_tensor(y))     # (a report: on the host)
    out = {"test_accuracy": float((torch.where(scores >= 0, 1.0, -1.0) == y).double().mean())}
    if len(torch.unique(y)) == 2:
        out["test_auc"] = float(roc_auc_score(to_numpy(y), to_numpy(scores)))
    return out


COMMANDS = [
    Command("hetero-lr", "encrypted vertical logistic regression: SGD (Hardy et al.) or SQN (Yang et al.) with a "
                         "Paillier coordinator", run, add_arguments=add_arguments, coordinator=True,
            data_defaults={"test_fraction": 0.2, "scale": "standard"}, tasks=("binary",), check=check, server_check=check_estimator,
            preload=("vfltorch.linear.estimator", "vfltorch.model_store")),
]
