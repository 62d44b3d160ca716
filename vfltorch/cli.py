"""The ``vfl`` command (also ``python -m vfltorch``, which torchrun can start as a module).

``vfl METHOD --dataset NAME --parties Q ...`` spawns Q local party processes;
under ``torchrun`` (or ``mpirun`` with ``--backend mpi``) each started process
is one party and nothing is spawned. Either way every party runs
``run_party``: load its own columns, run the method, report its bytes. The
active party writes the JSON record, TensorBoard scalars and the summary.

Methods plug in as ``Command`` objects listed in a ``COMMANDS`` variable of
their package's ``cli`` module (``vfltorch.kernels.cli`` and so on).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from . import __version__

COMMAND_MODULES = ["vfltorch.comm.cli", "vfltorch.kernels.cli", "vfltorch.pca.cli", "vfltorch.privacy.cli", "vfltorch.linear.cli"]


@dataclass
class Command:
    """A ``vfl`` subcommand.

    ``run(fed, data, args, log)`` runs in every party process (``data`` is
    ``None`` at a coordinator) and returns, at the active party, a dict with
    ``metrics`` (flat floats), ``train_seconds`` and any extra top-level keys
    for the JSON record. ``check(args)``, if given, runs once in the launching
    process before any party is started and raises ``VFLInputError`` for
    option combinations that cannot work, so a bad command line fails in
    milliseconds instead of after Q processes have started and loaded data.
    """

    name: str
    help: str
    run: Callable
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None
    coordinator: bool | Callable[[argparse.Namespace], bool] = False
    data_defaults: dict = field(default_factory=dict)
    needs_data: bool = True
    check: Callable[[argparse.Namespace], None] | None = None

    def wants_coordinator(self, args) -> bool:
        return self.coordinator(args) if callable(self.coordinator) else bool(self.coordinator)


def _builtin_commands() -> list[Command]:
    from .data.cli import COMMANDS
    return list(COMMANDS)


def discover_commands() -> dict[str, Command]:
    commands = {c.name: c for c in _builtin_commands()}
    for module in COMMAND_MODULES:
        if importlib.util.find_spec(module) is None:
            continue
        for c in getattr(importlib.import_module(module), "COMMANDS", []):
            commands[c.name] = c
    return commands


def add_common_arguments(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    d = {"test_fraction": 0.25, "scale": "none", "normalize_rows": False, **(defaults or {})}
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="breast_cancer",
                   help="a registered name (see `vfl datasets`) or the path of a LIBSVM or CSV file "
                        "(default: breast_cancer, bundled with scikit-learn)")
    g.add_argument("--test-dataset", help="a separate test file for --dataset PATH")
    g.add_argument("--data-dir", help="folder of the named datasets (default: $VFLTORCH_DATA, else ../shared/data)")
    g.add_argument("--label-column", help="label column of a CSV file (name, or index)")
    g.add_argument("--positive-label", help="label value of the positive class for a binary task on your own file")
    g.add_argument("--task", choices=["binary", "regression", "multiclass"], help="task of your own file")
    g.add_argument("--id-column", help="ID column that aligns the rows of --party-files")
    g.add_argument("--party-files", nargs="+", default=[], metavar="FILE",
                   help="one file per party (party r reads only the r-th), rows matched on --id-column")
    g.add_argument("--partition", choices=["contiguous", "random", "explicit"], default="contiguous",
                   help="how the columns are split between parties (default: contiguous)")
    g.add_argument("--feature-groups", help="explicit column groups per party, e.g. '0-9;10-17;18-22'")
    g.add_argument("--test-fraction", type=float, default=d["test_fraction"],
                   help=f"held-out fraction when there is no test file (default: {d['test_fraction']})")
    g.add_argument("--impute", choices=["none", "median", "mean"], default=None,
                   help="fill NaN per column (default: the dataset's own default, else none)")
    g.add_argument("--scale", choices=["none", "minmax", "standard", "maxabs"], default=d["scale"],
                   help=f"per-party column scaling fitted on training rows (default: {d['scale']})")
    g.add_argument("--clip-values", type=float, default=None, metavar="C",
                   help="after scaling, winsorise every value to [-C, C] (each party, its own columns)")
    g.add_argument("--normalize-rows", action=argparse.BooleanOptionalAction, default=d["normalize_rows"],
                   help="divide each row by its L2 norm over all parties (a masked sum)")
    f = p.add_argument_group("federation")
    f.add_argument("--parties", type=int, default=None,
                   help="number of data parties Q; spawns Q local processes unless started by torchrun/mpirun "
                        "(default: 3, or the world size under torchrun)")
    f.add_argument("--backend", choices=["gloo", "mpi"], default="gloo", help="torch.distributed backend")
    f.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N) for each party's tensor work")
    f.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for a silent or missing party before stopping with an error (default 60)")
    f.add_argument("--seed", type=int, default=0, help="shared seed: partition, split, random features")
    f.add_argument("--federation", metavar="FILE", help="across organisations: the federation file (JSON/TOML); "
                   "this process is one party, every link TLS 1.3 with pinned certificates (docs/deployment.md)")
    f.add_argument("--party", help="with --federation: this organisation's party name (or rank) in the file")
    f.add_argument("--identity", metavar="KEYFILE", help="with --federation: this party's key file (vfl keygen)")
    o = p.add_argument_group("output")
    o.add_argument("--output-json", metavar="PATH", help="write metrics, timing, bytes per party and config here")
    o.add_argument("--logdir", metavar="DIR", help="TensorBoard scalars (loss, metrics, bytes) go here")
    o.add_argument("--quiet", action="store_true", help="no progress bars, no summary")
    o.add_argument("-v", "--verbose", action="store_true", help="log per-phase communication")


COMMON_HELP = """\
options common to every method (see `vfl METHOD --help` for the method's own):
  --dataset NAME|PATH   registered name (`vfl datasets`) or a LIBSVM/CSV file (default breast_cancer)
  --test-dataset PATH   separate test file;  --test-fraction F  held-out share otherwise
  --data-dir DIR        folder of the named datasets (default $VFLTORCH_DATA, else ../shared/data)
  --label-column, --positive-label, --task, --id-column, --party-files   for your own files
  --partition contiguous|random|explicit, --feature-groups '0-9;10-17'   who owns which columns
  --impute, --scale, --clip-values, --normalize-rows   per-party preprocessing (row norms by a masked sum)
  --parties Q           data parties; spawns Q local processes unless under torchrun/mpirun
  --backend gloo|mpi    --device cpu|cuda    --seed N    --timeout SECONDS (default 60)
  --federation FILE --party NAME --identity KEY   one organisation's party over TLS (docs/deployment.md)
  --output-json PATH    metrics, timing, bytes per party, configuration
  --logdir DIR          TensorBoard scalars;  --quiet;  -v/--verbose

examples:
  vfl fdskl --dataset breast_cancer --parties 3
  torchrun --nproc_per_node 4 -m vfltorch fdskl --dataset a9a      (inside one organisation)
  vfl fdskl --federation fed.json --party bank --identity bank.pem  (across organisations)
"""


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    commands = discover_commands() if commands is None else commands
    parser = argparse.ArgumentParser(
        prog="vfl", description="Vertical federated learning on PyTorch: every party holds some columns, "
                                "one holds the labels, no raw column leaves its owner.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=COMMON_HELP)
    parser.add_argument("--version", action="version", version=f"vfltorch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="METHOD")
    sub.required = True
    for c in commands.values():
        sp = sub.add_parser(c.name, help=c.help, description=c.help,
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        if c.needs_data:
            add_common_arguments(sp, c.data_defaults)
        c.add_arguments(sp)
    return parser


def data_config(args):
    from .data import DataConfig

    return DataConfig(dataset=args.dataset, test_dataset=args.test_dataset, data_dir=args.data_dir,
                      task=args.task, label_column=args.label_column, positive_label=args.positive_label,
                      id_column=args.id_column, party_files=list(args.party_files), partition=args.partition,
                      feature_groups=args.feature_groups, test_fraction=args.test_fraction, seed=args.seed,
                      impute=args.impute, scale=args.scale, clip=args.clip_values,
                      normalize_rows=args.normalize_rows)


def run_party(fed, argv: list[str]) -> dict | None:
    """What every party process runs for ``vfl METHOD ...``; the active party returns the JSON record."""
    from .data import VFLInputError, load_party_data
    from .runlog import RunLog, write_json

    commands = discover_commands()
    args = build_parser(commands).parse_args(argv)
    command = commands[args.command]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"[party {fed.rank}] %(message)s")
    log = RunLog(args.logdir, enabled=fed.is_active, progress=not args.quiet)
    try:
        started = time.perf_counter()
        data = load_party_data(fed, data_config(args)) if fed.is_data_party else None
        fed.barrier()
        load_seconds = time.perf_counter() - started
        try:
            out = command.run(fed, data, args, log) or {}
        except VFLInputError as exc:
            # Library subclasses (PrivacyBudgetError, ...) reach the user as the plain input error that
            # `vfl` prints cleanly, whichever process raised it.
            if type(exc) is VFLInputError:
                raise
            raise VFLInputError(str(exc)) from exc
        meters = fed.meter.as_dict()
        if args.verbose:
            fed.meter.log(fed.rank)
        with fed.phase("report"):
            all_meters = fed.gather_json(meters, fed.active)
        if not fed.is_active:
            return None
        record = {
            "method": command.name,
            "dataset": args.dataset,
            "parties": fed.num_parties,
            "metrics": {k: float(v) for k, v in out.pop("metrics", {}).items()},
            "train_seconds": float(out.pop("train_seconds", float("nan"))),
            "load_seconds": load_seconds,
            "comm": {str(r): _comm_entry(m) for r, m in enumerate(all_meters)},
            **out,
            "config": {**{k: v for k, v in vars(args).items() if k != "command"}, "backend": fed.backend,
                       "world_size": fed.world_size, "coordinator": fed.coordinator},
            "vfltorch_version": __version__,
        }
        write_json(args.output_json, record)
        log.scalar("comm/bytes_total", sum(e["bytes_sent"] for e in record["comm"].values()), 0)
        if not args.quiet:
            _print_summary(record)
        return record
    finally:
        log.close()


def _comm_entry(meter: dict) -> dict:
    from .comm import CommMeter

    return {**CommMeter.from_dict(meter).totals(), "phases": meter}


def _print_summary(record: dict) -> None:
    metrics = "  ".join(f"{k}={v:.4f}" for k, v in record["metrics"].items())
    sent = sum(e["bytes_sent"] for e in record["comm"].values())
    print(f"{record['method']} on {record['dataset']} with {record['parties']} parties: {metrics}", flush=True)
    print(f"  train {record['train_seconds']:.2f} s, {sent / 1e6:.3f} MB sent in total", flush=True)


def _party_entry(fed, argv):
    """Launcher target: run one party and return its record (only the active party's is not None)."""
    return run_party(fed, argv)


def main(argv: list[str] | None = None) -> int:
    from .comm import (FederationError, PartyFailure, check_backend, init_from_env, launch, under_mpirun,
                       under_torchrun)
    from .data import VFLInputError

    argv = sys.argv[1:] if argv is None else list(argv)
    commands = discover_commands()
    args = build_parser(commands).parse_args(argv)
    command = commands[args.command]
    if not command.needs_data:
        return command.run(None, None, args, None) or 0
    coordinator = command.wants_coordinator(args)
    try:
        _check_device(args.device)
        if command.check is not None:
            command.check(args)
        try:
            check_backend(args.backend)
        except RuntimeError as exc:
            raise VFLInputError(str(exc)) from None
        if args.federation:
            fed = _join_federation(args, coordinator)
            try:
                run_party(fed, argv)
            except BaseException as exc:
                fed.report_error(exc)
                raise
            fed.close()
        elif args.backend == "mpi" or under_torchrun() or under_mpirun():
            fed = init_from_env(coordinator=coordinator, backend=args.backend, device=args.device,
                                timeout=args.timeout)
            expected = fed.num_parties
            if args.parties is not None and args.parties != expected:
                raise VFLInputError(f"--parties {args.parties} but {fed.world_size} processes were started "
                                    f"({expected} data parties{' + a coordinator' if coordinator else ''}); "
                                    f"drop --parties or start {args.parties + coordinator} processes")
            try:
                run_party(fed, argv)
            except BaseException as exc:
                fed.report_error(exc)
                raise
            fed.close()
        else:
            parties = 3 if args.parties is None else args.parties
            if parties < 1:
                raise VFLInputError(f"--parties must be at least 1, got {parties}")
            launch(_party_entry, parties, args=(argv,), coordinator=coordinator, backend=args.backend,
                   device=args.device, timeout=args.timeout)
    except VFLInputError as exc:
        print(f"vfl: error: {exc}", file=sys.stderr)
        return 2
    except FederationError as exc:
        root = exc.errors.get(exc.root, "") if exc.root is not None else ""
        first = root.splitlines()[0] if root else str(exc)
        if first.startswith("VFLInputError: "):
            print(f"vfl: error: {first[len('VFLInputError: '):]}", file=sys.stderr)
            return 2
        print(f"vfl: {exc}", file=sys.stderr)
        return 1
    except PartyFailure as exc:
        print(f"vfl: {exc}", file=sys.stderr)
        return 1
    return 0


def _join_federation(args, coordinator: bool):
    """One party of a federation file (docs/deployment.md): no spawning, no torchrun, no store."""
    from .comm import connect_federation
    from .comm.federation_file import FederationFileError
    from .data import VFLInputError

    if not args.party or not args.identity:
        raise VFLInputError("--federation needs --party NAME and --identity KEYFILE (written by `vfl keygen`)")
    try:
        fed = connect_federation(args.federation, args.party, args.identity, device=args.device,
                                 timeout=args.timeout)
    except (FederationFileError, ValueError) as exc:
        raise VFLInputError(str(exc)) from None
    if (fed.coordinator is not None) != coordinator:
        fed.transport.close()
        raise VFLInputError(f"this method {'needs' if coordinator else 'takes no'} coordinator, but the federation "
                            f"file {'lists none' if coordinator else 'lists one'}")
    if args.parties is not None and args.parties != fed.num_parties:
        fed.transport.close()
        raise VFLInputError(f"--parties {args.parties} but the federation file lists {fed.num_parties} data parties")
    return fed


def _check_device(device: str) -> None:
    import torch

    from .data import VFLInputError

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise VFLInputError(f"--device {device} was asked for, but torch sees no CUDA device "
                            f"(torch {torch.__version__}); use --device cpu or install a CUDA build of torch")
    if not (device == "cpu" or device.startswith("cuda")):
        raise VFLInputError(f"--device must be cpu or cuda[:N], got {device!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
