"""``HeteroLogisticRegression``: encrypted vertical logistic regression, SGD (Hardy et al.) or SQN (Yang et al.).

Every process of the federation builds the same estimator (same
hyperparameters) with its ``Federation`` handle and calls ``fit`` with what
it holds:

* the guest (the active party, rank 0): its columns of the training rows and
  the labels y in {-1, +1};
* each host (the other data parties): its columns of the same rows, in the
  same order, and no labels;
* the coordinator (``fed.coordinator``, started with ``coordinator=True``):
  nothing (``fit(None)``); it makes the Paillier key pair and keeps the
  private key.

    >>> lr = HeteroLogisticRegression(fed, optimizer="sqn", batch_size=1000)
    >>> lr.fit(data.X_train, data.y_train)            # data is None at the coordinator
    >>> lr.decision_function(data.X_test)             # scores at the guest, None elsewhere

Without a federation (or with ``Federation.local()``) it is the centralised
twin: one party with every column, the same optimizer (``local.py``).

``protocol="shared"`` (the default) runs ``shared.py`` instead: the model stays additive shares
between the guest and the one host, the coordinator only deals Beaver triples. The paper's
protocol (``protocol="paper"``), per mini-batch S (see ``host.py``, ``guest.py``, ``party.py``,
``coordinator.py`` for each role's steps and what it learns):

1. hosts -> guest: [[U]] (sum of host margins) and [[sum_i U_i^2]], along the host chain;
2. guest: [[d]] = [[U]]/4 + u_B/4 - y/2 -> hosts; [[8 sum_i l_i]] -> coordinator;
3. every data party l: [[G_l]] = [[d]]^T X_l + |S| lambda w_l -> coordinator, masked in SGD steps;
4. coordinator: decrypts; SGD step: G_l + r_l back to l; SQN step (k > 2L): p = H_t g (two-loop), p_l to l;
5. every data party: w_l <- w_l - eta_e p_l (p_l = g_l in SGD steps).

Every L iterations (SQN, t >= 2) a curvature round: s_l -> coordinator,
hosts -> guest [[Z]] = [[sum X_h s_h]] over S_H, guest -> hosts [[h]] =
[[(Z + X_B s_B)/4]], every party -> coordinator [[h^T X_l + |S_H| lambda s_l]].

Prediction: each data party computes u_l = X_l w_l (+ the intercept at the
guest) and the parties sum them with ring masks (``vfltorch.comm.secure_sum``):
the guest learns the score u = sum_l u_l of each row and nothing else; the
hosts learn nothing. With a single host the guest can subtract its own
part, so the score reveals the host's partial score u_A of each scored row -
inherent in the guest holding the scores. Per-epoch monitoring
(``monitor=``) reveals those scores of the monitored rows at every epoch.

Learned state (trailing underscore): ``coef_`` (this party's block; the
guest's without the intercept), ``intercept_`` (guest), ``n_iter_``
(iterations), ``n_epochs_``, ``converged_``, ``train_loss_`` (guest and
coordinator: the last epoch's loss, ``stopping.py``), ``history_`` (guest:
one dict per epoch), ``comm_`` (guest: bytes per epoch per party),
``timings_`` (guest: per-party seconds by phase), ``encryption_``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin

from ..comm import Federation, MaskStream, secure_sum
from ..crypto import MIN_KEY_BITS, generate_keypair
from ..data.estimator_input import (BinaryLabels, NotFittedError, binary_classifier_tags, features, output,
                                    proba_columns, require_y)
from ..data.validation import VFLInputError
from ..devices import to_numpy
from ..model_store import ShardedModelMixin
from .batches import BatchPlan, batch_too_large
from .bounds import FEATURE_MAX, PublicBounds, quantize
from .cipher import PaillierScheme, PlaintextScheme
from .coordinator import Coordinator
from .guest import Guest
from .host import Host
from .lbfgs import CurvatureMemory
from .local import LocalLearner
from .masks import MaskSource
from .packed import PackedCoordinator, PackedGuest, PackedHost
from .packed_check import check_packed
from .resume import restore, snapshot
from .shared import DEFAULT_FEATURE_BITS as SHARED_FEATURE_BITS, SharedRole
from .optimizers import IterationPlan, StepSize
from .session import PHASE_MONITOR, PHASE_PREDICT, PHASE_REPORT, PHASE_SCALE, PHASE_SETUP, TRAIN_PHASES, Session
from .standardize import OwnColumnScaling, to_raw_scale
from .stopping import LossTracker

log = logging.getLogger("vfltorch.linear")

OPTIMIZERS = ("sgd", "sqn")
PROTOCOLS = ("shared", "paper")
DEFAULT_BATCH = 1000
PAPER_WARNING = ("PAPER protocol (Hardy et al. / Yang et al.): the host unmasks its exact gradient block "
                 "X_A^T d / |S| at every step, which reveals the labels (the first batch exactly, since d = -y/2 "
                 "at w = 0; later batches by least squares over the steps); the coordinator sees every SQN "
                 "gradient and every curvature pair (s, v) in the clear. The default protocol='shared' reveals "
                 "neither.")
MONITOR_WARNING = ("--monitor scores the test rows after every epoch: the guest receives the host's partial score "
                   "X_A^test w_A of every test row per epoch, from which it rebuilds the host's test columns (up to "
                   "a linear map) after a few epochs. Use it on public or synthetic data only.")
SIMULATION_WARNING = ("SIMULATION mode: masks come from the seeded stream of mask_seed / --mask-seed; whoever knows "
                      "the seed removes them. This run carries NO privacy guarantee.")
SHARED_LABEL = "additive secret sharing on Z_2^64 (Beaver triples dealt by the coordinator)"

PRECOMPUTE = ("batch", "epoch", "background", "none")
DEFAULT_LR = {"sgd": 0.15, "sqn": 0.3}
DEFAULT_DECAY = {"sgd": 0.0, "sqn": 1.0}
INSECURE_WARNING = ("INSECURE plaintext mode: the hetero-LR protocol runs WITHOUT encryption; every party sees "
                    "residuals (which reveal the labels) in the clear. Use it for debugging and for measuring the "
                    "cost of encryption only.")

# Hyperparameters every process must share (mask_seed and device are each party's own).
_AGREED = ("protocol", "optimizer", "batch_size", "lr", "decay", "decay_sqrt", "L", "M", "hessian_batch", "l2",
           "fit_intercept", "max_epochs", "tol", "encryption", "key_bits", "insecure_key", "feature_frac_bits",
           "mask_bits", "random_state", "obfuscation", "packed_features", "standardize")


class HeteroLogisticRegression(ShardedModelMixin, ClassifierMixin, BaseEstimator):
    """Vertical logistic regression on the Taylor loss under Paillier encryption (guest, hosts, coordinator).

    Parameters
    ----------
    fed: the party's ``Federation`` (None: the centralised twin).
    protocol: ``"shared"`` (default: the model kept as additive shares between the guest and the one host,
        ``shared.py``; nobody learns a per-step gradient, the coordinator only deals Beaver triples) or
        ``"paper"`` (Hardy / Yang with Paillier: the host learns its gradient blocks, which reveal labels;
        the coordinator sees SQN gradients and curvature pairs; warns).
    optimizer: ``"sgd"`` (Hardy et al. 2017) or ``"sqn"`` (Yang et al.: stochastic quasi-Newton).
    batch_size: rows |S| per iteration (None: min(1000, training rows)).
    lr, decay, decay_sqrt: step eta_e = lr / (1 + decay e) (or / sqrt(1 + decay e)), e the epoch;
        ``None`` takes the optimizer's default (sgd: 0.15, no decay; sqn: 0.3, decay 1).
    L, M: SQN's update interval (curvature pair every L iterations) and L-BFGS memory.
    hessian_batch: |S_H| rows per Hessian-vector product (None: ``batch_size``).
    l2: lambda of the penalty (lambda/2) ||w||^2 (the intercept is not penalised).
    fit_intercept: the guest holds an intercept column.
    standardize: True (default): each data party standardises its own columns inside ``fit`` (mean and
        standard deviation of its training columns, computed locally: nothing crosses the wire), the model
        trains on them, and the fitted blocks are mapped back to the raw columns, so ``coef_`` /
        ``intercept_`` are the coefficients of the columns as given and ``predict`` takes raw rows.
        The raw intercept needs sum_q coef_q . mean_q over the parties: one number per party, added by the
        masked sum of the prediction path at the guest, which learns that total (with one host: the mean of
        the host's raw partial score over the training rows), nothing per feature or per row
        (``standardize.py``). Without ``fit_intercept`` the columns are only divided by their standard
        deviations and nothing is exchanged. False: train on the columns as given (``vfl hetero-lr``
        scales them when it loads them, ``--scale``, and passes False).
    max_epochs, tol: stop when the epoch loss changes by less than ``tol``, or after ``max_epochs``.
    encryption: False runs the same protocol in the clear (INSECURE; debugging, cost of encryption).
    key_bits: Paillier modulus size (2048); under 1024 only with ``insecure_key`` (tests).
    feature_frac_bits: fractional bits of features (and other plaintext multipliers) in the encrypted
        products: the exponent size, hence the speed; 16 keeps |error| <= 2^-17 per feature. None: 16 for
        the paper protocol, 10 for the shared one (rarer truncation failures on Z_2^64).
    mask_bits: statistical security sigma of the gradient masks.
    precompute: when obfuscators (the data-independent half of every encryption) are made:
        ``"batch"`` (a pool filled before each iteration) or ``"epoch"`` (before each epoch; raise the
        federation timeout for big epochs: the other processes wait meanwhile), both timed as offline;
        ``"background"`` (a separate process keeps a pool full, on a spare core); ``"none"`` (inline,
        counted as online time).
    crypto_processes: paper protocol: processes per party for obfuscators, [[d]]^T X and decryption
        (None: the machine's cores; 1: none, everything in the party's own process).
    obfuscation: ``"djn"`` (fixed-base h_s^a, fast; Damgard-Jurik-Nielsen's assumption) or ``"full"``
        (r^n as python-paillier; slower, the textbook assumption only).
    packed_features: paper protocol, one host (SGD or SQN): each data party encrypts its columns once, several
        features per plaintext, and every batch costs a few ciphertexts instead of 2 |S| encryptions and
        d_B + d_A bucket products (``packed.py``; same gradients to 2^-25 max|x|, same leakage).
    random_state: the public seed of mini-batches and Hessian samples.
    mask_seed: SIMULATION ONLY: a seed for this party's masks (None, the default: the operating system's
        randomness). A seeded run warns and its record says it carries no privacy guarantee.

    scikit-learn: a binary classifier. X: numpy, pandas or torch (numpy in, numpy out; torch in, torch
    out); y: any two labels (``classes_``, the second the positive class), mapped to -1 / +1 inside;
    ``predict`` returns them, ``predict_proba`` gives [P(classes_[0]), P(classes_[1])] (n x 2, numpy).
    """

    def __sklearn_tags__(self):
        return binary_classifier_tags(super().__sklearn_tags__())

    def _expected_failed_checks(self) -> dict:
        """scikit-learn checks that cannot pass at the defaults, with the reason (scikit-learn >= 1.6 takes
        expected failures as an argument of its check functions, not as a tag; tests/test_sklearn_citizens.py
        reads this). None since ``standardize=True`` became the default: the checks' unscaled columns
        (~N(100, 1)) made the Taylor-loss SGD/SQN diverge before."""
        return {}

    def __init__(self, fed: Federation | None = None, *, protocol: str = "shared", optimizer: str = "sqn",
                 batch_size: int | None = None,
                 lr: float | None = None, decay: float | None = None, decay_sqrt: bool = False, L: int = 4,
                 M: int = 10, hessian_batch: int | None = None, l2: float = 1e-3, fit_intercept: bool = True,
                 standardize: bool = True, max_epochs: int = 100, tol: float = 1e-5, encryption: bool = True,
                 key_bits: int = 2048,
                 insecure_key: bool = False, feature_frac_bits: int | None = None, mask_bits: int = 64,
                 precompute: str = "batch", obfuscation: str = "djn", crypto_processes: int | None = None,
                 packed_features: bool = False, random_state: int = 0, mask_seed: int | None = None, device=None):
        self.fed = fed
        self.protocol = protocol
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.lr = lr
        self.decay = decay
        self.decay_sqrt = decay_sqrt
        self.L = L
        self.M = M
        self.hessian_batch = hessian_batch
        self.l2 = l2
        self.fit_intercept = fit_intercept
        self.standardize = standardize
        self.max_epochs = max_epochs
        self.tol = tol
        self.encryption = encryption
        self.key_bits = key_bits
        self.insecure_key = insecure_key
        self.feature_frac_bits = feature_frac_bits
        self.mask_bits = mask_bits
        self.precompute = precompute
        self.obfuscation = obfuscation
        self.crypto_processes = crypto_processes
        self.packed_features = packed_features
        self.random_state = random_state
        self.mask_seed = mask_seed
        self.device = device

    # ------------------------------------------------------------ validation
    def _lr(self) -> float:
        return float(self.lr) if self.lr is not None else DEFAULT_LR.get(self.optimizer, 0.15)

    def _decay(self) -> float:
        return float(self.decay) if self.decay is not None else DEFAULT_DECAY.get(self.optimizer, 0.0)

    def _fx(self) -> int:
        if self.feature_frac_bits is not None:
            return int(self.feature_frac_bits)
        return SHARED_FEATURE_BITS if self.protocol == "shared" else 16

    def _processes(self) -> int:
        return int(self.crypto_processes) if self.crypto_processes is not None else (os.cpu_count() or 1)

    def _batch(self, n: int) -> int:
        return min(DEFAULT_BATCH, n) if self.batch_size is None else int(self.batch_size)

    def _check_params(self) -> None:
        def integer(name, low):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise VFLInputError(f"{name} must be an integer >= {low}, got {v!r}")

        if not isinstance(self.standardize, (bool, np.bool_)):
            raise VFLInputError(f"standardize must be True or False, got {self.standardize!r}")
        if self.protocol not in PROTOCOLS:
            raise VFLInputError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.optimizer not in OPTIMIZERS:
            raise VFLInputError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.batch_size is not None:
            integer("batch_size", 1)
        integer("L", 1)
        integer("M", 1)
        integer("max_epochs", 1)
        integer("mask_bits", 16)
        if self.hessian_batch is not None:
            integer("hessian_batch", 1)
        if self.feature_frac_bits is not None and not (
                isinstance(self.feature_frac_bits, (int, np.integer)) and 0 <= self.feature_frac_bits <= 32):
            raise VFLInputError(f"feature_frac_bits must be an integer in [0, 32], got {self.feature_frac_bits!r}")
        lr = self._lr()
        if not (math.isfinite(lr) and lr > 0):
            raise VFLInputError(f"the learning rate must be a positive number, got lr={self.lr!r}")
        decay = self._decay()
        if not (math.isfinite(decay) and decay >= 0):
            raise VFLInputError(f"decay must be a non-negative number, got {self.decay!r}")
        if not (isinstance(self.l2, (int, float)) and math.isfinite(self.l2) and self.l2 >= 0):
            raise VFLInputError(f"l2 must be a non-negative number, got {self.l2!r}")
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise VFLInputError(f"tol must be a non-negative number, got {self.tol!r}")
        if self.crypto_processes is not None:
            integer("crypto_processes", 1)
        if self.obfuscation not in ("djn", "full"):
            raise VFLInputError(f"obfuscation must be 'djn' or 'full', got {self.obfuscation!r}")
        if self.packed_features:
            problem = check_packed(self.protocol, bool(self.encryption), None)
            if problem:
                raise VFLInputError(problem)
        if self.precompute not in PRECOMPUTE:
            raise VFLInputError(f"precompute must be one of {PRECOMPUTE}, got {self.precompute!r}")
        if self.encryption:
            integer("key_bits", 128)
            if self.key_bits % 2:
                raise VFLInputError(f"key_bits must be even (two primes of key_bits/2 bits), got {self.key_bits}")
            if self.key_bits < MIN_KEY_BITS and not self.insecure_key:
                raise VFLInputError(
                    f"a {self.key_bits}-bit Paillier key is too small: keys under {MIN_KEY_BITS} bits can be "
                    f"factored. Use key_bits=2048 (the default); for tests only, pass insecure_key=True "
                    f"(--insecure-key).")

    def _check_data(self, fed, X, y) -> None:
        if getattr(self, "_label_problem", None):
            raise VFLInputError(self._label_problem)
        if fed.world_size > 1 and self.protocol == "shared":
            if fed.num_parties != 2:
                raise VFLInputError(f"the shared protocol runs between one guest and one host (2 data parties), "
                                    f"got {fed.num_parties}; use 2 parties, or protocol='paper' (--protocol paper) "
                                    f"for several hosts")
            if not self.encryption:
                raise VFLInputError("the INSECURE plaintext mode runs the paper protocol without encryption: "
                                    "add protocol='paper' (--protocol paper)")
        if fed.world_size > 1 and self.packed_features and fed.num_parties != 2:
            raise VFLInputError(check_packed(self.protocol, bool(self.encryption), fed.num_parties))
        if fed.world_size > 1 and fed.coordinator is None:
            raise VFLInputError("hetero-LR needs a coordinator that holds the Paillier key: start the federation "
                                "with coordinator=True (launch(..., coordinator=True); `vfl hetero-lr` adds it)")
        if fed.is_coordinator:
            if X is not None or y is not None:
                raise VFLInputError("the coordinator holds no data: call fit(None) there")
            return
        if X is None:
            raise VFLInputError(f"{fed.name()} must pass its columns of the training rows to fit")
        if X.ndim != 2 or X.shape[1] < 1:
            raise VFLInputError(f"{fed.name()}: X must be a 2-D tensor with at least one column, got shape "
                                f"{tuple(X.shape)}")
        if not bool(torch.isfinite(X).all()):
            raise VFLInputError(f"{fed.name()}: X has NaN or infinite values; impute them (--impute median)")
        peak = float(X.abs().max())
        if peak > FEATURE_MAX:
            raise VFLInputError(f"{fed.name()}: a feature reaches |x| = {peak:.4g}, beyond {FEATURE_MAX:g}, the "
                                f"public range of the fixed-point encoding. Scale the columns (--scale standard; in "
                                f"Python standardize=True).")
        if fed.is_active:
            if y is None:
                raise VFLInputError("the guest (active party) must pass the labels y in {-1, +1} to fit")
            if y.ndim != 1 or y.shape[0] != X.shape[0]:
                raise VFLInputError(f"y must be one label per row: {X.shape[0]} rows but y has shape "
                                    f"{tuple(y.shape)}")
            values = set(torch.unique(y.detach().cpu().to(torch.float64)).tolist())
            if not values <= {-1.0, 1.0}:
                shown = sorted(values)[:6]
                raise VFLInputError(f"labels must be -1 and +1, got {shown}{'...' if len(values) > 6 else ''}. Map "
                                    f"the negative class to -1 and the positive class to +1.")
        elif y is not None:
            raise VFLInputError(f"{fed.name()} is a host: only the guest (the active party) holds labels; pass "
                                f"y=None")

    # ------------------------------------------------------------------ setup
    def _federation(self) -> Federation:
        return self.fed if self.fed is not None else Federation.local(self.device or "cpu")

    def _design(self, fed, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This party's training matrix (quantised to F_X bits, the guest's with the intercept) and penalty mask."""
        device = self.device or X.device
        Xq = quantize(X.detach().to(device, torch.float64), self._fx())
        penalized = torch.ones(Xq.shape[1], dtype=torch.float64, device=device)
        if self.fit_intercept and fed.is_active:
            Xq = torch.cat([Xq, torch.ones(Xq.shape[0], 1, dtype=torch.float64, device=device)], dim=1)
            penalized = torch.cat([penalized, torch.zeros(1, dtype=torch.float64, device=device)])
        return Xq, penalized

    def _agree(self, fed, X, y, monitor) -> dict:
        """Validate locally, then agree on the hyperparameters, the rows and the columns (one exchange)."""
        error = None
        try:
            self._check_params()
            self._check_data(fed, X, y)
        except VFLInputError as exc:
            error = str(exc)
        if fed.world_size == 1:
            if error:
                raise VFLInputError(error)
            n = X.shape[0]
            if batch_too_large(self.batch_size, n):
                raise VFLInputError(batch_too_large(self.batch_size, n))
            return {"n": n, "features": [X.shape[1] + int(self.fit_intercept)]}
        config = {k: getattr(self, k) for k in _AGREED}
        info = {"config": config, "error": error, "rows": None if X is None else int(X.shape[0]),
                "columns": None if X is None else int(X.shape[1]) + int(self.fit_intercept and fed.is_active),
                "monitor": monitor is not None}
        with fed.phase(PHASE_SETUP):
            infos = fed.gather_json(info, fed.active)
            verdict = None
            if fed.is_active:
                verdict = _verdict(fed, infos, self)
            verdict = fed.broadcast_json(verdict, fed.active)
        if verdict["error"]:
            raise VFLInputError(verdict["error"])
        return verdict

    def _session(self, fed, agreed: dict) -> Session:
        n = agreed["n"]
        batch = min(self._batch(n), n)
        hessian_batch = min(self.hessian_batch or batch, n)
        bounds = PublicBounds(parties=fed.num_parties, batch=batch, hessian_batch=hessian_batch, l2=float(self.l2),
                              feature_frac_bits=self._fx(), mask_bits=int(self.mask_bits))
        scheme = PlaintextScheme()
        shared = fed.world_size > 1 and self.protocol == "shared"
        if fed.world_size > 1 and fed.is_active:
            if not shared:
                log.warning(PAPER_WARNING)
            if self.mask_seed is not None:
                log.warning(SIMULATION_WARNING)
        if shared:
            pass
        elif fed.world_size > 1 and self.encryption:
            with fed.phase(PHASE_SETUP):
                if fed.is_coordinator:
                    public_key, private_key = generate_keypair(int(self.key_bits), insecure=bool(self.insecure_key))
                    PaillierScheme.share_key(fed, public_key, fed.parties)
                    scheme = PaillierScheme(public_key, private_key, method=self.obfuscation,
                                            processes=self._processes())
                else:
                    scheme = PaillierScheme.receive_key(fed, fed.coordinator, insecure=bool(self.insecure_key),
                                                        background=self.precompute == "background",
                                                        method=self.obfuscation, processes=self._processes())
            if bounds.total_bits() + 4 > int(scheme.public_key.n).bit_length() - 2:
                raise VFLInputError(f"a {self.key_bits}-bit key leaves no room for the protocol's fixed-point "
                                    f"values ({bounds.total_bits()} bits): use a larger key")
        elif fed.world_size > 1 and fed.is_active:
            log.warning(INSECURE_WARNING)
        seed = self.mask_seed
        return Session(fed=fed, scheme=scheme, bounds=bounds,
                       batches=BatchPlan(n, batch, hessian_batch, int(self.random_state)),
                       plan=IterationPlan(self.optimizer, int(self.L)),
                       step=StepSize(self._lr(), self._decay(), bool(self.decay_sqrt)),
                       masks=MaskSource(seed, fed.rank), l2=float(self.l2),
                       feature_frac_bits=self._fx(), n_features=list(agreed["features"]))

    def _role(self, session: Session, fed, X, y):
        memory, tracker = CurvatureMemory(int(self.M)), LossTracker(float(self.tol), int(self.max_epochs))
        if fed.world_size == 1:
            Xq, penalized = self._design(fed, X)
            return LocalLearner(session, Xq, y.to(torch.float64), penalized, memory, tracker)
        if self.protocol == "shared":
            Xq = None if fed.is_coordinator else self._design(fed, X)[0]
            return SharedRole(session, Xq, y if fed.is_active else None, fit_intercept=bool(self.fit_intercept),
                              memory=int(self.M), tracker=tracker)
        packed = bool(self.packed_features)
        if fed.is_coordinator:
            return (PackedCoordinator if packed else Coordinator)(session, memory, tracker)
        Xq, penalized = self._design(fed, X)
        if fed.is_active:
            return (PackedGuest if packed else Guest)(session, Xq, y, penalized)
        return (PackedHost if packed else Host)(session, Xq, penalized)

    def _start(self, X, y, monitor=None):
        fed = self._federation()
        started = time.perf_counter()
        agreed = self._agree(fed, X, y, monitor)
        session = self._session(fed, agreed)
        role = self._role(session, fed, X, y)
        if hasattr(role, "exchange_columns"):
            role.exchange_columns()          # packed_features: the one-off encryption of the columns
        self.setup_seconds_ = time.perf_counter() - started
        self.encryption_ = ("none (centralised: one party)" if fed.world_size == 1 else
                            SHARED_LABEL if self.protocol == "shared" else
                            session.scheme.label + (", packed features" if self.packed_features else ""))
        self.privacy_ = ("void: SIMULATION mode (seeded masks)" if self.mask_seed is not None else
                         "none: centralised" if fed.world_size == 1 else
                         "shared model: no per-step gradient at any party" if self.protocol == "shared" else
                         "paper protocol: the host learns its gradients (labels leak); the coordinator sees SQN "
                         "gradients and curvature pairs")
        self._mask_stream = (MaskStream(self.mask_seed, fed.rank) if self.mask_seed is not None
                             else MaskStream.private(fed.rank))
        return fed, session, role

    # -------------------------------------------------------------------- fit
    def fit(self, X=None, y=None, *, monitor=None, log=None, progress: bool = False, checkpoint=None):
        """Train on this party's columns X (guest: and labels y); ``X=None`` at the coordinator.

        ``monitor=(X_test, y_test)`` (``y_test`` only at the guest; every data
        party must pass its columns) scores those rows after every epoch
        through a secure sum and records the test AUC in ``history_``.
        ``log`` is a ``vfltorch.runlog.RunLog`` (TensorBoard curves at the guest).
        ``checkpoint`` (a folder, each party its own; ``vfltorch.checkpoint``): save this role's state after
        every epoch but the last, and go on after the newest epoch every party saved when the same fit is
        started again (``resume.py`` says what is kept); the checkpoints are deleted when training ends.
        """
        X, y, monitor = self._fit_inputs(X, y, monitor)
        X, monitor = self._standardize(X, monitor)
        fed, session, role = self._start(X, y, monitor)
        if monitor is not None and fed.is_active and fed.world_size > 1:
            logging.getLogger("vfltorch.linear").warning(MONITOR_WARNING)
        self._session_ = session
        self._role_ = role
        self.history_, self.comm_ = [], []
        k, rounds, online, offline = 0, 0, 0.0, 0.0
        last_bytes = _train_bytes(fed)
        bar = log.progress(total=int(self.max_epochs), desc=f"hetero-lr {self.optimizer}", unit="epoch") \
            if (log is not None and progress) else None
        decision = {"loss": float("nan"), "stop": True, "converged": False}
        checkpoints, first = None, 0
        if checkpoint is not None:
            checkpoints = self._checkpoints(fed, checkpoint, X, y)
            resumed = checkpoints.resume()
            if resumed is not None:
                state, arrays = resumed
                restore(role, state["role"], arrays)
                first, k, rounds = int(state["epoch"]), int(state["k"]), int(state["rounds"])
                online, offline = float(state["online"]), float(state["offline"])
                self.history_ = list(state["history"]) if fed.is_active else []
                if bar is not None:
                    bar.update(first)
        self.resumed_from_epoch_ = first
        epoch = first - 1
        fit_started = time.perf_counter()
        try:
            for epoch in range(first, int(self.max_epochs)):
                eta = session.step(epoch)
                batches = session.batches.epoch(epoch)
                if self.precompute == "epoch":
                    offline += role.prepare(batches, k)
                started, offline_in_epoch = time.perf_counter(), 0.0
                for rows in batches:
                    if self.precompute == "batch":
                        offline_in_epoch += role.prepare([rows], k)
                    k += 1
                    rounds += 1
                    role.iteration(rows, k, eta, session.plan.quasi_newton(k))
                    if session.plan.window_closes(k):
                        role.close_window(k)
                        rounds += int(session.plan.pair_due(k))
                decision = role.end_epoch()
                online += time.perf_counter() - started - offline_in_epoch
                offline += offline_in_epoch
                auc = self._monitor_auc(fed, monitor)
                record = self._epoch_record(fed, session, epoch, eta, k, rounds, online, offline, decision, auc,
                                            last_bytes)
                last_bytes = _train_bytes(fed)
                if record is not None:
                    self.history_.append(record)
                    self._log_epoch(log, record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{decision.get('loss', float('nan')):.6f}")
                if decision["stop"]:
                    break
                if checkpoints is not None and epoch + 1 < int(self.max_epochs):
                    role_state, arrays = snapshot(role)
                    checkpoints.save(epoch + 1, {"epoch": epoch + 1, "k": k, "rounds": rounds, "online": online,
                                                 "offline": offline, "history": self.history_ if fed.is_active
                                                 else [], "role": role_state}, arrays)
            if hasattr(role, "finish"):
                role.finish()
            self._to_raw_scale(fed, role)
            self.wall_seconds_ = time.perf_counter() - fit_started
            self._finish(fed, session, role, k, epoch + 1, decision, online, offline)
            if checkpoints is not None:
                checkpoints.finish()
        finally:
            if bar is not None:
                bar.close()
            session.scheme.close()
        return self

    def _standardize(self, X, monitor):
        """``standardize=True``: this party's columns (and its monitored rows) standardised on its own training
        columns (``standardize.py``); the scaling is kept to map the fitted block back."""
        self._scaling = None
        # (a value other than True / False is refused with the other hyperparameters, in _agree)
        if not (isinstance(self.standardize, (bool, np.bool_)) and self.standardize) or X is None or not len(X):
            return X, monitor
        self._scaling = OwnColumnScaling.fit(X, center=bool(self.fit_intercept))
        if monitor is not None:
            monitor = (self._scaling.apply(monitor[0]), monitor[1])
        return self._scaling.apply(X), monitor

    def _to_raw_scale(self, fed, role) -> None:
        """Replace this data party's trained block by its raw-column block (``standardize.py``); collective."""
        if getattr(self, "_scaling", None) is None:          # not standardised, or the coordinator
            return
        has_intercept = bool(self.fit_intercept and (fed.is_active or fed.world_size == 1))
        with fed.phase(PHASE_SCALE):
            role.w = to_raw_scale(fed, self._scaling, role.w, has_intercept=has_intercept,
                                  fit_intercept=bool(self.fit_intercept), stream=self._mask_stream)

    def _checkpoints(self, fed, root, X, y):
        """This party's ``Checkpoints``: the run's hyperparameters, its rank and a digest of its own data."""
        from ..checkpoint import Checkpoints, array_digest

        params = {k: v for k, v in self.get_params().items()
                  if isinstance(v, (bool, int, float, str, type(None))) and k not in ("precompute", "crypto_processes", "obfuscation", "device")}
        data = array_digest(None if X is None else to_numpy(X), None if y is None else to_numpy(y))
        return Checkpoints(fed, root, method="hetero-lr",
                           fingerprint={"params": params, "rank": fed.rank, "world": fed.world_size, "data": data})

    def _fit_inputs(self, X, y, monitor):
        """The edge: this party's columns as a float64 tensor, the guest's labels as -1 / +1 (``classes_``).

        In a federation a bad label set is reported through the agreement (every process raises the same
        error) instead of here, where the other processes would wait for this one until the timeout.
        """
        fed = self._federation()
        federated = fed.world_size > 1
        self._label_problem = None
        if X is not None:
            X, _ = features(self, X, reset=True, federated=federated)
            X = torch.as_tensor(X)
            if not X.is_floating_point():
                X = X.to(torch.float64)
        if not federated and X is not None:
            require_y(self, y)
        if y is not None and (fed.is_active or not federated):
            try:
                y = torch.as_tensor(BinaryLabels.fit(self, y, None if X is None else X.shape[0]),
                                    device=X.device if X is not None else None)
            except VFLInputError as exc:
                if not federated:
                    raise
                self._label_problem = f"{fed.name()}: {exc}"
        if monitor is not None and X is not None:
            X_mon, y_mon = monitor
            X_mon, _ = features(self, X_mon, reset=False, federated=federated)
            X_mon = torch.as_tensor(X_mon).to(X.device, torch.float64)
            if y_mon is not None and hasattr(self, "classes_"):
                y_mon = torch.as_tensor(BinaryLabels.encode(self, y_mon))
            monitor = (X_mon, y_mon)
        return X, y, monitor

    def _monitor_auc(self, fed, monitor):
        if monitor is None or fed.is_coordinator:
            return None
        X_test, y_test = monitor
        with fed.phase(PHASE_MONITOR):
            scores = self._scores(fed, X_test)
        if scores is None or y_test is None or len(torch.unique(torch.as_tensor(y_test))) < 2:
            return None
        from sklearn.metrics import roc_auc_score

        return float(roc_auc_score(to_numpy(y_test), to_numpy(scores)))

    def _epoch_record(self, fed, session, epoch, eta, k, rounds, online, offline, decision, auc, last_bytes):
        """Gather this epoch's bytes and offline time of every process at the guest."""
        now = _train_bytes(fed)
        mine = {"bytes": now - last_bytes, "offline_seconds": offline, "online_seconds": online}
        if fed.world_size == 1:
            per_rank = [mine]
        else:
            with fed.phase(PHASE_REPORT):
                per_rank = fed.gather_json(mine, fed.active)
        if not fed.is_active:
            return None
        return {"epoch": epoch + 1, "loss": decision.get("loss"), "eta": eta, "iterations": k, "rounds": rounds,
                "test_auc": auc, "online_seconds": online, "offline_seconds": offline,
                "bytes_per_party": {str(r): e["bytes"] for r, e in enumerate(per_rank)},
                "offline_seconds_per_party": {str(r): e["offline_seconds"] for r, e in enumerate(per_rank)},
                "bytes_total": sum(e["bytes"] for e in per_rank)}

    @staticmethod
    def _log_epoch(log, record) -> None:
        if log is None:
            return
        e = record["epoch"]
        log.scalar("hetero_lr/train_loss", record["loss"], e)
        if record["test_auc"] is not None:
            log.scalar("hetero_lr/test_auc", record["test_auc"], e)
        log.scalar("hetero_lr/train_loss_vs_rounds", record["loss"], record["rounds"])
        log.scalar("hetero_lr/train_loss_vs_online_ms", record["loss"], int(1000 * record["online_seconds"]))
        log.scalar("hetero_lr/bytes_per_epoch", record["bytes_total"], e)

    def _finish(self, fed, session, role, k, epochs, decision, online, offline) -> None:
        self.n_iter_ = k
        self.n_epochs_ = epochs
        self.converged_ = bool(decision.get("converged", False))
        self.train_loss_ = decision.get("loss")
        self.train_seconds_ = online
        self.offline_seconds_ = offline
        self.n_curvature_pairs_ = getattr(getattr(role, "memory", None), "accepted", None)   # the key holder
        self._publish(getattr(role, "w", None), fed.is_active or fed.world_size == 1)   # (None at the coordinator)
        mine = {"rank": fed.rank, "role": role.role, "seconds": session.clock.as_dict(),
                "obfuscators": {k2: v for k2, v in session.scheme.offline_stats().items()}}
        if hasattr(role, "memory"):
            mine["curvature_pairs"] = {"accepted": role.memory.accepted, "rejected": role.memory.rejected}
        if fed.world_size > 1:
            with fed.phase(PHASE_REPORT):
                timings = fed.gather_json(mine, fed.active)
        else:
            timings = [mine]
        if fed.is_active:
            self.timings_ = timings
            self.comm_ = [rec["bytes_per_party"] for rec in self.history_]
            pairs = [t["curvature_pairs"] for t in timings if "curvature_pairs" in t]
            self.n_curvature_pairs_ = pairs[0]["accepted"] if pairs else None

    # -------------------------------------------------------------- predict
    def _scores(self, fed, X) -> torch.Tensor | None:
        if fed.is_coordinator:
            return None
        role = getattr(self, "_role_", None)
        if role is None or getattr(role, "w", None) is None:
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                                 f"appropriate arguments before using this estimator.")
        w = role.w
        Xd = X.detach().to(w.device, torch.float64)
        if self.fit_intercept and fed.is_active:
            u = Xd @ w[:-1] + w[-1]
        else:
            u = Xd @ w
        if fed.world_size == 1:
            return u
        return secure_sum(fed, u, out=fed.active, stream=self._mask_stream, parties=fed.parties)

    def decision_function(self, X=None):
        """Scores u = sum_l X_l w_l (+ b) of the rows, at the guest (None at the hosts and the coordinator).

        Collective: every data party calls it with its columns of the same rows.
        """
        fed = self._federation()
        if fed.is_coordinator:
            return None
        if getattr(getattr(self, "_role_", None), "w", None) is None:
            self._scores(fed, X)                               # raises NotFittedError
        if X is None:
            raise VFLInputError(f"{fed.name()} must pass its columns of the rows to score")
        X, as_torch = features(self, X, reset=False, federated=fed.world_size > 1)
        with fed.phase(PHASE_PREDICT):
            u = self._scores(fed, torch.as_tensor(X))
        return None if u is None else output(u, as_torch)

    def predict_proba(self, X=None):
        """[P(classes_[0] | x), P(classes_[1] | x)] = [sigmoid(-u), sigmoid(u)] at the guest (n x 2 numpy)."""
        u = self.decision_function(X)
        return None if u is None else proba_columns(torch.sigmoid(torch.as_tensor(u)))

    def predict(self, X=None):
        """The labels of fit (``classes_``) at the guest: torch float64 for torch input and numeric labels."""
        u = self.decision_function(X)
        if u is None:
            return None
        return BinaryLabels.decode(self, u >= 0, as_torch=isinstance(u, torch.Tensor))

    def score(self, X=None, y=None, sample_weight=None):
        """Accuracy at the guest (None elsewhere), labels as given to fit."""
        pred = self.predict(X)
        if pred is None:
            return None
        from sklearn.metrics import accuracy_score

        y = to_numpy(y)
        pred = to_numpy(pred) if isinstance(pred, torch.Tensor) else pred
        return float(accuracy_score(y, pred, sample_weight=sample_weight))

    # -------------------------------------------------- save / load (vfltorch.model_store)
    _model_method = "hetero-lr"

    def _model_fed(self):
        return self._federation()

    def _shard_state(self):
        """This party's block of w (the guest's: and the intercept). No key is stored: scoring is a masked
        sum of the parties' partial scores, with no encryption."""
        role = getattr(self, "_role_", None)
        fed = self._federation()
        if not fed.is_coordinator and (role is None or getattr(role, "w", None) is None):
            raise VFLInputError("call fit before saving")
        w = None if fed.is_coordinator else role.w
        state = {"n_iter": getattr(self, "n_iter_", None), "n_features_in": None if w is None else
                 int(w.shape[0]) - int(bool(self.fit_intercept and fed.is_active))}
        return state, ({} if w is None else {"w": to_numpy(w, np.float64)})

    def _publish(self, w, holds_intercept: bool) -> None:
        """``coef_`` (this party's block, numpy, as scikit-learn's) and ``intercept_`` (at the party that holds it)
        from this party's trained weights ``w`` (a tensor on the estimator's device; the intercept last where it
        holds it); None at the coordinator. The model keeps computing with ``w`` itself (``_role_``)."""
        if w is None:
            self.coef_, self.intercept_ = None, None
        elif self.fit_intercept and holds_intercept:
            self.coef_, self.intercept_ = to_numpy(w[:-1], np.float64).copy(), float(w[-1])
        else:
            self.coef_, self.intercept_ = to_numpy(w, np.float64).copy(), None

    def _restore_shard(self, manifest, arrays, fed):
        self.fed = fed if fed.world_size > 1 else None
        w = arrays.get("w")
        w = None if w is None else torch.as_tensor(w, dtype=torch.float64, device=self.device or fed.device)
        self._role_ = _FittedWeights(w)
        self.n_iter_ = manifest["state"].get("n_iter")
        self._publish(w, fed.is_active)
        self._mask_stream = (MaskStream(self.mask_seed, fed.rank) if self.mask_seed is not None
                             else MaskStream.private(fed.rank))

    def __getstate__(self):
        # Pickle what scoring needs, not the training session (keys, pools) or the role (it holds the data).
        state = dict(self.__dict__)
        state.pop("_session_", None)
        state.pop("_mask_stream", None)          # a private stream's state is never written out
        role = state.get("_role_")
        if role is not None and not isinstance(role, _FittedWeights):
            state["_role_"] = _FittedWeights(getattr(role, "w", None))
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "_role_" in state:
            rank = self.fed.rank if self.fed is not None else 0
            self._mask_stream = (MaskStream(self.mask_seed, rank) if self.mask_seed is not None
                                 else MaskStream.private(rank))

    # ----------------------------------------------------------- gradient
    def loss_and_gradient(self, X=None, y=None, *, coef=None, rows=None):
        """One gradient round of the protocol at a given model, without updating it.

        ``coef`` is this party's block of w (the guest's with the intercept
        last; None: zeros), ``rows`` the mini-batch (None: every row). Returns
        this party's gradient block (1/|S|) X_l^T d + lambda w_l at a data
        party, and the batch's Taylor loss at the coordinator (in a
        centralised twin: (loss, gradient)). The coordinator sees the blocks
        masked, exactly as in an SGD step. X is taken as given (no
        ``standardize``): the round is the protocol's at a model of these columns.
        """
        if self.protocol == "shared" and self._federation().world_size > 1:
            raise VFLInputError("loss_and_gradient hands each party its gradient block: it exists for the paper "
                                "protocol only (protocol='paper')")
        fed, session, role = self._start(X, y)
        try:
            if coef is not None and hasattr(role, "w"):
                role.w = torch.as_tensor(coef, dtype=torch.float64).to(role.w.device).clone()
            n = session.batches.n
            rows = np.arange(n) if rows is None else np.asarray(rows)
            # The public bounds cover the rows of this round (every process knows how many).
            session.bounds = dataclasses.replace(session.bounds, batch=max(session.bounds.batch, len(rows)))
            role.iteration(rows, 1, 0.0, quasi_newton=False)
            if isinstance(role, Coordinator):
                return role.tracker._sum / len(rows)
            if isinstance(role, LocalLearner):
                return role.tracker._sum / len(rows), role.last_gradient
            return role.last_gradient
        finally:
            session.scheme.close()


class _FittedWeights:
    """What scoring needs of a fitted party's role: its block w (the guest's with the intercept last)."""

    role = "fitted"

    def __init__(self, w: torch.Tensor | None):
        self.w = w


def _verdict(fed, infos: list, est) -> dict:
    """At the guest: the first problem any process reported, else the agreed row count and column counts."""
    names = [fed.name(r) for r in range(fed.world_size)]
    for name, info in zip(names, infos):
        if info["error"]:
            error = info["error"]
            return {"error": error if error.startswith(name) else f"{name}: {error}"}
    mine = infos[fed.active]["config"]
    for name, info in zip(names, infos):
        diff = sorted(k for k in mine if info["config"].get(k) != mine[k])
        if diff:
            return {"error": f"{name} was started with different hyperparameters ({', '.join(diff)}): every "
                             f"process must use the same settings"}
    rows = {r: infos[r]["rows"] for r in fed.parties}
    if len(set(rows.values())) != 1:
        listing = ", ".join(f"{fed.name(r)}: {n}" for r, n in rows.items())
        return {"error": f"the data parties hold different numbers of rows ({listing}): align them first"}
    monitors = {infos[r]["monitor"] for r in fed.parties}
    if len(monitors) != 1:
        return {"error": "either every data party passes monitor= (its columns of the monitored rows) or none"}
    if est.protocol == "shared" and True in monitors:
        return {"error": "per-epoch monitoring would hand the guest the host's partial score of every monitored row "
                         "per epoch, which the shared protocol exists to avoid; drop monitor= (--monitor), or use "
                         "protocol='paper' (--protocol paper) on public data"}
    n = rows[fed.active]
    if batch_too_large(est.batch_size, n):
        return {"error": batch_too_large(est.batch_size, n)}
    order = [fed.active] + [r for r in fed.parties if r != fed.active]
    return {"error": None, "n": n, "features": [infos[r]["columns"] for r in order]}


def _train_bytes(fed) -> int:
    return fed.meter.totals(TRAIN_PHASES)["bytes_sent"]


__all__ = ["DEFAULT_DECAY", "DEFAULT_LR", "HeteroLogisticRegression", "INSECURE_WARNING", "OPTIMIZERS"]
