"""``vfl pca``: VFedPCA, VFedAKPCA and exact federated (kernel) PCA from the command line.

    vfl pca --dataset sonar --parties 3 --method vfedpca --components 1 --topology server \\
            --periods 10 --local-iters 10 --warm-start --weight-scaling --output-json out.json

Every data party loads its own columns (all rows: ``--test-fraction`` is 0
by default for PCA) and fits; with ``--topology server`` a coordinator rank
is started as the server. The JSON record's metrics hold ``distance`` (the
largest sign-aligned Euclidean distance between a federated component and
the pooled one, over the components and, for decentralised topologies, over
the parties), ``distance_unaligned`` (the paper's Dis(V, U)),
``principal_angle_deg``, ``explained_variance_ratio`` (computed federatedly),
``rounds``, ``bytes`` (sent by all ranks during the fit) and ``fit_seconds``;
``history`` lists the distance after every period. TensorBoard
(``--logdir``) gets ``pca/distance`` against the period.

The pooled reference is an evaluation oracle: the active party re-reads the
whole training matrix through the same loader (the simulation can;
a real deployment cannot, and should pass ``--no-evaluate``).
"""

from __future__ import annotations

import argparse

from ..cli import Command, data_config
from ..data.validation import VFLInputError

METHODS = ("vfedpca", "exact", "akpca", "rffkpca")
# The parser's choices, declared here so that `vfl pca --help` and option errors import no torch;
# tests/test_startup.py checks that they equal the library's (exchange.TOPOLOGIES, merge.MERGES,
# kernels.KERNELS, exact.PROTOCOLS, exact.SUM_TOPOLOGIES).
TOPOLOGIES = ("server", "complete", "ring", "star")
MERGES = ("subspace", "paper")
KERNELS = ("linear", "rbf", "poly", "sigmoid")
PROTOCOLS = ("auto", "covariance", "rotated", "krylov")
SUM_TOPOLOGIES = ("tree", "star", "ring")


def _gamma(text: str):
    if text == "scale":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a positive number or 'scale', got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"gamma must be positive, got {text}")
    return value


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import add_save_argument

    add_save_argument(p)
    g = p.add_argument_group("pca")
    g.add_argument("--method", choices=METHODS, default="vfedpca",
                   help="vfedpca: merged local power iterations (the paper); exact: the pooled PCA by federated "
                        "subspace iteration (or, with --kernel, exact kernel PCA); akpca: VFedAKPCA; rffkpca: private "
                        "random-feature RBF kernel PCA (O(n D) memory; features in secret shares, a coordinator rank)")
    g.add_argument("--components", type=int, default=1, metavar="K", help="number of principal components")
    g.add_argument("--topology", choices=TOPOLOGIES, default="server",
                   help="vfedpca/akpca: server-client (a coordinator rank is started) or a decentralised graph")
    g.add_argument("--periods", type=int, default=10, metavar="T", help="vfedpca: communication periods")
    g.add_argument("--local-iters", type=int, default=None, metavar="L",
                   help="local power iterations per period (vfedpca default 10; akpca default: dense eigensolver)")
    g.add_argument("--warm-start", action="store_true", help="vfedpca: Algorithm 3, start from the merged u")
    g.add_argument("--weight-scaling", action="store_true", help="vfedpca/akpca: Algorithm 4")
    g.add_argument("--merge", choices=MERGES, default="subspace",
                   help="vfedpca/akpca: subspace (sign-free: leading eigenvectors of the weighted sum of the local "
                        "projectors) or paper (Algorithm 2's weighted sum of the vectors, sign-dependent)")
    g.add_argument("--include-self", action=argparse.BooleanOptionalAction, default=True,
                   help="decentralised: merge the own eigenvectors with the neighbours' (the reference code does not)")
    g.add_argument("--kernel", choices=KERNELS, default=None,
                   help="akpca (default rbf) or exact kernel PCA (default linear: plain PCA)")
    g.add_argument("--gamma", type=_gamma, default=None,
                   help="kernel gamma: a number, or 'scale' for 1 / (features x variance), as scikit-learn's SVC "
                        "(default: 'scale'; 1 / total features, scikit-learn KernelPCA's default, gave near-constant "
                        "scores on unscaled columns)")
    g.add_argument("--random-features", type=int, default=256, metavar="D",
                   help="rffkpca: number of random Fourier features D")
    g.add_argument("--degree", type=int, default=3, help="poly kernel degree")
    g.add_argument("--coef0", type=float, default=1.0, help="poly / sigmoid kernel offset")
    g.add_argument("--protocol", choices=PROTOCOLS, default="auto",
                   help="exact (linear): auto (covariance when features <= samples, else rotated); covariance "
                        "(secretly rotated columns multiplied pairwise under Beaver triples, one masked d x d sum at "
                        "a coordinator rank, which learns only the normalised spectrum; n x d per party and pair); "
                        "rotated (one masked sum of secretly rotated Gram matrices at a coordinator; n x n per "
                        "party) or krylov (subspace iteration: every party can rebuild the others' Gram matrix, warns)")
    g.add_argument("--covariance-sharing", choices=["holders", "pairwise"], default="holders",
                   help="exact covariance protocol: holders (each party's columns secret-shared between the first two "
                        "parties, which must not collude; about 2x the data at Q = 4) or pairwise (each party's masked "
                        "columns to every other party; no coalition of data parties learns columns; (Q - 1) x the data)")
    g.add_argument("--tol", type=float, default=1e-10, help="exact: relative residual at which to stop")
    g.add_argument("--max-rounds", type=int, default=1000, help="exact: at most this many rounds")
    g.add_argument("--oversample", type=int, default=None, help="exact: extra block columns (default min(10, n - K))")
    g.add_argument("--secure-sum", action=argparse.BooleanOptionalAction, default=True,
                   help="exact: masked ring sums, so no party sees another's part (else a plain --sum-topology sum)")
    g.add_argument("--sum-topology", choices=SUM_TOPOLOGIES, default="tree", help="exact without --secure-sum")
    g.add_argument("--center", action=argparse.BooleanOptionalAction, default=True,
                   help="centre each party's columns (linear PCA)")
    g.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=True,
                   help="compare with the pooled PCA (an oracle that re-reads the whole file; simulation only)")


def build_estimator(args):
    """The estimator that ``vfl pca`` options describe."""
    from .akpca import VFedAKPCA
    from .exact import ExactFederatedPCA
    from .exact_kernel import ExactFederatedKernelPCA
    from .rff_kpca import RandomFeatureKernelPCA
    from .vfedpca import VFedPCA

    kernel = args.kernel
    if args.method == "vfedpca":
        if kernel not in (None, "linear"):
            raise VFLInputError(f"--kernel {kernel} is for --method akpca or exact; vfedpca is linear")
        return VFedPCA(args.components, periods=args.periods, local_iters=10 if args.local_iters is None else
                       args.local_iters, topology=args.topology, warm_start=args.warm_start,
                       weight_scaling=args.weight_scaling, include_self=args.include_self, center=args.center,
                       merge=args.merge, seed=args.seed)
    if args.method == "rffkpca":
        if kernel not in (None, "rbf"):
            raise VFLInputError(f"--kernel {kernel}: rffkpca approximates the RBF kernel only")
        return RandomFeatureKernelPCA(args.components, n_random_features=args.random_features,
                                      gamma=args.gamma or "scale", seed=args.seed)
    if args.method == "akpca":
        return VFedAKPCA(args.components, kernel=kernel or "rbf", gamma=args.gamma or "scale", degree=args.degree,
                         coef0=args.coef0, local_iters=args.local_iters, topology=args.topology,
                         weight_scaling=args.weight_scaling, include_self=args.include_self, merge=args.merge,
                         seed=args.seed)
    if kernel in (None, "linear"):
        return ExactFederatedPCA(args.components, protocol=args.protocol, oversample=args.oversample, tol=args.tol,
                                 max_rounds=args.max_rounds, secure=args.secure_sum, sum_topology=args.sum_topology,
                                 center=args.center, seed=args.seed, covariance_sharing=args.covariance_sharing)
    return ExactFederatedKernelPCA(args.components, kernel=kernel, gamma=args.gamma or "scale", degree=args.degree,
                                   coef0=args.coef0, secure=args.secure_sum, sum_topology=args.sum_topology,
                                   seed=args.seed)


def check(args, info: dict) -> None:
    """Before any party starts, without torch: the counts, the tolerance and --save-model against the method
    (``check_estimator`` then checks the estimator and the components)."""
    import math

    counts = [("--components", args.components, 1), ("--periods", args.periods, 1),
              ("--local-iters", args.local_iters, 1), ("--max-rounds", args.max_rounds, 1),
              ("--oversample", args.oversample, 0), ("--degree", args.degree, 1),
              ("--random-features", args.random_features, 1)]
    for option, value, low in counts:
        if value is not None and value < low:
            raise VFLInputError(f"{option} must be {'a positive integer' if low else 'an integer >= 0'}, got {value}")
    if not (math.isfinite(args.tol) and args.tol > 0):
        raise VFLInputError(f"--tol must be a positive number (the relative residual at which to stop), got {args.tol:g}")
    if getattr(args, "save_model", None) and (args.method == "akpca"
                                                or args.method == "vfedpca" and args.kernel not in (None, "linear")):
        why = ("scores new rows only in the session that fitted it (it has no saved form yet)" if args.method == "akpca"
               else "embeds the training samples only")
        raise VFLInputError(f"--save-model keeps models that score new rows: --method {args.method} {why}; use "
                            f"--method exact (with --kernel for exact kernel PCA, which "
                            f"scores new rows through a masked cross-Gram sum), --method rffkpca (new rows in "
                            f"shares) or drop --save-model")


def check_estimator(args, info: dict) -> None:
    """After ``check``, where torch is imported (the parties' fork server): the estimator the options describe
    (method / kernel combinations) and the components against the dataset's columns and rows."""
    build_estimator(args)          # method / kernel combinations (imports torch: after the plain counts)
    features, rows = info.get("features"), info.get("rows")
    linear = args.method not in ("akpca", "rffkpca") and args.kernel in (None, "linear")
    if features and args.components > features and linear:
        raise VFLInputError(f"--components {args.components} but {info.get('name', args.dataset)} has {features} "
                            f"columns: linear PCA has at most {features} components")
    if rows and args.components > rows:
        raise VFLInputError(f"--components {args.components} but only {rows} training rows: at most {rows} components")


def _wants_server(args) -> bool:
    if args.method == "exact":
        return args.kernel in (None, "linear") and args.protocol != "krylov" and (args.parties or 3) > 1
    if args.method == "rffkpca":
        return (args.parties or 3) > 1
    return args.method in ("vfedpca", "akpca") and args.topology == "server"


def _gather_estimates(fed, est, decentralised: bool):
    """Every data party's final components at the active party (decentralised: they differ)."""
    import torch

    if not decentralised or fed.num_parties == 1:
        return [est._sample_components_] if fed.is_active else None
    n, k = est.n_samples_, est.n_components
    with fed.phase("pca/evaluate"):
        if fed.is_active:
            return [est._sample_components_ if p == fed.rank else fed.recv(p, (n, k), torch.float64, device="cpu")
                    for p in fed.parties]
        if fed.is_data_party:
            fed.send(est._sample_components_, fed.active)
    return None


def _run(fed, data, args, log):
    import torch

    from ..comm import allreduce

    if _wants_server(args) and fed.world_size > 1 and fed.coordinator is None:
        what = (f"--method exact --protocol {args.protocol}" if args.method == "exact" else
                "--method rffkpca" if args.method == "rffkpca" else "--topology server")
        raise VFLInputError(f"{what} needs a coordinator rank: under torchrun start Q + 1 processes")
    est = build_estimator(args).set_params(fed=fed)
    X = None if data is None else data.X_train.to(args.device)
    est.fit(X)
    decentralised = args.method in ("vfedpca", "akpca") and args.topology != "server"
    evaluate = args.evaluate and not args.party_files
    finals = _gather_estimates(fed, est, decentralised) if evaluate else None
    test_ratio = None
    if data is not None and data.X_test is not None and est.linear:
        # Variance of the held-out rows captured by the components: scores through a sum over the parties.
        scores = est.transform(data.X_test.to(args.device))
        part = ((data.X_test.to(args.device, torch.float64) - est._mean_) ** 2).sum().reshape(1)
        with fed.phase("pca/transform"):
            total = allreduce(fed, part, "tree", parties=fed.parties)
        test_ratio = float((scores ** 2).sum() / total) if total > 0 else 0.0
    # --evaluate's oracle (the pooled PCA at the active party: an n^3 eigensolve for kernels) runs while the others
    # wait: announced (Federation.expect_work), and every rank meets at a barrier inside the allowance.
    eval_metrics, evaluation = {}, None
    if evaluate:
        from .linalg import float_work

        n, d = est.n_samples_, est.n_features_total_
        with fed.expect_work(float_work(n * d * d if est.linear else n ** 3), "the pooled reference (--evaluate)"):
            if fed.is_active:
                evaluation = _evaluate(fed, est, args, log, finals, eval_metrics)
            fed.barrier()
    with fed.phase("report"):
        sent = fed.gather_json([getattr(est, "bytes_", 0), getattr(est, "messages_", 0)], fed.active)
    from ..saving import save_estimator

    model_id = save_estimator(fed, args, data, est, fed_arg=True)
    if not fed.is_active:
        return None
    metrics = {"rounds": est.rounds_, "bytes": sum(s[0] for s in sent), "messages": sum(s[1] for s in sent),
               "fit_seconds": est.fit_seconds_}
    if est.linear:
        metrics["explained_variance_ratio"] = float(est.explained_variance_ratio_.sum())
    if test_ratio is not None:
        metrics["test_explained_variance_ratio"] = test_ratio
    record = {"metrics": metrics, "train_seconds": est.fit_seconds_, "pca_method": type(est).__name__}
    if model_id:
        record["model"] = {"dir": args.save_model, "model_id": model_id}
    if getattr(est, "protocol_", None) is not None:
        record["protocol"] = est.protocol_          # exact PCA: the protocol that 'auto' chose
    if getattr(est, "converged_", None) is not None:
        # exact PCA: False when max_rounds stopped it before tol (the estimator also warns)
        record["converged"] = bool(est.converged_)
    if getattr(est, "eigenvalues_", None) is not None:
        record["eigenvalues"] = est.eigenvalues_.tolist()
    if evaluate:
        metrics.update(eval_metrics)
        record.update(evaluation)
    elif args.evaluate:
        record["evaluation"] = "no pooled reference with --party-files (the simulation cannot pool them)"
    return record


def _evaluate(fed, est, args, log, finals, metrics) -> dict:
    """Distances to the pooled PCA (the oracle), per final estimate and along the history."""
    import torch

    from ..comm import Federation
    from ..data import load_party_data
    from .linalg import shared_start
    from .metrics import compare, pooled_kernel_pca, pooled_pca

    pooled = load_party_data(Federation.local("cpu"), data_config(args)).X_train.to(torch.float64)
    k, n = est.n_components, pooled.shape[0]
    if est.linear:
        G, lam = pooled_pca(pooled, k, center=args.center)
        metrics["pooled_explained_variance_ratio"] = float(
            lam.sum() / ((pooled - pooled.mean(0) if args.center else pooled) ** 2).sum())
    else:
        G, lam = pooled_kernel_pca(pooled, k, kernel=est.kernel, gamma=est.gamma_, degree=est.degree,
                                   coef0=est.coef0)
    r = shared_start(n, k, args.seed, 1, device="cpu")
    per_party = [compare(U.cpu(), G, r) for U in finals]
    for key in ("distance", "distance_unaligned", "principal_angle_deg"):
        metrics[key] = max(p[key] for p in per_party)
    if getattr(est, "_local_components_", None) is not None:
        metrics["isolated_distance"] = compare(est._local_components_.cpu(), G, r)["distance"]
    history = []
    for t, U in enumerate(est._history_, start=1):
        c = compare(U.cpu(), G, r)
        history.append({"period": t, **c})
        log.scalar("pca/distance", c["distance"], t)
        log.scalar("pca/distance_unaligned", c["distance_unaligned"], t)
    out = {"history": history, "pooled_eigenvalues": lam.tolist()}
    if len(per_party) > 1:
        out["distance_by_party"] = [p["distance"] for p in per_party]
    return out


COMMANDS = [
    Command("pca", "vertical federated PCA: VFedPCA, VFedAKPCA (Cheung et al.) or exact federated (kernel) PCA",
            _run, add_arguments=_add_arguments, coordinator=_wants_server,
            data_defaults={"test_fraction": 0.0}, check=check, server_check=check_estimator,
            preload=("vfltorch.pca.vfedpca", "vfltorch.pca.akpca", "vfltorch.pca.exact", "vfltorch.pca.exact_kernel",
                     "vfltorch.pca.linalg", "vfltorch.pca.metrics", "vfltorch.model_store")),
]
