"""The DP-SGD baseline (Abadi et al. 2016) through opacus' PrivacyEngine, on DP-SCD's model and data.

The model is the same linear predictor x^T theta (no bias, theta = 0 at the
start) and the objective the same P(theta) = mean loss + (lambda/2)||theta||^2.
Each step draws a Poisson batch (rate q = 1 / number of batches, opacus'
convention), clips every per-example gradient of the loss to norm C, adds
N(0, sigma^2 C^2) to their sum, divides by the expected batch size and takes
an SGD step with learning rate ``lr``. The regulariser's gradient lambda
theta does not depend on the data: it enters as SGD weight decay, after the
noise. Sensitivity: C (add or remove one example), so sigma is calibrated
exactly as for DP-SCD (``accountant.calibrate_sigma``) and the epsilon
reported comes from opacus' accountant history of the run.

Secret randomness: opacus' Poisson batches and its noise come from torch
generators seeded from OS entropy (``randomness.py``; torch generators take
64-bit seeds), never recorded: two runs differ. ``simulation_seed`` seeds them
for a reproducible simulation, and then the guarantee is void
(``guarantee_void_``, a ``SimulationWarning``).

``private=False`` gives plain mini-batch SGD (the paper's SGD baseline).
Centralised only: opacus needs the whole model and every column in one
process, so there is no vertical DP-SGD here.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from ..devices import to_numpy
from sklearn.base import BaseEstimator

from ..data import VFLInputError
from .accountant import PrivacyAccountant, calibrate_sigma, check_budget, check_mechanism
from .estimator import GLMPredictions, clip_batch, unit_rows
from .glm import make_glm
from .randomness import Randomness


class DPSGD(GLMPredictions, BaseEstimator):
    """DP-SGD (opacus) or SGD for ridge, logistic regression and the L2-SVM, scikit-learn style.

    Learned: ``coef_``, ``sigma_``, ``sample_rate_``, ``steps_``, ``epsilon_``
    (spent, None when not private), ``history_`` (epsilon per epoch; the training
    objective too only with ``monitor_objective=True``, which is not private),
    ``guarantee_void_``, ``batch_size_`` (``batch_size`` clipped to the training
    rows with a warning, as scikit-learn's MLP does). ``normalize_rows=True``
    (the default, as ``vfl dpsgd``) divides each row by its L2 norm, in fit and
    predict; per-example gradient clipping at ``C`` bounds the sensitivity
    either way.
    """

    _model_method = "dpsgd"

    def __init__(self, task: str = "logistic", private: bool = True, epsilon: float = 1.0, delta: float = 1e-3,
                 batch_size: int = 100, C: float = 1.0, lr: float = 2.0, lam: float = 1e-4, epochs: int = 10,
                 accountant: str = "prv", sigma: float | None = None, normalize_rows: bool = True,
                 simulation_seed: int | None = None, device: str = "cpu", monitor_every: int = 1,
                 monitor_objective: bool = False):
        self.task = task
        self.private = private
        self.epsilon = epsilon
        self.delta = delta
        self.batch_size = batch_size
        self.C = C
        self.lr = lr
        self.lam = lam
        self.epochs = epochs
        self.accountant = accountant
        self.sigma = sigma
        self.normalize_rows = normalize_rows
        self.simulation_seed = simulation_seed
        self.device = device
        self.monitor_every = monitor_every
        self.monitor_objective = monitor_objective

    def _is_random(self) -> bool:
        return self.private and self.simulation_seed is None

    def _validate(self, n: int, batch_size=None) -> None:
        if self.private:
            if self.sigma is None:
                check_budget(self.epsilon, self.delta)
            check_mechanism(self.accountant)
            if not (np.isfinite(self.C) and self.C > 0):
                raise VFLInputError(f"the clipping bound C must be a positive number, got {self.C!r}")
        batch_size = self.batch_size if batch_size is None else batch_size
        if not isinstance(batch_size, int) or not 1 <= batch_size <= n:
            raise VFLInputError(f"the batch size must be an integer in 1..{n} (the training rows), got {batch_size!r}")
        if not (self.lr > 0 and self.lam > 0):
            raise VFLInputError(f"the learning rate and lambda must be positive, got lr={self.lr}, lambda={self.lam}")
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise VFLInputError(f"epochs must be a positive integer for DP-SGD, got {self.epochs!r}")

    def fit(self, X, y):
        with warnings.catch_warnings():
            # opacus: "Secure RNG turned off" (torchcsprng is not required: our generators are seeded from OS
            # entropy, see randomness.py);
            # torch: the full backward hook opacus installs fires although the inputs need no gradient.
            warnings.filterwarnings("ignore", message="Secure RNG turned off")
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            return self._fit(X, y)

    def _fit(self, X, y):
        from torch.utils.data import DataLoader, TensorDataset

        glm = make_glm(self.task)
        X, y = self._fit_inputs(X, y)
        if self._unit_rows():
            X = unit_rows(X)
        n, d = X.shape
        self.batch_size_ = clip_batch(self, "batch_size", self.batch_size, n)
        self._validate(n, self.batch_size_)
        dev = torch.device(self.device)
        Xt = torch.as_tensor(X, dtype=torch.float64)
        yt = torch.as_tensor(y, dtype=torch.float64)
        model = torch.nn.Linear(d, 1, bias=False).to(dtype=torch.float64)
        torch.nn.init.zeros_(model.weight)
        model = model.to(dev)
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr, weight_decay=self.lam)
        randomness = Randomness(self.simulation_seed)
        if self.private:
            randomness.warn()
        self.guarantee_void_ = randomness.simulated and self.private
        loader_gen = randomness.torch("dpsgd/batches")
        loader = DataLoader(TensorDataset(Xt, yt), batch_size=self.batch_size_, shuffle=not self.private,
                            generator=loader_gen)
        engine = None
        if self.private:
            from opacus import PrivacyEngine

            engine = PrivacyEngine(accountant=self.accountant if self.accountant != "gdp" else "rdp")
            model, optimizer, loader = engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                max_grad_norm=float(self.C), poisson_sampling=True,
                noise_generator=randomness.torch("dpsgd/noise", device=dev))
            # Calibrate for what opacus' accountant will record: q = 1 / len(its Poisson loader) and that many
            # steps per epoch. (opacus' loader makes int(1 / q) steps: for 117 batches of the plain loader
            # float rounding gives 116 steps and the accountant q = 1/116, a hair above the true 1/117.)
            self.sample_rate_ = 1.0 / len(loader)
            self.steps_ = self.epochs * len(loader)
            self.sigma_ = float(self.sigma) if self.sigma is not None else calibrate_sigma(
                float(self.epsilon), float(self.delta), self.sample_rate_, self.steps_, self.accountant)
            optimizer.noise_multiplier = self.sigma_
        else:
            self.sample_rate_ = 1.0 / len(loader)
            self.steps_ = self.epochs * len(loader)
            self.sigma_ = 0.0
        self.history_ = []
        self.train_seconds_ = 0.0
        X_dev, y_dev = Xt.to(dev), yt.to(dev)
        for epoch in range(1, self.epochs + 1):
            started = time.perf_counter()
            for xb, yb in loader:
                if len(xb) == 0 and not self.private:
                    continue
                optimizer.zero_grad(set_to_none=True)
                out = model(xb.to(dev)).reshape(-1)
                # An empty Poisson batch still takes its noisy step (skipping it would depend on the data);
                # its mean loss would be 0/0, so take the (empty, zero) sum.
                loss = glm.loss(out, yb.to(dev)).mean() if len(xb) else out.sum()
                loss.backward()
                optimizer.step()
            self.train_seconds_ += time.perf_counter() - started
            if self.monitor_every and (epoch % self.monitor_every == 0 or epoch == self.epochs):
                record = {"epoch": epoch, "step": epoch * len(loader), "epsilon": self._spent(engine)}
                if self.monitor_objective:      # a function of every training row, without noise: not private
                    with torch.no_grad():
                        w = _weight(model)
                        record["objective"] = float(glm.loss(X_dev @ w, y_dev).mean()) + 0.5 * self.lam * float(w @ w)
                self.history_.append(record)
        self.coef_ = to_numpy(_weight(model))
        self.epsilon_ = self._spent(engine)
        self.delta_ = float(self.delta) if self.private else None
        self.n_features_in_ = d
        return self

    def _spent(self, engine) -> float | None:
        """epsilon of the steps opacus recorded, through our accountant wrapper (same orders as the calibration)."""
        if engine is None:
            return None
        acc = PrivacyAccountant(self.accountant)
        for sigma, q, steps in engine.accountant.history:
            acc.step(sigma, q, steps)
        return acc.epsilon(self.delta)


def _weight(model) -> torch.Tensor:
    inner = getattr(model, "_module", model)
    return inner.weight.reshape(-1)
