"""Design experiment for issue 35: can an optimiser that is linear in the gradient match FDSKL's Adam?

    python -m benchmarks.fdskl_linear_optimizer                       # breast_cancer pima phishing credit_default a9a
    python -m benchmarks.fdskl_linear_optimizer --seeds 5 breast_cancer pima credit_default

Why: the fix for issue 35 keeps alpha, the gradient sums and the optimiser state in additive shares between the
active party and a passive holder, so that the active party is opened f on its batch rows and nothing per
feature. On shares only steps that are linear in the gradient with public coefficients are cheap; Adam's
per-coefficient division by sqrt(v) is not. This runs the bounded model centralised (one process, the same
model, width selection and compression as the default) with the Adam step replaced, in this process only, by
momentum SGD: m <- mu m + (g / B + lambda alpha), alpha <- alpha - lr m, a constant lr, and the iterates averaged
from the middle of training as Adam's are (mu = 0: plain SGD). It prints the test accuracy of each setting next
to the default's.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch

from vfltorch.comm import Federation
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import FDSKLClassifier, budget

# lr in units of 1 / D (D = 1536 features at the defaults): alpha = -lr sum L' phi makes f move by lr D k(x_i, x)
# per unit of L', so a rate ~ 1 / D keeps the step in function space fixed as D changes (and |f| small: the sealed
# protocol's fixed point holds |f| < 2^10).
D_DEFAULT = 1536
SETTINGS = [("adam", 0.0, 0.0)] + [("momentum", c / D_DEFAULT, 0.9) for c in (8, 16, 32)] + \
    [("momentum", 0.5, 0.9), ("sgd", 16 / D_DEFAULT, 0.0)]
_ADAM_STEP = budget._Optimizer.step


def _linear_step(self, t, cols, sums, B):
    """The step of momentum SGD with constant ``lr`` (``self.linear``: (lr, mu)), averaged from the middle."""
    lr, mu = self.linear
    self.steps += 1
    self.earlier, self.before = self.before, self.earlier
    self.before.copy_(self.alpha)
    grad = self.cfg.lam * self.alpha
    grad[cols] += sums / B
    self.m.mul_(mu).add_(grad)
    self.alpha -= lr * self.m
    if self.average_from is not None and t >= self.average_from:
        self.averaged += 1
        self.mean += (self.alpha - self.mean) / self.averaged


def use(kind: str, lr: float, mu: float) -> None:
    """Every ``_Optimizer`` made from now on in this process steps as ``kind`` ('adam' restores the default)."""
    if kind == "adam":
        budget._Optimizer.step = _ADAM_STEP
        return

    def step(self, t, cols, sums, B):
        self.linear = (lr, mu)
        return _linear_step(self, t, cols, sums, B)
    budget._Optimizer.step = step


def accuracy(data, random_state: int) -> float:
    est = FDSKLClassifier(Federation.local(), random_state=random_state).fit(data.X_train, data.y_train)
    return 100.0 * float((np.asarray(est.predict(data.X_test)) == np.asarray(data.y_test)).mean())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("datasets", nargs="*", default=["breast_cancer", "pima", "phishing", "credit_default", "a9a"])
    p.add_argument("--seeds", type=int, default=1, help="random_state 0 .. seeds - 1 (mean and sd)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    print("| data set | optimiser | lr | mu | test accuracy % (mean, sd over seeds) | fit s |")
    print("|---|---|---|---|---|---|")
    for name in args.datasets:
        data = load_party_data(Federation.local(), DataConfig(dataset=name, scale="minmax", seed=0))
        for kind, lr, mu in SETTINGS:
            use(kind, lr, mu)
            started = time.perf_counter()
            accs = [accuracy(data, s) for s in range(args.seeds)]
            seconds = (time.perf_counter() - started) / args.seeds
            lr_text = "-" if kind == "adam" else f"{lr * D_DEFAULT:g} / D"
            mu_text = "-" if kind == "adam" else f"{mu:g}"
            print(f"| {name} | {kind} | {lr_text} | {mu_text} | {np.mean(accs):.2f} ({np.std(accs):.2f}) | "
                  f"{seconds:.1f} |", flush=True)
        use("adam", 0.0, 0.0)


if __name__ == "__main__":
    main()
