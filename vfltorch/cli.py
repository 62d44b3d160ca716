"""The ``vfl`` command (also ``python -m vfltorch``, which torchrun can start as a module).

``vfl METHOD --dataset NAME --parties Q ...`` spawns Q local party processes;
under ``torchrun`` (or ``mpirun`` with ``--backend mpi``) each started process
is one party and nothing is spawned. Either way every party runs
``run_party``: load its own columns, run the method, report its bytes. The
active party writes the JSON record, TensorBoard scalars and the summary.

Methods plug in as ``Command`` objects listed in a ``COMMANDS`` variable of
their package's ``cli`` module (``vfltorch.kernels.cli`` and so on).
``COMMAND_INDEX`` names the module of each command, so ``vfl --help`` imports
no method and ``vfl METHOD ...`` imports only that method's module.

Before any party starts, the launching process runs the preflight
(``vfltorch.data.preflight``): option values, output paths, the dataset's
files, columns against parties, labels against the method's tasks, then the
method's own ``check``. Mistakes there are answered in the launching process.
SIGINT / SIGTERM stop every party with one line (exit codes 130 / 143).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__

# Every command module, the data commands' included, is found by name: this module imports none of them (each
# imports ``Command`` from here), so no import circle ties the core to a method.
COMMAND_MODULES = ["vfltorch.data.cli", "vfltorch.comm.cli", "vfltorch.kernels.cli", "vfltorch.pca.cli", "vfltorch.privacy.cli", "vfltorch.linear.cli",
                   "vfltorch.predict"]

# name -> (module, one-line help): what `vfl --help` lists without importing any method.
COMMAND_INDEX = {
    "datasets": ("vfltorch.data.cli", "list the registered datasets and whether their files are found"),
    "align": ("vfltorch.data.cli", "align --party-files rows by private set intersection; write each row order"),
    "inspect": ("vfltorch.data.cli", "load and split the data across the parties and report what each holds"),
    "fdskl": ("vfltorch.kernels.cli", "FDSKL: kernel classification / regression with random features"),
    "pca": ("vfltorch.pca.cli", "vertical federated PCA: VFedPCA, VFedAKPCA or exact federated (kernel) PCA"),
    "dpscd": ("vfltorch.privacy.cli", "DP-SCD: differentially private coordinate descent for linear models"),
    "dpsgd": ("vfltorch.privacy.cli", "the DP-SGD baseline (opacus), centralised"),
    "hetero-lr": ("vfltorch.linear.cli", "encrypted vertical logistic regression (Paillier coordinator)"),
    "keygen": ("vfltorch.comm.cli", "write this organisation's TLS identity (key + self-signed certificate)"),
    "predict": ("vfltorch.predict", "score new rows with a model saved by --save-model (each party its own shard)"),
}


@dataclass
class Command:
    """A ``vfl`` subcommand.

    ``run(fed, data, args, log)`` runs in every party process (``data`` is
    ``None`` at a coordinator) and returns, at the active party, a dict with
    ``metrics`` (flat floats), ``train_seconds`` and any extra top-level keys
    for the JSON record. ``check(args, info)``, if given, runs once in the
    launching process before any party is started and raises ``VFLInputError``
    for options that cannot work, so a bad command line fails before Q
    processes have started and loaded data. ``info`` is what the preflight
    learnt without reading a registered dataset: ``task``, ``features`` and
    training ``rows`` where known (``vfltorch.data.registry.SHAPES``); a check
    builds the method's estimator or configuration from the options with the
    same function the run uses, and calls its validation; where that imports
    torch, that part is ``server_check`` (run where torch is imported already).
    """

    name: str
    help: str
    run: Callable
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None
    coordinator: bool | Callable[[argparse.Namespace], bool] = False
    data_defaults: dict = field(default_factory=dict)
    needs_data: bool = True
    check: Callable[[argparse.Namespace, dict], None] | None = None
    tasks: tuple[str, ...] | None = None    # data tasks the method handles (None: any); checked before start
    data_config: Callable | None = None     # (fed, args) -> DataConfig in each party (default: from the options)
    # Modules every party of this method imports: the fork server imports them once, while the launching process
    # runs its checks, and the party processes it forks start with them (vfltorch.comm.start).
    preload: tuple[str, ...] = ()
    # The part of the check that imports the method's library (torch, scikit-learn), called as
    # ``server_check(args, info)`` after ``check``: in a process forked from the parties' fork server, which imports
    # them anyway, so that the launching process imports no torch (in this process under torchrun, mpirun,
    # --federation or VFLTORCH_START_METHOD=spawn). It must not change ``args``: it sees its own parse of them.
    server_check: Callable[[argparse.Namespace, dict], None] | None = None
    # Fills options whose default depends on something other than the command line (`vfl predict`: the saved
    # model's dataset), right after parsing: in the launching process and again in every party, which re-parse argv.
    resolve: Callable[[argparse.Namespace], None] | None = None

    def wants_coordinator(self, args) -> bool:
        return self.coordinator(args) if callable(self.coordinator) else bool(self.coordinator)


PSI_ENGINES = ("rr22", "ecdh")      # vfltorch.data.psi.ENGINES (declared here: --help imports no torch)


# What `run_party` imports in every party, whatever the method (data loading, the scikit-learn dataset loaders and
# metrics, the run log and its progress bars, the model store): preloaded by the fork server with the method's own
# ``Command.preload``.
PARTY_PRELOAD = ("vfltorch.data.party", "vfltorch.data.registry", "vfltorch.data.psi", "vfltorch.data.preflight",
                 "vfltorch.data.labels", "vfltorch.runlog", "vfltorch.predict", "sklearn.datasets", "sklearn.metrics",
                 "tqdm.auto")


def party_preload(command: "Command") -> tuple[str, ...]:
    """The modules the parties' fork server imports for ``command`` (missing ones are skipped by the server)."""
    module = COMMAND_INDEX.get(command.name, ("vfltorch.cli",))[0]
    return tuple(dict.fromkeys(("vfltorch.cli", module, *PARTY_PRELOAD, *command.preload)))


def discover_commands(name: str | None = None) -> dict[str, Command]:
    """Every command, or (``name`` in ``COMMAND_INDEX``) only the commands of that one's module."""
    if name in COMMAND_INDEX:
        module = importlib.import_module(COMMAND_INDEX[name][0])
        return {c.name: c for c in getattr(module, "COMMANDS", [])}
    commands = {}
    for module in COMMAND_MODULES:
        if importlib.util.find_spec(module) is None:
            continue
        for c in getattr(importlib.import_module(module), "COMMANDS", []):
            commands[c.name] = c
    return commands


def planned_parties(args) -> int | None:
    """Data parties the run will have, as far as the launching process knows (None under torchrun / mpirun)."""
    if args.parties is not None:
        return args.parties
    if getattr(args, "federation", None) or args.backend == "mpi" or _under_launcher():
        return None
    return 3


def parties_beside_a_dealer(args) -> int:
    """Data parties of a run whose method may start a dealer (``Command.coordinator``): --parties, else under
    torchrun the world size less the dealer, else the default 3. Decides whether a dealer process is needed."""
    import os

    if args.parties is not None:
        return args.parties
    return int(os.environ["WORLD_SIZE"]) - 1 if "WORLD_SIZE" in os.environ else 3


def check_key_option(bits: int, insecure: bool, option: str = "--key-bits") -> None:
    """A Paillier key size from the command line, by the policy ``generate_keypair`` applies."""
    from .crypto.errors import KeyTooSmallError
    from .crypto.keys import MIN_KEY_BITS, check_key_size
    from .data.validation import VFLInputError

    try:
        check_key_size(bits, insecure=insecure)
    except KeyTooSmallError:
        raise VFLInputError(f"{option} {bits}: a {bits}-bit Paillier key is too small (keys under {MIN_KEY_BITS} "
                            f"bits can be factored); use {option} 2048 (the default), or add --insecure-key for "
                            f"tests only") from None
    except ValueError as exc:
        raise VFLInputError(f"{option} {bits}: " + str(exc).replace("n_length/2", "half that many").replace(
            "n_length", "the key size")) from None


def run_check(command: "Command", args, info: dict) -> None:
    """``command.check(args, info)``; a check that takes only ``args`` is called with it alone."""
    import inspect

    if command.check is None:
        return
    if len(inspect.signature(command.check).parameters) >= 2:
        command.check(args, info)
    else:
        command.check(args)


def _server_check(argv: list[str], info: dict) -> None:
    """``Command.server_check`` for ``vfl ARGV``, in a process forked from the parties' fork server."""
    args, command = parse_command_line(argv)
    command.server_check(args, info)


def command_name(argv: list[str]) -> str | None:
    """The METHOD of ``vfl [--version] METHOD ...`` (the top level takes no option with a value)."""
    for a in argv:
        if a == "--":
            return None
        if not a.startswith("-"):
            return a
    return None


def add_common_arguments(p: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    d = {"test_fraction": 0.25, "scale": "none", "normalize_rows": False, "dataset": "breast_cancer",
         **(defaults or {})}
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=d["dataset"],
                   help="a registered name (see `vfl datasets`) or the path of a LIBSVM or CSV file (default: "
                        + ("breast_cancer, bundled with scikit-learn)" if d["dataset"] == "breast_cancer"
                           else f"{d['dataset'] or 'the one the command reads from elsewhere'})"))
    g.add_argument("--test-dataset", help="a separate test file for --dataset PATH")
    g.add_argument("--data-dir", help="folder of the named datasets (default: $VFLTORCH_DATA, else ../shared/data)")
    g.add_argument("--label-column", help="label column of a CSV file (name, or index)")
    g.add_argument("--positive-label", help="label value of the positive class for a binary task on your own file")
    g.add_argument("--task", choices=["binary", "regression", "multiclass"], help="task of your own file")
    g.add_argument("--id-column", help="ID column that aligns the rows of --party-files")
    g.add_argument("--party-files", nargs="+", default=[], metavar="FILE",
                   help="one file per party (party r reads only the r-th), rows matched on --id-column")
    g.add_argument("--aligned-rows", metavar="PATTERN",
                   help="reuse the row order an earlier `vfl align --rows-out PATTERN` wrote ({party} is the "
                        "party's index) instead of a new private set intersection")
    g.add_argument("--psi", choices=PSI_ENGINES, default=None,
                   help="private set intersection of --party-files: rr22 (OT extension, SecretFlow's spu; the "
                        "default when spu is installed) or ecdh (X25519; the default otherwise, ~20x slower)")
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
    f.add_argument("--join-timeout", type=float, default=None, metavar="SECONDS",
                   help="with --federation: seconds to wait for every party to join, when organisations start "
                        "their processes at different times (default: --timeout); --timeout then bounds only "
                        "the silence of a joined peer")
    f.add_argument("--party", help="with --federation: this organisation's party name (or rank) in the file")
    f.add_argument("--identity", metavar="KEYFILE", help="with --federation: this party's key file (vfl keygen)")
    o = p.add_argument_group("output")
    o.add_argument("--output-json", metavar="PATH", help="write metrics, timing, bytes per party and config here")
    o.add_argument("--logdir", metavar="DIR", help="TensorBoard scalars (loss, metrics, bytes) go here")
    o.add_argument("--quiet", action="store_true",
                   help="no progress bars, notes or protocol warnings; the summary is its one line of metrics")
    o.add_argument("-v", "--verbose", action="store_true", help="log per-phase communication")


SAVE_HELP = ("save the trained model here, one shard per party (DIR/party-<rank>: manifest.json + arrays.npz, "
             "each party writes only its own); score new rows later with `vfl predict --model DIR`")


CHECKPOINT_HELP = ("save this party's state in DIR after every epoch and, when started again with the same command, go "
                   "on after the newest epoch every party saved (across organisations each party its own DIR; "
                   "docs/deployment.md). DIR is deleted when training ends; delete it by hand if you abandon the run")


def add_checkpoint_argument(g, note: str = "") -> None:
    """The ``--checkpoint DIR`` option of a method that can resume (``vfltorch.checkpoint``)."""
    g.add_argument("--checkpoint", metavar="DIR", default=None, help=CHECKPOINT_HELP + note)


def add_save_argument(p: argparse.ArgumentParser) -> None:
    """The ``--save-model DIR`` option of a training command (checked writable before any party starts); here,
    not in predict.py, so that parsing a command line imports no numpy."""
    p.add_argument("--save-model", metavar="DIR", default=None, help=SAVE_HELP)


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


class HelpFormatter(argparse.HelpFormatter):
    """Adds '(default: X)' once: not where the help already names its default, not for flags, not for None."""

    def _get_help_string(self, action):
        text = action.help or ""
        if isinstance(action, argparse.BooleanOptionalAction):      # say which of the two spellings is the default
            text = text.replace(" (default: %(default)s)", "")
            if isinstance(action.default, bool) and "default" not in text.lower():
                text += f" (default: {action.option_strings[0 if action.default else 1]})"
            return text
        if ("default" in text.lower() or action.default in (None, argparse.SUPPRESS)
                or isinstance(action.default, bool) or action.nargs == 0 or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(commands: dict[str, Command] | None = None, *, index: bool = False) -> argparse.ArgumentParser:
    """The ``vfl`` parser. ``index``: also list every ``COMMAND_INDEX`` name not in ``commands`` (no import)."""
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
                            formatter_class=HelpFormatter)
        if c.needs_data:
            add_common_arguments(sp, c.data_defaults)
        c.add_arguments(sp)
    if index:
        for name, (_, text) in COMMAND_INDEX.items():
            if name not in commands:
                sub.add_parser(name, help=text, description=text)
    return parser


def parse_command_line(argv: list[str]):
    """(args, command): imports only the named method's module."""
    name = command_name(argv)
    commands = {} if name is None else discover_commands(name)
    if name is not None and name not in commands:
        commands = discover_commands()          # a command outside the index
    args = build_parser(commands, index=True).parse_args(argv)
    command = commands[args.command]
    if command.resolve is not None:
        command.resolve(args)
    return args, command


def data_config(args):
    from .data import DataConfig

    return DataConfig(dataset=args.dataset, test_dataset=args.test_dataset, data_dir=args.data_dir,
                      task=args.task, label_column=args.label_column, positive_label=args.positive_label,
                      id_column=args.id_column, party_files=list(args.party_files), aligned_rows=args.aligned_rows,
                      psi=args.psi, partition=args.partition,
                      feature_groups=args.feature_groups, test_fraction=args.test_fraction, seed=args.seed,
                      impute=args.impute, scale=args.scale, clip=args.clip_values,
                      normalize_rows=args.normalize_rows)


def run_party(fed, argv: list[str]) -> dict | None:
    """What every party process runs for ``vfl METHOD ...``; the active party returns the JSON record."""
    from .comm.start import profile_mark
    from .data import VFLInputError, load_party_data
    from .runlog import RunLog, write_json

    args, command = parse_command_line(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"[party {fed.rank}] %(message)s")
    log = RunLog(args.logdir, enabled=fed.is_active, progress=not args.quiet)
    try:
        started = time.perf_counter()
        config = command.data_config(fed, args) if command.data_config else data_config(args)
        data = load_party_data(fed, config) if fed.is_data_party else None
        fed.barrier()
        load_seconds = time.perf_counter() - started
        profile_mark(f"party{fed.rank}_loaded")
        try:
            out = command.run(fed, data, args, log) or {}
        except VFLInputError as exc:
            # Library subclasses (PrivacyBudgetError, ...) reach the user as the plain input error that
            # `vfl` prints cleanly, whichever process raised it.
            if type(exc) is VFLInputError:
                raise
            raise VFLInputError(str(exc)) from exc
        profile_mark(f"party{fed.rank}_ran")
        meters = fed.meter.as_dict()
        if args.verbose:
            fed.meter.log(fed.rank)
        with fed.phase("report"):
            all_meters = fed.gather_json(meters, fed.active)
        if not fed.is_active:
            return None
        record = {
            "method": command.name,
            "dataset": _dataset_name(args, data),
            "parties": fed.num_parties,
            "data_task": None if data is None else data.task,
            "labels": None if data is None else data.label_note,
            **({"alignment": data.alignment} if data is not None and data.alignment else {}),
            "metrics": {k: float(v) for k, v in out.pop("metrics", {}).items()},
            "train_seconds": float(out.pop("train_seconds", float("nan"))),
            "load_seconds": load_seconds,
            "comm": {str(r): _comm_entry(m) for r, m in enumerate(all_meters)},
            **out,
            "config": {**{k: v for k, v in vars(args).items() if k != "command"}, "backend": fed.backend,
                       "world_size": fed.world_size, "coordinator": fed.coordinator},
            "vfltorch_version": __version__,
        }
        written = write_json(args.output_json, record)
        if args.output_json and written != args.output_json:
            record["output_fallback"] = written
        log.scalar("comm/bytes_total", sum(e["bytes_sent"] for e in record["comm"].values()), 0)
        _print_summary(record, brief=args.quiet)
        return record
    finally:
        log.close()


def _dataset_name(args, data) -> str:
    """What the run trained on: the parties' own files (each named by its owner over the link) or the dataset."""
    files = (data.alignment or {}).get("files") if data is not None else None
    if files:
        return " + ".join(f["name"] for f in files.values())
    if getattr(args, "party_files", None):
        return " + ".join(Path(f).name for f in args.party_files)
    return args.dataset


def _comm_entry(meter: dict) -> dict:
    from .comm import CommMeter

    return {**CommMeter.from_dict(meter).totals(), "phases": meter}


COUNTS = ("epochs", "iterations", "rounds", "bytes", "messages", "steps")


def _value(key: str, v: float) -> str:
    """Counts as integers (epochs=12, bytes_per_epoch=81920), everything else to 4 decimals."""
    if any(key == c or key.startswith(c + "_") for c in COUNTS) and float(v).is_integer():
        return str(int(v))
    return f"{v:.4f}"


def _print_summary(record: dict, brief: bool = False) -> None:
    """The run's result on stdout; ``brief`` (``--quiet``): its first line only, the metrics (a quiet run still says
    what it got: the progress bars, notes and the lines below are what --quiet leaves out)."""
    metrics = "  ".join(f"{k}={_value(k, v)}" for k, v in record["metrics"].items())
    sent = sum(e["bytes_sent"] for e in record["comm"].values())
    q = record["parties"]
    print(f"{record['method']} on {record['dataset']} with {q} {'party' if q == 1 else 'parties'}: {metrics}",
          flush=True)
    if brief:
        return
    if record.get("labels"):
        model = record.get("task")
        shown = f" (model: {model})" if model and model != record.get("data_task") else ""
        print(f"  task: {record['labels']}{shown}", flush=True)
    if record.get("alignment"):
        a = record["alignment"]
        rows = ", ".join(f"party {r}: {n} ({a['dropped'][r]} dropped)" for r, n in a["rows"].items())
        how = f", {a['method']}" if a.get("method") else ""
        print(f"  aligned {a['aligned']} rows by private set intersection{how}; rows per file: {rows}", flush=True)
        if a.get("note"):
            print(f"  note: {a['note']}", flush=True)
    if record.get("epsilon_target") is not None or record.get("dp_guarantee"):
        print(f"  privacy: {_privacy_line(record)}", flush=True)
    print(f"  train {record['train_seconds']:.2f} s, {sent / 1e6:.3f} MB sent in total", flush=True)


def _privacy_line(record: dict) -> str:
    """What a DP run spent, against its budget, and whether the guarantee holds (dpscd, dpsgd)."""
    if record.get("epsilon_target") is None:
        return record.get("dp_guarantee", "")
    spent = record.get("epsilon")
    line = (f"epsilon spent {spent:.4g} of {record['epsilon_target']:g} (delta {record['delta']:g}, accountant "
            f"{record.get('accountant')})" if spent is not None else f"epsilon target {record['epsilon_target']:g}")
    observers = record.get("epsilon_by_observer") or {}
    others = {k: v["epsilon"] for k, v in observers.items()
              if k != "outsider" and isinstance(v, dict) and isinstance(v.get("epsilon"), (int, float))}
    if others:
        line += "; towards " + ", ".join(f"{k.replace('_', ' ')} {e:.4g}" for k, e in others.items())
    guarantee = record.get("dp_guarantee", "")
    return f"{line}; guarantee {guarantee}" if guarantee else line


def _party_entry(fed, argv):
    """Launcher target: run one party and return its record (only the active party's is not None)."""
    return run_party(fed, argv)


class Terminated(BaseException):
    """SIGTERM reached the launching process (SIGINT arrives as KeyboardInterrupt)."""


def _raise_terminated(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, command = parse_command_line(argv)
    if not command.needs_data:
        try:
            return command.run(None, None, args, None) or 0
        except BrokenPipeError:            # `vfl datasets | head -3`
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:                      # not the main thread: leave signals alone
        pass
    try:
        return _main(argv, args, command)
    except KeyboardInterrupt:
        print("vfl: interrupted (SIGINT): every party was stopped; nothing was written", file=sys.stderr)
        return 130
    except Terminated:
        print("vfl: terminated (SIGTERM): every party was stopped; nothing was written", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv, args, command) -> int:
    from .data.preflight import preflight
    from .data.validation import VFLInputError

    coordinator = command.wants_coordinator(args)
    preload = party_preload(command)
    try:
        distributed = args.backend == "mpi" or _under_launcher()
        _check_settings()
        info = preflight(args, command, local=not distributed)
        _check_device(args.device)
        local = not (distributed or args.federation)
        if local:
            from .comm.start import profile_mark, start_context, warm_start

            profile_mark("server_start")
            warm_start(preload)      # the parties' fork server imports torch while the checks below run
        run_check(command, args, info)
        if command.server_check is not None:
            if local and start_context(preload).get_start_method() == "forkserver":
                from .comm.start import run_in_server

                run_in_server(_server_check, (argv, info), preload)
            else:
                command.server_check(args, info)
        if not local:
            from .comm import check_backend
            try:
                check_backend(args.backend)
            except RuntimeError as exc:
                raise VFLInputError(str(exc)) from None
        if args.federation or distributed:
            if args.federation:
                fed = _join_federation(args, coordinator)
            else:
                from .comm import init_from_env

                try:
                    fed = init_from_env(coordinator=coordinator, backend=args.backend, device=args.device,
                                        timeout=args.timeout)
                except RuntimeError as exc:
                    if "EADDRINUSE" not in str(exc) and "address already in use" not in str(exc).lower():
                        raise
                    import os

                    raise VFLInputError(
                        f"the rendezvous port {os.environ.get('MASTER_PORT', '?')} on "
                        f"{os.environ.get('MASTER_ADDR', '?')} is already in use (another run, or another "
                        f"program): give this run its own port (torchrun --master-port PORT, or MASTER_PORT)") from None
                expected = fed.num_parties
                if args.parties is not None and args.parties != expected:
                    raise VFLInputError(f"--parties {args.parties} but {fed.world_size} processes were started "
                                        f"({expected} data parties{' + a coordinator' if coordinator else ''}); "
                                        f"drop --parties or start {args.parties + coordinator} processes")
            try:
                records = [run_party(fed, argv)]
            except BaseException as exc:
                fed.report_error(exc)
                raise
            fed.close()
        else:
            from .comm.errors import BackendUnavailable
            from .comm.launcher import launch

            parties = 3 if args.parties is None else args.parties
            try:
                records = launch(_party_entry, parties, args=(argv,), coordinator=coordinator,
                                 backend=args.backend, device=args.device, timeout=args.timeout, preload=preload)
            except BackendUnavailable as exc:
                raise VFLInputError(str(exc)) from None
    except VFLInputError as exc:
        print(f"vfl: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from .comm.errors import FederationError, PartyFailure
        if isinstance(exc, (FederationError, PartyFailure)):
            from .runlog import end_progress_line

            end_progress_line()          # under torchrun this party's own bar may still be open on this stderr
        if isinstance(exc, FederationError):
            root = exc.errors.get(exc.root, "") if exc.root is not None else ""
            first = root.splitlines()[0] if root else str(exc)
            if first.startswith("VFLInputError: "):
                print(f"vfl: error: {first[len('VFLInputError: '):]}", file=sys.stderr)
                return 2
            print(f"vfl: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, PartyFailure):
            print(f"vfl: {exc}", file=sys.stderr)
            return 1
        raise
    if any(isinstance(r, dict) and r.get("output_fallback") for r in records):
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
                                 timeout=args.timeout, join_timeout=getattr(args, "join_timeout", None))
    except (FederationFileError, ValueError) as exc:
        raise VFLInputError(str(exc)) from None
    if (fed.coordinator is not None) != coordinator:
        fed.transport.close()
        raise VFLInputError(
            f"this run needs a coordinator (a process with no data: a dealer or the key holder), but the federation "
            f"file lists none: add one (docs/deployment.md), or pick the method's protocol that runs without one "
            f"(its --help; e.g. vfl dpscd --vertical-protocol encrypted)" if coordinator else
            "this run takes no coordinator, but the federation file lists one: remove it, or pick the method's "
            "protocol that uses one (its --help)")
    if args.parties is not None and args.parties != fed.num_parties:
        fed.transport.close()
        raise VFLInputError(f"--parties {args.parties} but the federation file lists {fed.num_parties} data parties")
    return fed


def _check_settings() -> None:
    """The environment variables that size the run, before anything starts: one line each when unusable."""
    from .comm.start import DEFAULT_TIMEOUT, positive_setting
    from .data.validation import VFLInputError

    for name, default in (("VFLTORCH_TIMEOUT", DEFAULT_TIMEOUT), ("VFLTORCH_WORK_RATE", 3e7)):
        try:
            positive_setting(name, default)
        except ValueError as exc:
            raise VFLInputError(str(exc)) from None


def _under_launcher() -> bool:
    import os

    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or any(
        k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def _check_device(device: str) -> None:
    from .data.validation import VFLInputError

    if not (device == "cpu" or device.startswith("cuda")):
        raise VFLInputError(f"--device must be cpu or cuda[:N], got {device!r}")
    if device == "cpu":
        return
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise VFLInputError(f"--device {device} was asked for, but torch sees no CUDA device "
                            f"(torch {torch.__version__}); use --device cpu or install a CUDA build of torch")
    if not (device == "cpu" or device.startswith("cuda")):
        raise VFLInputError(f"--device must be cpu or cuda[:N], got {device!r}")


def entry() -> None:  # pragma: no cover - the `vfl` script and `python -m vfltorch`
    """``main()``, then leave without the interpreter's teardown of torch and gloo (seconds on a small machine,
    after everything was written): atexit handlers run and stdio is flushed first. ``main()`` itself returns
    normally, for callers in Python."""
    import atexit
    import os

    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):            # a closed pipe (`vfl datasets | head -1`)
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":  # pragma: no cover
    entry()
