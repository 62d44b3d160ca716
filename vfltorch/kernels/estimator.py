"""scikit-learn style FDSKL estimators: ``FDSKLClassifier`` and ``FDSKLRegressor``.

Each party process builds the same estimator (same hyperparameters) with its
``Federation`` handle and calls ``fit`` / ``decision_function`` / ``predict`` /
``score`` with its own columns of the same rows, in the same order; only the
active party passes labels, and only it gets decision values, predictions
and scores back (the others get ``None``). Without a federation handle the
estimator is the centralised DSG baseline (Q = 1, ``Federation.local()``):

    >>> clf = FDSKLClassifier(epochs=5).fit(X_train, y_train)     # y in {-1, +1}
    >>> clf.score(X_test, y_test)

In a party process (``vfltorch.comm.launch`` or under torchrun):

    >>> clf = FDSKLClassifier(fed, epochs=5).fit(data.X_train, data.y_train)  # y_train is None if passive
    >>> clf.decision_function(data.X_test)                                    # values at the active party

Learned state (trailing underscore; arrays are numpy, as scikit-learn's): ``alpha_`` (active party only; the
model computes with its tensor on the estimator's device), ``support_`` (a compressed model's kept features),
``sigma_``, ``n_features_in_`` (this party's columns), ``columns_`` (their
global indices), ``n_iter_``, ``n_random_features_``, ``feature_map_`` (this
party's share of the random features), ``train_seconds_``, ``history_``
(the learning curve, active party), ``comm_`` (bytes per party and phase).

Model. ``n_components=D`` (default 1536; 4 epochs, and for classification under 5,000 rows 16 epochs and
lambda = D / (30 n): ``lam='auto'``, ``epochs='auto'``, small_data.py): a bounded model of D random features trained by
``budget.py`` (an epoch costs O(n D) compute and bytes, scoring m rows O(m D)), with
``solver='adam'`` (default: Adam on all D coefficients, averaged iterates) or ``'dsg'`` (the
paper's constant step on one block per iteration). ``n_components=None``: the paper's model,
which grows by r = ``features_per_step`` features per iteration (``trainer.py`` / ``shared.py``).
``FDSKLClassifier`` trains one-vs-rest when the labels take three or more values.
Kernel width: ``sigma='median'`` (default) with ``sigma_grid=(2^-1/2, 1, 2^1/2, 2)``: on n >= 5000 rows
each multiplier of the median width is tried on a held-out split of the training rows (``selection.py``;
under ``sealed`` each candidate is a sealed run) and the best one trains the model (``sigma_multiplier_``,
``sigma_scores_``, ``selection_seconds_``); ``sigma_grid=(1.0,)`` or a numeric ``sigma`` skips it.
Prediction: ``compress_to`` distils the trained model into D' of its features after training (``compress.py``);
the default ``'if-faithful'`` does it with D' = 496 (at ``predict_bits`` 24) from 2 D training rows on and keeps the
student only if it is as good as the full model on 3,000 public check rows (the active party decides and tells every
rank: one label-dependent bit; ``None`` or an integer avoids it); ``compress_support='public'`` (default) draws the
kept features from the public seed (label-independent),
``'alpha'`` keeps the largest |alpha_j| (every party learns which: a ``LeakWarning``). ``predict_bits`` (default
24): the shared protocol's ring for f at prediction (20, 24 or 32 bits; 11, 12 or 14 bytes per row and feature at
Q = 4).

Privacy. ``protocol='sealed'`` (the default with Q > 1; the federation needs
a coordinator, which deals seeds and holds a share; ``sealed.py``): alpha, the
gradient sums and the optimiser's state stay in additive shares between a
passive holder and the coordinator, each row's features masked once at the
start; the active party learns f on its
mini-batch rows (what its loss needs) and, once, the trained coefficients
(at most half as many as the n d_P passive values: ``check_sealed``), and
under the width selection f of each candidate on its batch rows and on the
held-out rows (the candidates' coefficients are never opened); no
compression yet.
``protocol='shared'`` (``shared.py``): the active party also learns the r
gradient sums per iteration, which with the public W and b give it the
passive columns of its batch rows (issue 35: it warns, ``LeakWarning``),
f on the rows it predicts and on the monitor rows once per epoch; passive
parties and the dealer learn no label-dependent value under either.
``protocol='paper'`` is FDSKL's Algorithm 3 as published,
kept for reproducing the paper; it warns (``LeakWarning``): the active party
learns w_j^T x_i + b_j (mod 2*pi) for every row it evaluates, and with the
public W it rebuilds the passive columns by least squares with phase
unwrapping (``tests/test_fdskl_attack.py``). Under all three, labels and L'
stay at the active party, raw columns never leave their party, and the
median heuristic reveals the distances of a few hundred disjoint random row
pairs at the active party (pass ``sigma`` to avoid it).

Seeds: ``random_state`` is public (directions w, mini-batches, the kept
party of each block, and under the shared protocol the phases b_j).
``mask_seed`` seeds each party's private masks (and, under the paper's
protocol, its phases b_j). The default, ``'random'``, draws them from the operating system
at each party: a deployment's setting, and the only one under which the
active party cannot recompute b_j and so unmask w_j^T x_i. The masks cancel
exactly, so this changes nothing but the phases b_j (a fresh draw of the
same random-feature distribution). ``'seed'`` derives them from
``random_state`` (a reproducible simulation: every party could recompute
the masks; with it Q parties reproduce Q = 1 exactly, Lemma 1); an integer
seeds them (give each party its own secret integer).
"""

from __future__ import annotations

import json
import secrets
import time
import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import _check_y

from ..comm import Federation, MaskStream
from ..data.estimator_input import (BinaryLabels, check_fitted, features, proba_columns,
                                    require_y)
from ..data.validation import VFLInputError
from ..devices import same_device, to_numpy
from ..model_store import ShardedModelMixin
from .bandwidth import median_sigma
from .checks import agree, check_hyperparameters, check_shared, label_problem, scaling_problem, warn_scaling
from .circle import Circle
from .losses import get_loss
from .protocol import FederatedFeatureMap
from .compress import (IF_FAITHFUL, SUPPORT_LEAK, check_student, compress_budget, compress_rows,
                       parse_compress_to, _sent as compress_sent)
from .shared import PREDICT_BITS, share_table, shared_decision_values, train_shared
from .random_features import FourierSampler, derive_key
from .trainer import DSGConfig, held_out_metrics, train_dsg
from .budget import train_budget
from .sealed import DEFAULT_RATE as SEALED_RATE
from .sealed import check_sealed, train_sealed
from .small_data import AUTO, LARGE_EPOCHS, LARGE_LAM, auto_epochs, auto_lam
from .selection import SELECT_BLOCKS, select_width, select_width_sealed, selection_openings, wants_selection

# The bounded model's default Adam rate (decayed as 1/sqrt(epoch)) per unit of the loss's constant DSG step: Adam
# moves every coefficient by about its rate, so f moves by about rate * sqrt(D); 0.05 for the logistic loss at D = 1024.
ADAM_STEP_SCALE = 1.0 / 320.0
# Multipliers of the median-heuristic width tried on a held-out split before training (selection.py).
SIGMA_GRID = (2.0 ** -0.5, 1.0, 2.0 ** 0.5, 2.0)


class LeakWarning(UserWarning):
    """A protocol chosen for reproducing a paper that leaks more than the default."""


PAPER_LEAK = ("protocol='paper' hands the active party the phases w_j^T x_i + b_j (mod 2 pi) of every row it "
              "evaluates; with the public directions W it can rebuild the passive parties' columns by least "
              "squares with phase unwrapping (docs/fdskl.md). Use protocol='sealed' (the default) unless you are "
              "reproducing the paper.")
SHARED_LEAK = ("protocol='shared' opens the active party the gradient sums of every step; with the public W and b "
               "they let it solve for the passive columns of its batch rows (issue 35, docs/fdskl.md *Known leak*). "
               "protocol='sealed' (the default) opens it only f on its batch rows and, once, the trained "
               "coefficients.")


# f_delay='auto' under the shared protocol (docs/design/2026-11-24-fdskl-shared-protocol-cost.md,
# *Two messages per iteration* and *Delay compensation*). 1
# pipelines the shared iteration (two sequential messages at Q = 2 instead of four), with f one step behind and the
# delay-compensated step (budget.DELAYED_BETA1): centralised over 8 seeds as accurate as the paper's algorithm when
# the width and the model are fixed (-0.06 point on phishing, -0.02 on credit_default), but with the defaults' width
# selection and checked compression it moved credit_default from 81.13% to 80.97% at seed 0 (issue 16's bar there is
# 81.06%; 8 seeds: -0.12 on average, -0.77 at worst, the selection's and the check's yes/no decisions flipping
# between nearly equal models). So 'auto' keeps 0, the paper's algorithm; --f-delay 1 opts in.
SHARED_F_DELAY = 0
# The protocols whose prediction (and dealer) is ``shared.py``'s: ``sealed`` trains differently (sealed.py).
SHARED_PROTOCOLS = ("shared", "sealed")


class _FDSKLBase(ShardedModelMixin, BaseEstimator):
    _task = "binary"
    _default_loss = "logistic"

    def __init__(self, fed: Federation | None = None, *, kernel: str = "rbf", sigma="median", loss: str | None = None,
                 lam="auto", gamma: float | None = None, batch_size: int | None = None,
                 features_per_step: int = 32, epochs="auto", max_time: float | None = None,
                 schedule: str = "cached", random_state: int = 0, mask_seed="random", angle_bits: int = 16,
                 median_pairs: int = 1000, log_every: int | None = None, max_elements: int = 2 ** 22,
                 prefetch: int = 1, device=None, protocol: str = "sealed", n_components: int | None = 1536,
                 solver: str = "adam", sigma_grid=SIGMA_GRID, compress_to=IF_FAITHFUL, compress_epochs: float = 1.0,
                 product_bits: int = 20, compress_support: str = "public", predict_bits: int = PREDICT_BITS,
                 f_delay="auto"):
        self.fed = fed
        self.kernel = kernel
        self.sigma = sigma
        self.loss = loss
        self.lam = lam
        self.gamma = gamma
        self.batch_size = batch_size
        self.features_per_step = features_per_step
        self.epochs = epochs
        self.max_time = max_time
        self.schedule = schedule
        self.random_state = random_state
        self.mask_seed = mask_seed
        self.angle_bits = angle_bits
        self.median_pairs = median_pairs
        self.log_every = log_every
        self.max_elements = max_elements
        self.prefetch = prefetch
        self.device = device
        self.protocol = protocol
        self.n_components = n_components
        self.solver = solver
        self.sigma_grid = sigma_grid
        self.compress_to = compress_to
        self.compress_epochs = compress_epochs
        self.product_bits = product_bits
        self.compress_support = compress_support
        self.predict_bits = predict_bits
        self.f_delay = f_delay

    # ------------------------------------------------------------ helpers
    def _loss(self):
        return get_loss(self.loss or self._default_loss, self._task)

    def _step_size(self) -> float:
        """gamma, or the loss's constant step (logistic 16, smooth hinge 4, square 1); for the bounded model's
        Adam steps that step / 320 * sqrt(1024 / D) (logistic: 0.05 at D = 1024)."""
        if self.gamma is not None:
            return float(self.gamma)
        if self._bounded() and self.solver == "adam":
            return self._loss().default_step * ADAM_STEP_SCALE * (1024.0 / (self._n_blocks() *
                                                                          int(self.features_per_step))) ** 0.5
        return self._loss().default_step

    def _bounded(self) -> bool:
        """A fixed budget of n_components random features (budget.py); None: the paper's growing model."""
        return self.n_components is not None

    def _n_blocks(self) -> int:
        return -(-int(self.n_components) // int(self.features_per_step))

    def _batch_size(self, n: int) -> int:
        """B, or by default: bounded model n / 128 clipped to [32, 256] (its epoch costs n D whatever B, and
        more, smaller steps converge faster); growing model n / 32 clipped to [32, 1024]."""
        if self.batch_size is not None:
            return int(self.batch_size)
        if self._bounded():
            return int(min(256, max(32, n // 128)))
        return int(min(1024, max(32, n // 32)))

    def _federation(self) -> Federation:
        return self.fed if self.fed is not None else Federation.local(self.device or "cpu")

    def _as_tensor(self, X, device, dtype=None) -> torch.Tensor:
        t = torch.as_tensor(np.asarray(X) if not isinstance(X, torch.Tensor) else X)
        if not t.is_floating_point():
            t = t.to(torch.float64)
        if dtype is not None:
            t = t.to(dtype)
        if t.dim() != 2:
            raise VFLInputError(f"X must be a 2-d array (rows x this party's columns), got shape {tuple(t.shape)}")
        return t.to(device)

    def _shared(self, fed: Federation) -> bool:
        """The shared protocol runs between several parties; with one party there is no protocol (plain DSG)."""
        return self.protocol in SHARED_PROTOCOLS and fed.num_parties > 1

    def _sealed(self, fed: Federation) -> bool:
        """The sealed protocol (sealed.py: alpha and the gradient in shares) between several parties."""
        return self.protocol == "sealed" and fed.num_parties > 1

    def _sealed_step(self) -> float:
        """gamma, or momentum SGD's constant rate under the sealed protocol (sealed.DEFAULT_RATE / D)."""
        if self.gamma is not None:
            return float(self.gamma)
        # (tuned for the logistic loss, whose constant step is 16; the square loss's L' = f - y is larger)
        scale = self._loss().default_step / 16.0
        return SEALED_RATE * scale / (self._n_blocks() * int(self.features_per_step))

    def _check_sealed(self, fed: Federation, plan: dict, n: int) -> None:
        """Every rank refuses alike (the plan is the same everywhere) a run whose opened model could determine the
        passive values (``sealed.check_sealed``); the label holder is warned where its f values reach them."""
        D = self._n_blocks() * int(self.features_per_step)
        chooses = self._bounded() and isinstance(self.sigma, str)
        note = check_sealed(n, int(plan["n_features"]) - int(plan["active_cols"]), D, self._batch_size(n),
                            self._epochs(n), selection_f=selection_openings(n, tuple(self.sigma_grid),
                                                                        self._batch_size) if chooses else 0)
        if note and fed.is_active:
            warnings.warn(note, LeakWarning, stacklevel=3)

    def _masks(self, fed: Federation) -> tuple[MaskStream, int]:
        """(this party's fresh-mask stream, the phase key of the blocks it keeps)."""
        mask_seed, phase_key = self._seeds(fed)
        if self.protocol in SHARED_PROTOCOLS:
            phase_key = derive_key(self.random_state, 0xB0B)        # b_j from the public seed
        if isinstance(self.mask_seed, str) and self.mask_seed == "random":
            return MaskStream.private(fed.rank), phase_key
        return MaskStream(mask_seed, fed.rank), phase_key        # a seeded simulation: no guarantee

    def _seeds(self, fed: Federation) -> tuple[int, int]:
        """(mask stream seed, phase key) of this party."""
        if isinstance(self.mask_seed, str) and self.mask_seed == "seed":
            # Simulation: derived from the public seed; the phase key is the same at every party so that
            # the features do not depend on which party keeps them (Lemma 1: Q parties == one party).
            return derive_key(self.random_state, 0xA5C), derive_key(self.random_state, 0xB0B)
        # mask_seed was validated by checks.py: 'random' or an integer.
        secret = secrets.randbits(63) if isinstance(self.mask_seed, str) else int(self.mask_seed)
        return derive_key(secret, 0xA5C), derive_key(secret, 0xB0B)

    # ---------------------------------------------------------------- fit
    def fit(self, X, y=None, *, columns=None, monitor=None, log=None, progress: bool = False, checkpoint=None):
        """Train on this party's columns ``X`` (and labels ``y`` at the active party only).

        ``columns``: global indices of this party's columns (default: parties
        in rank order hold consecutive columns). ``monitor``: ``(X_held_out,
        y_held_out)`` for the learning curve in ``history_`` (labels at the
        active party only). ``log``: a ``vfltorch.runlog.RunLog`` for
        TensorBoard. ``progress``: a progress bar at the active party.
        Under the shared protocol the dealer (the coordinator) calls ``fit()``
        with no data. ``checkpoint`` (a folder, each party its own, the dealer
        too; ``vfltorch.checkpoint``): save the training state after every
        epoch and go on after the newest epoch every rank saved when the same
        fit is started again (bounded model).
        """
        check_hyperparameters(self)
        fed = self._federation()
        self._checkpoint = checkpoint
        if checkpoint is not None:
            self._check_resumable()
        shared = self._shared(fed)
        if shared:
            check_shared(self)
        if shared and fed.coordinator is None:
            raise VFLInputError("protocol='shared' needs a dealer: start the federation with a coordinator "
                                "(vfltorch.comm.launch(..., coordinator=True); `vfl fdskl` does this) or pass "
                                "protocol='paper'")
        if not fed.is_data_party and not shared:
            raise VFLInputError("FDSKL runs on the data parties; the coordinator has no part in it")
        if fed.is_coordinator:
            return self._fit_dealer(fed, monitor, log)
        device = torch.device(self.device) if self.device is not None else fed.device
        # The median heuristic needs two rows (centralised: scikit-learn's message names the sample count).
        X, _ = features(self, X, reset=True, federated=fed.num_parties > 1,
                        ensure_min_samples=2 if isinstance(self.sigma, str) else 1)
        X = self._as_tensor(X, device)
        loss = self._loss()
        problems = []
        if fed.is_active:
            try:
                y = self._encode_targets(y, X.shape[0])
            except VFLInputError as exc:     # reported through agree(): every party raises it together
                problems.append(str(exc))
                y = None
            problem = None if problems else label_problem(y, self._task, X.shape[0])
            if problem:
                problems.append(problem)
        elif y is not None:
            problems.append("a passive party passed labels: only the active party may hold them (pass y=None)")
        if not torch.isfinite(X).all():
            problems.append("X contains NaN or infinite values: impute them (e.g. --impute median) first")
        scaling = scaling_problem(X, fed.rank)
        plan = agree(fed, rows=X.shape[0], cols=X.shape[1], params=self.get_params(), problems=problems,
                     columns=None if columns is None else [int(c) for c in columns],
                     dealer=fed.coordinator if shared else None,
                     monitor_rows=None if monitor is None else int(len(monitor[0])),
                     step=self._sealed_step() if self._sealed(fed) else self._step_size())
        resumed = self._resume_point(fed, X, y if fed.is_active else None)
        warn_scaling(scaling)
        if self.protocol == "paper" and fed.num_parties > 1 and fed.is_active:
            warnings.warn(PAPER_LEAK, LeakWarning, stacklevel=2)
        elif self.protocol == "shared" and fed.num_parties > 1 and fed.is_active:
            warnings.warn(SHARED_LEAK, LeakWarning, stacklevel=2)

        self.n_features_in_ = X.shape[1]
        self.n_columns_total_ = plan["n_features"]
        self.columns_ = np.asarray(plan["columns"], dtype=np.int64)
        masks, phase_key = self._masks(fed)
        started = time.perf_counter()
        if resumed is not None:
            self.sigma_ = float(resumed[0]["setup"]["sigma"])     # the width the run began with (a masked estimate)
        elif isinstance(self.sigma, str):
            self.sigma_ = median_sigma(fed, X, seed=derive_key(self.random_state, 0x51), pairs=self.median_pairs,
                                       mask_seed=secrets.randbits(63), kernel=self.kernel)
        else:
            self.sigma_ = float(self.sigma)
        self.sigma_seconds_ = time.perf_counter() - started

        def make_map(multiplier: float) -> FederatedFeatureMap:
            return FederatedFeatureMap(
                fed, FourierSampler(self.kernel, self.sigma_ * multiplier, self.random_state), self.columns_,
                self.features_per_step, seed=self.random_state, phase_key=phase_key, masks=masks,
                circle=Circle(self.angle_bits), dtype=X.dtype, device=device, max_elements=self.max_elements,
                public_phases=self.protocol in SHARED_PROTOCOLS)

        y_fit = None
        if fed.is_active:
            y_fit = self._prepare_targets(torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y))
        table = share_table(fed, fed.coordinator) if shared else None
        sealed = self._sealed(fed)
        if sealed:
            self._check_sealed(fed, plan, X.shape[0])
        if resumed is not None:
            self._selected(resumed[0]["setup"])
        else:
            self._select_sigma(fed, make_map, X, y_fit, loss, dealer=fed.coordinator if shared else None,
                               table=table, sealed=sealed,
                               progress=progress and log is not None and getattr(log, "show_progress", False))
        setup = self._setup()
        if self.sigma_multiplier_ != 1.0:
            self.sigma_ = self.sigma_ * self.sigma_multiplier_
        self.feature_map_ = make_map(1.0)
        if monitor is not None:
            X_mon = self._as_tensor(monitor[0], device, X.dtype)
            y_mon = None
            if fed.is_active and monitor[1] is not None:
                y_mon = torch.as_tensor(self._encode_known(monitor[1]))
            monitor = (X_mon, y_mon)
        cfg = self._config(loss, X.shape[0])
        self.lam_, self.epochs_ = cfg.lam, cfg.epochs          # (what lam='auto' / epochs='auto' gave: small_data.py)
        if sealed:
            self.table_ = table
            cfg = self._config(loss, X.shape[0], self._sealed_step())
            result = train_sealed(fed, self.feature_map_, X, y_fit, cfg, n_blocks=self._n_blocks(),
                                  dealer=fed.coordinator, table=table, monitor=monitor, log=log,
                                  progress=progress and fed.is_active, **self._saver(setup, resumed))
        elif self._bounded():
            if shared:
                self.table_ = table
            result = train_budget(fed, self.feature_map_, X, y_fit, cfg, n_blocks=self._n_blocks(),
                                  dealer=fed.coordinator if shared else None, table=table, monitor=monitor,
                                  log=log, progress=progress and fed.is_active, **self._saver(setup, resumed))
            result = self._compress(fed, X, y_fit, cfg, result, dealer=fed.coordinator if shared else None,
                                    table=table)
        elif shared:
            self.table_ = table
            result = train_shared(fed, self.feature_map_, X, y_fit, cfg, dealer=fed.coordinator, table=self.table_,
                                  monitor=monitor, log=log, progress=progress and fed.is_active)
        else:
            result = train_dsg(fed, self.feature_map_, X, y_fit, cfg, monitor=monitor, log=log,
                               progress=progress and fed.is_active)
        return self._finish(fed, result)

    # ---------------------------------------------------------------------------------------- checkpoints
    def _check_resumable(self) -> None:
        if not self._bounded():
            raise VFLInputError("checkpoints (--checkpoint) are for FDSKL's bounded model (n_components, default "
                                "1536); the growing model (n_components=None) does not resume yet")

    def _resume_point(self, fed: Federation, X, y):
        """Collective (every rank, the dealer too, right after ``agree``): this rank's ``Checkpoints`` and the
        (state, arrays) to resume from, or None."""
        self._checkpoints = None
        if self._checkpoint is None:
            return None
        from ..checkpoint import Checkpoints, array_digest

        params = {k: v for k, v in self.get_params().items()
                  if isinstance(v, (bool, int, float, str, type(None))) and k not in ("device", "log_every")}
        params["sigma_grid"] = [float(c) for c in self.sigma_grid]
        data = array_digest(None if X is None else to_numpy(X), None if y is None else to_numpy(y))
        self._checkpoints = Checkpoints(fed, self._checkpoint, method="fdskl",
                                        fingerprint={"params": params, "rank": fed.rank, "world": fed.world_size,
                                                     "data": data})
        return self._checkpoints.resume()

    def _setup(self) -> dict:
        """What the run decided before training (its width, the selection's outcome): kept in every checkpoint,
        so that a resumed run trains the same model instead of estimating them again."""
        if getattr(self, "_checkpoints", None) is None:
            return {}
        # (the scores: the active party's list of {"multiplier", "accuracy" or "mse", "loss"}, None elsewhere)
        return json.loads(json.dumps({"sigma": float(self.sigma_), "multiplier": float(self.sigma_multiplier_),
                                      "scores": self.sigma_scores_,
                                      "selection_seconds": float(self.selection_seconds_)}))

    def _selected(self, setup: dict) -> None:
        self.sigma_multiplier_ = float(setup["multiplier"])
        self.sigma_scores_ = setup["scores"]
        self.selection_seconds_ = float(setup["selection_seconds"])

    def _saver(self, setup: dict, resumed) -> dict:
        """``train_budget``'s checkpoint arguments: a save that adds the setup, and the state to resume from."""
        ck = self._checkpoints
        if ck is None:
            return {}

        def save(t, state, arrays):
            ck.save(t, {**state, "setup": setup}, arrays)
        return {"checkpoint": save, "resume": resumed}

    def _select_sigma(self, fed: Federation, make_map, X, y_fit, loss, *, dealer, table, step=None,
                      sealed: bool = False, progress: bool = False) -> None:
        """``sigma_multiplier_``: the multiplier of the median width chosen on a held-out split (selection.py),
        1.0 when there is nothing to choose (a given sigma, the growing model, a one-value grid, small n).
        ``step``: the final model's (the dealer has it from the plan); ``sealed``: the candidates train under
        the sealed protocol (``selection.select_width_sealed``, which with ``progress`` announces its bytes, as
        training does where its progress bar shows: not under ``--quiet``)."""
        self.sigma_multiplier_, self.sigma_scores_, self.selection_seconds_ = 1.0, None, 0.0
        grid = tuple(float(c) for c in self.sigma_grid)
        if not (self._bounded() and isinstance(self.sigma, str) and wants_selection(X.shape[0], grid)):
            return
        # The candidates have SELECT_BLOCKS of the model's features. A given gamma is kept; the default rate
        # follows D as in _step_size (Adam: rate ~ 1 / sqrt(D)) and _sealed_step (momentum SGD: rate ~ 1 / D).
        blocks = max(1, int(self._n_blocks() * SELECT_BLOCKS))
        if sealed:
            step = self._sealed_step() if step is None else step
            if self.gamma is None:
                step = step * self._n_blocks() / blocks
        else:
            step = self._step_size() if step is None else step
            if self.gamma is None and self.solver == "adam":
                step = step * (self._n_blocks() / blocks) ** 0.5
        index, scores, seconds = (select_width_sealed if sealed else select_width)(
            fed, make_map, X, y_fit, lambda rows: self._config(loss, rows, step, train_rows=X.shape[0]), grid=grid,
            n_blocks=blocks, seed=derive_key(self.random_state, 0x5E1), dealer=dealer, table=table,
            task=self._task, **({"progress": progress} if sealed else {}))
        self.sigma_multiplier_, self.sigma_scores_, self.selection_seconds_ = grid[index], scores, seconds

    def _lam(self, n: int) -> float:
        """lambda for n training rows: a given one, or ``lam='auto'``'s (small_data.py; the growing model and the
        'dsg' solver, whose constant step would shrink the coefficients by gamma lambda: 1e-5)."""
        if self.lam != AUTO:
            return float(self.lam)
        if not (self._bounded() and self.solver == "adam"):
            return LARGE_LAM
        return auto_lam(n, self._n_blocks() * int(self.features_per_step))

    def _epochs(self, n: int):
        """The passes over n training rows: given ones (None: a time budget alone), or ``epochs='auto'``'s
        (small_data.py; the growing model: 4)."""
        if self.epochs != AUTO:
            return self.epochs
        return auto_epochs(n) if self._bounded() else LARGE_EPOCHS

    def _config(self, loss, n: int, step: float | None = None, *, train_rows: int | None = None) -> DSGConfig:
        """The training config for n rows (the batch size's); ``train_rows``: the model's training rows, which
        lambda and the epochs follow (default n; the width selection's candidates train on fewer)."""
        rows = n if train_rows is None else train_rows
        return DSGConfig(loss=loss, gamma=self._step_size() if step is None else step, lam=self._lam(rows),
                         batch_size=self._batch_size(n),
                         epochs=self._epochs(rows), max_time=self.max_time, schedule=self.schedule,
                         seed=derive_key(self.random_state, 0xBA7C), log_every=self.log_every,
                         prefetch=int(self.prefetch), task=self._task,
                         y_offset=getattr(self, "y_offset_", 0.0), y_scale=getattr(self, "y_scale_", 1.0),
                         solver=self.solver, max_elements=int(self.max_elements),
                         product_bits=int(self.product_bits), f_delay=self._f_delay())

    def _f_delay(self) -> int:
        """f on batch t from the coefficients before step t - 1 (1: the shared iteration is pipelined) or after it
        (0); 'auto': ``SHARED_F_DELAY`` under the shared protocol's bounded model, at every Q (the federated run
        equals its centralised twin), else 0."""
        if isinstance(self.f_delay, str):
            return SHARED_F_DELAY if self.protocol == "shared" and self._bounded() else 0
        return int(self.f_delay)

    def _fit_dealer(self, fed: Federation, monitor, log):
        """The dealer's side of fit: it follows the public schedule, deals masks and triples, holds no data."""
        plan = agree(fed, rows=0, cols=0, params=self.get_params(), problems=[], columns=None,
                     dealer=fed.coordinator)
        resumed = self._resume_point(fed, None, None)
        n = plan["rows"]
        self.n_features_in_ = 0
        self.columns_ = np.zeros(0, dtype=np.int64)
        # The dealer never computes a projection: its share of the feature map has no columns (and no sigma).
        self.sigma_ = float("nan")
        self.sigma_seconds_ = 0.0
        masks, phase_key = self._masks(fed)
        self.feature_map_ = FederatedFeatureMap(
            fed, FourierSampler(self.kernel, 1.0, self.random_state), self.columns_, self.features_per_step,
            seed=self.random_state, phase_key=phase_key, masks=masks, circle=Circle(self.angle_bits),
            public_phases=True)
        self.table_ = share_table(fed, fed.coordinator)
        empty = torch.zeros(n, 0, dtype=torch.float64)

        def make_map(multiplier: float) -> FederatedFeatureMap:
            return FederatedFeatureMap(
                fed, FourierSampler(self.kernel, 1.0, self.random_state), self.columns_, self.features_per_step,
                seed=self.random_state, phase_key=phase_key, masks=masks, circle=Circle(self.angle_bits),
                public_phases=True)

        sealed = self._sealed(fed)
        if sealed:
            self._check_sealed(fed, plan, n)
        if resumed is not None:
            self._selected(resumed[0]["setup"])
        else:
            self._select_sigma(fed, make_map, empty, None, self._loss(), dealer=fed.coordinator,
                               table=self.table_, step=plan["step"], sealed=sealed)
        setup = self._setup()
        mon = None
        if plan.get("monitor_rows") is not None:
            mon = (torch.zeros(plan["monitor_rows"], 0, dtype=torch.float64), None)
        # The step comes from the active party's plan: the dealer does not know the task's default loss.
        cfg = self._config(self._loss(), n, plan["step"])
        self.lam_, self.epochs_ = cfg.lam, cfg.epochs
        if sealed:
            result = train_sealed(fed, self.feature_map_, empty, None, cfg, n_blocks=self._n_blocks(),
                                  dealer=fed.coordinator, table=self.table_, monitor=mon,
                                  **self._saver(setup, resumed))
        elif self._bounded():
            result = train_budget(fed, self.feature_map_, empty, None, cfg, n_blocks=self._n_blocks(),
                                  dealer=fed.coordinator, table=self.table_, monitor=mon,
                                  **self._saver(setup, resumed))
            result = self._compress(fed, empty, None, cfg, result, dealer=fed.coordinator, table=self.table_)
        else:
            result = train_shared(fed, self.feature_map_, empty, None, cfg, dealer=fed.coordinator,
                                  table=self.table_, monitor=mon, log=None)
        return self._finish(fed, result)

    def _compress(self, fed: Federation, X, y, cfg, result, *, dealer, table):
        """Bounded model: keep ``compress_to`` of the D features and distil (``compress.py``); ``support_`` is then the
        kept features' indices at every rank (None: all D), and prediction evaluates only those.
        ``"if-faithful"`` (the default): distil into ``AUTO_COMPRESS[predict_bits]`` features when the training set
        has at least 2 D rows, then keep that student only if it is as good as the teacher on ``CHECK_ROWS``
        training rows from the public seed (``compress.check_student``: the active party decides and broadcasts one
        bit); else predict with the teacher's D features. ``"auto"``: the same D' without the check (the student is
        kept: it loses accuracy on hard data, docs/fdskl.md). ``"if-faithful:N"``: N features, checked. An integer:
        that D', kept. ``None``: no compression.
        Under 2 D training rows ``"auto"`` and ``"if-faithful"`` do not compress (the model is far from determined
        and distilling costs more than training). ``compress_support``: ``"public"`` (a seeded random subset,
        label-independent) or ``"alpha"`` (the largest |alpha_j|: every party learns which, ``SUPPORT_LEAK``).
        ``compress_``: the kept features, the refit's iterations, seconds and bytes of this party (the check's
        included), ``decision`` ("student" / "teacher") and, at the active party under ``"if-faithful"``,
        ``check`` (both models' check-set figures)."""
        self._set_support(None)
        self.compress_ = None
        D = self.feature_map_.n_features
        keep, checked = parse_compress_to(self.compress_to, int(self.predict_bits))
        if self.compress_to in ("auto", IF_FAITHFUL) and X.shape[0] < 2 * D:   # D' per ring width from 2 D rows on
            keep = None
        if keep is None or int(keep) >= D or self.solver != "adam":
            return result
        if self.compress_support == "alpha" and fed.num_parties > 1 and fed.is_active:
            warnings.warn(SUPPORT_LEAK, LeakWarning, stacklevel=3)
        n = X.shape[0]
        check, _ = compress_rows(n, derive_key(self.random_state, 0xC4EC))
        started = time.perf_counter()
        before = compress_sent(fed)
        support, alpha, refit = compress_budget(fed, self.feature_map_, X, cfg, result.alpha,
                                                keep=int(keep), epochs=float(self.compress_epochs),
                                                trained=result.iterations, dealer=dealer, table=table,
                                                support=self.compress_support,
                                                support_seed=derive_key(self.random_state, 0xC0DE5),
                                                opened=2 * len(check) if checked else 0)
        verdict = {"keep": True}
        if checked:
            verdict = check_student(fed, self.feature_map_, X[check.to(X.device)],
                                    None if y is None else y[check], result.alpha, alpha, support, dealer=dealer,
                                    table=table, loss=cfg.loss, task=self._task, max_elements=int(self.max_elements))
        sent = compress_sent(fed)
        self.compress_ = {"features": int(len(support)) if verdict["keep"] else D,
                          "decision": "student" if verdict["keep"] else "teacher",
                          "refit_iterations": refit.iterations, "refit_seconds": time.perf_counter() - started,
                          "refit_bytes_sent": sent[0] - before[0]}
        if checked and fed.is_active:
            self.compress_["check"] = {k: v for k, v in verdict.items() if k != "keep"}
        if verdict["keep"]:
            self._set_support(support)
            result.alpha = alpha
        return result

    def _set_alpha(self, alpha) -> None:
        """The random-feature coefficients: the model computes with ``_alpha``, a tensor on the estimator's device;
        ``alpha_`` is their numpy copy on the host, as scikit-learn's fitted attributes are (None where this party
        holds none)."""
        self._alpha = alpha
        self.alpha_ = None if alpha is None else to_numpy(alpha).copy()

    def _set_support(self, support) -> None:
        """A compressed model's kept features (public): ``_support`` (int64 tensor) for the model, ``support_``
        (numpy) for the user; None when nothing was compressed."""
        self._support = support
        self.support_ = None if support is None else to_numpy(support).copy()

    def _finish(self, fed: Federation, result):
        # _alpha lives on the estimator's device (the shared protocol's host products hand it over on the CPU).
        self._set_alpha(same_device(result.alpha, self.feature_map_.device))
        self.n_iter_ = result.iterations
        self.n_random_features_ = self.feature_map_.n_features
        self.train_seconds_ = result.train_seconds
        self.history_ = result.history
        self.batch_loss_ = result.batch_loss
        self.train_loss_ = result.train_loss
        self.comm_ = self._gather_comm(fed, result)
        ck = getattr(self, "_checkpoints", None)
        if ck is not None:
            ck.finish()                     # trained (and compressed): nothing left to resume
            self.resumed_from_ = ck.resumed_from
            self._checkpoints = None        # (it holds the federation: not part of the fitted model)
        return self

    def _prepare_targets(self, y: torch.Tensor) -> torch.Tensor:
        return y.to(torch.float64)

    def _encode_targets(self, y, n: int):
        """The active party's training targets as the method needs them (the classifier: -1 / +1)."""
        require_y(self, y)
        return y if isinstance(y, torch.Tensor) else _check_y(y, y_numeric=True, estimator=self)

    def _encode_known(self, y):
        """Held-out targets, encoded as at fit."""
        return np.asarray(y) if not isinstance(y, torch.Tensor) else y

    def _comm_ranks(self, fed: Federation) -> list[int]:
        return fed.parties + ([fed.coordinator] if self._shared(fed) else [])

    def _gather_comm(self, fed: Federation, result) -> dict | None:
        """Training bytes and messages of every party (and the dealer), at the active party."""
        mine = {"bytes_sent": result.bytes_sent, "messages_sent": result.messages_sent}
        ranks = self._comm_ranks(fed)
        with fed.phase("fdskl/report"):
            every = fed.gather_json(mine, fed.active, ranks=ranks)
        if not fed.is_active:
            return None
        sent = sum(e["bytes_sent"] for e in every)
        return {"train_bytes_sent_per_party": [e["bytes_sent"] for e in every],
                "train_messages_sent_per_party": [e["messages_sent"] for e in every],
                "train_bytes_sent_total": sent,
                "bytes_per_iteration": sent / max(1, self.n_iter_)}

    # ------------------------------------------------------------ predict
    def _check_fitted(self):
        check_fitted(self, "feature_map_")

    def decision_function(self, X=None):
        """f(x) for the rows of X (this party's columns): values at the active party, None elsewhere.

        Under the shared protocol the dealer calls it too, without X.
        """
        return self._decide(X)

    def _decide(self, X=None, classes: int | None = None):
        """decision_function; ``classes``: one-vs-rest with ``alpha_`` D x classes (bounded, shared)."""
        self._check_fitted()
        fed = self.feature_map_.fed
        shared = self._shared(fed)
        as_numpy = not isinstance(X, torch.Tensor)
        problems = []
        if fed.is_coordinator:
            X = None
        else:
            X, _ = features(self, X, reset=False, federated=fed.num_parties > 1)
            X = self._as_tensor(X, self.feature_map_.device, self.feature_map_.dtype)
            if X.shape[1] != self.n_features_in_:
                problems.append(f"X has {X.shape[1]} columns but this party was fitted with {self.n_features_in_}")
            elif not torch.isfinite(X).all():
                problems.append("X contains NaN or infinite values: impute them as for training")
        ranks = self._comm_ranks(fed)
        with fed.phase("fdskl/predict"):
            reports = None
            if fed.rank in fed.parties:
                reports = fed.gather_json({"rows": X.shape[0], "problems": problems}, fed.active, ranks=fed.parties)
            verdict = None
            if fed.is_active:
                errors = [f"{fed.name(p)}: {e}" for p, r in zip(fed.parties, reports) for e in r["problems"]]
                if len({r["rows"] for r in reports}) > 1:
                    errors.append("the parties passed different numbers of rows to predict: "
                                  + ", ".join(f"{fed.name(p)}: {r['rows']}" for p, r in zip(fed.parties, reports)))
                verdict = {"error": "; ".join(errors) or None, "rows": X.shape[0]}
            verdict = fed.broadcast_json(verdict, fed.active, ranks=ranks)
            if verdict["error"]:
                raise VFLInputError(verdict["error"])
            if shared:
                if X is None:
                    X = torch.zeros(verdict["rows"], 0, dtype=torch.float64)
                f = shared_decision_values(fed, self.feature_map_, X, self._alpha, dealer=fed.coordinator,
                                           table=self.table_, max_elements=self.max_elements, classes=classes,
                                           support=getattr(self, "_support", None),
                                           bits=int(getattr(self, "predict_bits", 32)))
                if f is not None:
                    f = f.to(device=self.feature_map_.device, dtype=self.feature_map_.dtype)
            else:
                f = self.feature_map_.decision_values(X, self._alpha, support=getattr(self, "_support", None))
        if f is None:
            return None
        f = self._untransform(f)
        return to_numpy(f) if as_numpy else f

    def _untransform(self, f: torch.Tensor) -> torch.Tensor:
        return f

    # -------------------------------------------------------- save / load (vfltorch.model_store)
    _model_method = "fdskl"

    def _model_fed(self):
        self._check_fitted()
        return self.feature_map_.fed

    def _shard_state(self):
        from .persist import fdskl_shard_state

        self._check_fitted()
        return fdskl_shard_state(self)

    def _restore_shard(self, manifest, arrays, fed):
        from .persist import restore_fdskl_shard

        restore_fdskl_shard(self, manifest, arrays, fed)

    def __getstate__(self):
        # A pickle never carries the state of a private mask stream: it is redrawn from the OS on unpickling.
        state = dict(self.__dict__)
        fmap = state.get("feature_map_")
        if fmap is not None and getattr(fmap, "masks", None) is not None:
            import copy

            fmap = copy.copy(fmap)
            fmap.masks = None
            state["feature_map_"] = fmap
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        fmap = self.__dict__.get("feature_map_")
        if fmap is not None and fmap.masks is None:
            fmap.masks = self._masks(fmap.fed)[0]


def _logistic_loss(est) -> bool:
    return (est.loss or est._default_loss) == "logistic"


def _calibrated(est) -> bool:
    """``predict_proba`` exists where it means something: the logistic loss with Platt scaling (``calibration``).
    Uncalibrated, this model's sigmoid(f) is 0 or 1 on nearly every row (|f| ~ 100 on breast_cancer): scikit-learn's
    ``SVC`` has the same rule (``probability=True``), and says why in the AttributeError, as here."""
    if not _logistic_loss(est):
        return False
    if est.calibration is None:
        raise AttributeError("predict_proba needs calibration, e.g. FDSKLClassifier(calibration=0.1): Platt scaling "
                             "on 10% of the training rows held out; uncalibrated, sigmoid(f) is 0 or 1 on nearly "
                             "every row. decision_function gives the scores (as SVC without probability=True)")
    if getattr(est, "estimators_", None):
        raise AttributeError("predict_proba: a one-vs-rest FDSKL model (three or more classes) has no calibrated "
                             "probabilities yet; decision_function gives each class's score")
    return True


# Platt scaling (FDSKLClassifier(calibration=0.1)): the fraction of the training rows held out to fit
# P(y = 1 | f) = sigmoid(A f + B), at least CALIBRATION_MIN_ROWS rows (at most CALIBRATION_MAX_ROWS).
# Off by default, and then there is no predict_proba (``_calibrated``): on, the model trains on fewer rows.
CALIBRATION_FRACTION = 0.1
CALIBRATION_MIN_ROWS = 20
CALIBRATION_MAX_ROWS = 5000


def calibration_rows(n: int | None, fraction, seed: int):
    """The held-out rows for Platt scaling (sorted indices, from the public seed: the same at every party), or None
    when ``fraction`` is None/0; fewer than ``CALIBRATION_MIN_ROWS`` are refused (say what to change)."""
    if not n or not fraction:
        return None
    if not 0 < float(fraction) < 0.5:
        raise VFLInputError(f"calibration must be a fraction of the training rows in (0, 0.5) or None, got "
                            f"{fraction!r}")
    m = min(CALIBRATION_MAX_ROWS, int(round(float(fraction) * n)))
    if m < CALIBRATION_MIN_ROWS:
        raise VFLInputError(f"calibration={fraction} holds out {m} of the {n} training rows, fewer than the "
                            f"{CALIBRATION_MIN_ROWS} Platt scaling needs: pass a larger fraction (below 0.5), or "
                            f"calibration=None (no predict_proba; decision_function gives the scores)")
    rng = np.random.default_rng(derive_key(seed, 0xCA1B) % 2 ** 63)
    return np.sort(rng.choice(n, size=m, replace=False))


def _rows(A, idx):
    """Rows ``idx`` of an array, a pandas frame / series or a list."""
    if hasattr(A, "iloc"):
        return A.iloc[idx]
    return np.asarray(A)[idx]


def fit_platt(f: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(A, B) of Platt (1999): P(y = +1 | f) = sigmoid(A f + B) by maximum likelihood on held-out decision values,
    with Platt's smoothed targets ((N+ + 1) / (N+ + 2), 1 / (N- + 2)) against overfitting small sets; A >= 0
    (a larger f never means a smaller probability)."""
    from scipy.optimize import minimize

    f = np.asarray(f, dtype=np.float64).reshape(-1)
    pos = np.asarray(y).reshape(-1) > 0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    t = np.where(pos, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    scale = float(np.std(f)) or 1.0               # fit on f / scale: |f| ~ 100 would make the problem stiff
    z = f / scale

    def loss(p):
        m = p[0] * z + p[1]
        # -[t log s(m) + (1 - t) log(1 - s(m))] = log(1 + e^m) - t m
        value = np.logaddexp(0.0, m) - t * m
        s = 0.5 * (1.0 + np.tanh(0.5 * m))
        g = s - t
        return float(value.sum()), np.array([float(g @ z), float(g.sum())])

    res = minimize(loss, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B", bounds=[(0.0, None), (None, None)])
    return float(res.x[0] / scale), float(res.x[1])


class FDSKLClassifier(ClassifierMixin, _FDSKLBase):
    """FDSKL classifier. Losses: logistic (default), smooth_hinge, square.

    Labels: any two values (``classes_``, sorted; the second is the positive class), trained on as
    -1 / +1; ``predict`` returns them. With three or more distinct labels, one-vs-rest: one binary
    model per class (``estimators_``), the class of the largest decision value wins.
    ``calibration`` (binary, logistic loss): a fraction of the training rows (e.g. 0.1) held out, drawn from
    the public seed, on whose decision values the active party fits Platt scaling (``platt_`` = (A, B):
    ``predict_proba`` = sigmoid(A f + B)); None (the default): every row trains and there is no
    ``predict_proba`` (the raw sigmoid(f) is nearly always 0 or 1 for this model; scikit-learn's SVC has the same
    rule), ``decision_function`` gives the scores (docs/fdskl.md, *Probabilities*).
    """

    _task = "binary"
    _default_loss = "logistic"

    def __init__(self, fed: Federation | None = None, *, kernel: str = "rbf", sigma="median", loss: str | None = None,
                 lam="auto", gamma: float | None = None, batch_size: int | None = None,
                 features_per_step: int = 32, epochs="auto", max_time: float | None = None,
                 schedule: str = "cached", random_state: int = 0, mask_seed="random", angle_bits: int = 16,
                 median_pairs: int = 1000, log_every: int | None = None, max_elements: int = 2 ** 22,
                 prefetch: int = 1, device=None, protocol: str = "sealed", n_components: int | None = 1536,
                 solver: str = "adam", sigma_grid=SIGMA_GRID, compress_to=IF_FAITHFUL, compress_epochs: float = 1.0,
                 product_bits: int = 20, compress_support: str = "public", predict_bits: int = PREDICT_BITS,
                 f_delay="auto", calibration: float | None = None):
        super().__init__(fed, kernel=kernel, sigma=sigma, loss=loss, lam=lam, gamma=gamma, batch_size=batch_size,
                         features_per_step=features_per_step, epochs=epochs, max_time=max_time, schedule=schedule,
                         random_state=random_state, mask_seed=mask_seed, angle_bits=angle_bits,
                         median_pairs=median_pairs, log_every=log_every, max_elements=max_elements,
                         prefetch=prefetch, device=device, protocol=protocol, n_components=n_components,
                         solver=solver, sigma_grid=sigma_grid, compress_to=compress_to,
                         compress_epochs=compress_epochs, product_bits=product_bits,
                         compress_support=compress_support, predict_bits=predict_bits, f_delay=f_delay)
        self.calibration = calibration

    def _encode_targets(self, y, n: int):
        return torch.as_tensor(BinaryLabels.fit(self, y, n))

    def _encode_known(self, y):
        return BinaryLabels.encode(self, y)

    def fit(self, X, y=None, *, columns=None, monitor=None, log=None, progress: bool = False, checkpoint=None):
        fed = self._federation()
        classes, rows = self._agree_classes(fed, y, X)
        self.estimators_ = None
        self.platt_ = None
        if classes is not None:
            if checkpoint is not None:
                raise VFLInputError("checkpoints (--checkpoint) are for binary classification and regression; a "
                                    "multiclass FDSKL run (one model per class) does not resume yet")
            if self.calibration is not None:
                raise VFLInputError(f"calibration is for binary classification; with {classes} classes (one model "
                                    f"per class) leave it None and use decision_function for the scores")
            return self._fit_one_vs_rest(fed, X, y, classes, columns, monitor, log, progress)
        held = calibration_rows(rows, self.calibration, self.random_state) if _logistic_loss(self) else None
        if held is None:
            return super().fit(X, y, columns=columns, monitor=monitor, log=log, progress=progress,
                               checkpoint=checkpoint)
        # Platt scaling on held-out rows: the model trains on the others; the same public split at every party.
        keep = np.setdiff1d(np.arange(rows), held)
        cut = (lambda A, idx: None if A is None else A[idx] if isinstance(A, torch.Tensor)
               else _rows(A, idx))
        super().fit(cut(X, keep), cut(y, keep), columns=columns, monitor=monitor, log=log, progress=progress,
                    checkpoint=checkpoint)
        f = self.decision_function(cut(X, held)) if fed.is_data_party else self.decision_function()
        if fed.is_active:        # f on the held-out rows: what predicting them gives the active party anyway
            self.platt_ = fit_platt(to_numpy(f), self._encode_known(cut(y, held)))
        return self

    def _agree_classes(self, fed: Federation, y, X=None):
        """(the number of classes (>= 3: one-vs-rest) or None (binary), the active party's row count), from the
        active party to every rank.

        Only the counts cross the wire (every party has the rows; the dealer learns their number from the plan
        of fit anyway); the class values stay at the active party.
        """
        from sklearn.utils.multiclass import check_classification_targets

        count, problem = None, None
        if fed.is_active and y is not None:
            labels = to_numpy(y).reshape(-1)
            try:
                check_classification_targets(labels)     # a continuous target is an error, not 500 classes
            except ValueError as exc:
                problem = str(exc)
            else:
                values = np.unique(labels)
                count = int(len(values)) if len(values) >= 3 else None
        rows = None
        if fed.is_active and X is not None:
            try:
                rows = int(len(X))
            except TypeError:
                rows = None
        shared = self._shared(fed) and fed.coordinator is not None
        ranks = fed.parties + ([fed.coordinator] if shared else [])
        if fed.rank not in ranks:
            return None, None
        with fed.phase("fdskl/setup"):
            agreed = fed.broadcast_json({"classes": count, "problem": problem, "rows": rows}, fed.active,
                                        ranks=ranks)
        if agreed["problem"]:          # every rank stops with the active party's reason
            raise VFLInputError(agreed["problem"])
        return agreed["classes"], agreed.get("rows")

    def _fit_one_vs_rest(self, fed, X, y, count, columns, monitor, log, progress):
        """One binary model per class, fitted one after the other by every rank (same features: same seed)."""
        params = self.get_params()
        labels = mon_labels = None
        if fed.is_active:
            from sklearn.utils.validation import column_or_1d

            labels = column_or_1d(to_numpy(y), warn=True)  # (n, 1): warns
            self.classes_ = np.unique(labels)
            if monitor is not None and monitor[1] is not None:
                mon_labels = to_numpy(monitor[1])
        self.estimators_ = []
        for k in range(count):
            est = FDSKLClassifier(**params)
            y_k = mon = None
            if fed.is_active:
                y_k = np.where(labels == self.classes_[k], 1.0, -1.0)
            if monitor is not None:
                mon = (monitor[0], None if mon_labels is None else np.where(mon_labels == self.classes_[k], 1.0, -1.0))
            _FDSKLBase.fit(est, X, y_k, columns=columns, monitor=mon, log=log if k == 0 else None,
                           progress=progress)
            est.estimators_ = None
            self.estimators_.append(est)
        first = self.estimators_[0]
        for name in ("sigma_", "sigma_seconds_", "sigma_multiplier_", "sigma_scores_", "selection_seconds_",
                     "n_features_in_", "columns_", "feature_map_", "n_random_features_",
                     "batch_loss_", "train_loss_"):
            if hasattr(first, name):
                setattr(self, name, getattr(first, name))
        if hasattr(first, "n_columns_total_"):
            self.n_columns_total_ = first.n_columns_total_
        if hasattr(first, "table_"):
            self.table_ = first.table_
        # Prediction evaluates the phases once for every class: on the union of the classes' kept features.
        supports = [getattr(e, "_support", None) for e in self.estimators_]
        self._set_support(None if any(x is None for x in supports) else torch.unique(torch.cat(supports)))
        self.n_iter_ = sum(e.n_iter_ for e in self.estimators_)
        self.train_seconds_ = sum(e.train_seconds_ for e in self.estimators_)
        self.history_ = first.history_
        self._set_alpha(torch.stack([e._alpha for e in self.estimators_], dim=1) if fed.is_active else None)
        self.comm_ = None
        if fed.is_active:
            every = [e.comm_ for e in self.estimators_]
            self.comm_ = {"train_bytes_sent_per_party": [sum(v) for v in zip(*(c["train_bytes_sent_per_party"]
                                                                                for c in every))],
                          "train_messages_sent_per_party": [sum(v) for v in zip(*(c["train_messages_sent_per_party"]
                                                                                  for c in every))],
                          "train_bytes_sent_total": sum(c["train_bytes_sent_total"] for c in every)}
            self.comm_["bytes_per_iteration"] = self.comm_["train_bytes_sent_total"] / max(1, self.n_iter_)
        return self

    def decision_function(self, X=None):
        """f(x) at the active party: (rows,) for a binary model, (rows, classes) one-vs-rest; None elsewhere."""
        if getattr(self, "estimators_", None):
            fed = self.feature_map_.fed
            if self._bounded() and self._shared(fed):
                # The same D features for every class: the phases once, one product for all classes.
                return self._decide(X, classes=len(self.estimators_))
            parts = [e.decision_function(X) for e in self.estimators_]
            if parts[0] is None:
                return None
            return np.stack(parts, axis=1) if isinstance(parts[0], np.ndarray) else torch.stack(parts, dim=1)
        return super().decision_function(X)

    def predict(self, X):
        """The labels of fit at the active party (binary: the sign of f, 0 counts as ``classes_[1]``;
        one-vs-rest: the class of the largest f), None elsewhere.

        torch input and numeric labels give a float64 tensor, else a numpy array.
        """
        f = self.decision_function(X)
        if f is None:
            return None
        if getattr(self, "estimators_", None):
            out = self.classes_[np.asarray(torch.as_tensor(f).argmax(dim=1))]
            return out if isinstance(f, np.ndarray) else torch.as_tensor(out)
        return BinaryLabels.decode(self, f >= 0, as_torch=isinstance(f, torch.Tensor),
                                   like=f if isinstance(f, torch.Tensor) else None)

    @available_if(_calibrated)
    def predict_proba(self, X):
        """[P(classes_[0]), P(classes_[1])] at the active party (n x 2 numpy), None elsewhere.

        With ``calibration`` only (``platt_``, fitted on held-out rows): sigmoid(A f + B), Platt's calibrated
        probability. ``predict`` stays the sign of f: on rows near the boundary it can disagree with
        ``argmax predict_proba`` (as scikit-learn's ``SVC(probability=True)``)."""
        f = self.decision_function(X)
        if f is None:
            return None
        platt = getattr(self, "platt_", None)
        if platt is None:        # (a model loaded from a store written before calibration existed)
            raise VFLInputError("this model was fitted without Platt scaling: predict_proba needs a fit with "
                                "calibration (e.g. 0.1); decision_function gives the scores")
        f = platt[0] * torch.as_tensor(f, dtype=torch.float64) + platt[1]
        return proba_columns(torch.sigmoid(f))

    def score(self, X, y=None):
        """Accuracy at the active party (every party must call it with its own columns), None elsewhere."""
        if getattr(self, "estimators_", None):
            pred = self.predict(X)
            if pred is None:
                return None
            return float(np.mean(to_numpy(pred) == to_numpy(y)))
        f = self.decision_function(X)
        if f is None:
            return None
        return held_out_metrics(torch.as_tensor(f), torch.as_tensor(self._encode_known(y)), "binary")["accuracy"]


class FDSKLRegressor(RegressorMixin, _FDSKLBase):
    """FDSKL regression with the square loss. With ``normalize_y`` the active party fits (y - mean) / std."""

    _task = "regression"
    _default_loss = "square"

    def _expected_failed_checks(self) -> dict:
        """scikit-learn checks that do not apply, with the reason (read by tests/test_sklearn_citizens.py)."""
        return {"check_regressors_no_decision_function": (
            "decision_function is FDSKL's f(x), the value the federated predict protocol computes for both tasks "
            "(the CLI and the dealer call it); for the regressor it equals predict")}

    def __init__(self, fed: Federation | None = None, *, kernel: str = "rbf", sigma="median", loss: str | None = None,
                 lam: float = 1e-5, gamma: float | None = None, batch_size: int | None = None,
                 features_per_step: int = 32, epochs: float | None = 4.0, max_time: float | None = None,
                 schedule: str = "cached", random_state: int = 0, mask_seed="random", angle_bits: int = 16,
                 median_pairs: int = 1000, log_every: int | None = None, max_elements: int = 2 ** 22,
                 prefetch: int = 1, device=None, protocol: str = "sealed", n_components: int | None = 1536,
                 solver: str = "adam", sigma_grid=SIGMA_GRID, compress_to=IF_FAITHFUL, compress_epochs: float = 1.0,
                 product_bits: int = 20, compress_support: str = "public", predict_bits: int = PREDICT_BITS,
                 f_delay="auto", normalize_y: bool = True):
        super().__init__(fed, kernel=kernel, sigma=sigma, loss=loss, lam=lam, gamma=gamma, batch_size=batch_size,
                         features_per_step=features_per_step, epochs=epochs, max_time=max_time, schedule=schedule,
                         random_state=random_state, mask_seed=mask_seed, angle_bits=angle_bits,
                         median_pairs=median_pairs, log_every=log_every, max_elements=max_elements,
                         prefetch=prefetch, device=device, protocol=protocol, n_components=n_components,
                         solver=solver, sigma_grid=sigma_grid, compress_to=compress_to,
                         compress_epochs=compress_epochs, product_bits=product_bits,
                         compress_support=compress_support, predict_bits=predict_bits, f_delay=f_delay)
        self.normalize_y = normalize_y

    def _prepare_targets(self, y: torch.Tensor) -> torch.Tensor:
        y = y.to(torch.float64)
        self.y_offset_, self.y_scale_ = 0.0, 1.0
        if self.normalize_y:
            std = float(y.std()) if y.numel() > 1 else 1.0
            self.y_offset_, self.y_scale_ = float(y.mean()), (std if std > 0 else 1.0)
        return (y - self.y_offset_) / self.y_scale_

    def _untransform(self, f: torch.Tensor) -> torch.Tensor:
        return f * getattr(self, "y_scale_", 1.0) + getattr(self, "y_offset_", 0.0)

    def predict(self, X):
        """Predicted targets at the active party, None elsewhere."""
        return self.decision_function(X)

    def score(self, X, y=None):
        """R^2 at the active party, None elsewhere."""
        f = self.decision_function(X)
        if f is None:
            return None
        return held_out_metrics(torch.as_tensor(f), torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor)
                                                                     else y), "regression")["r2"]
