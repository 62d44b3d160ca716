"""FDSKL classification's defaults that follow the number of training rows n: regularisation and passes (issue 40).

Why. Until issue 40 every set trained 4 epochs with lambda = 1e-5, which leaves only the few passes to regularise
the model. On thousands of rows that is enough; on hundreds it is not: over 20 random splits of the five small
registry sets (147-583 training rows) the defaults were 1.1 to 4.7 points behind the better of two RBF SVCs, while
a logistic regression fitted to convergence on the same 1,536 random features (scikit-learn, C = 1) matched the
SVC. The model class was fine; the fit was neither regularised nor converged (4 epochs of 156 rows at a batch
of 32 are 20 steps).

What. ``lam='auto'`` and ``epochs='auto'`` (``FDSKLClassifier``'s defaults):

* lambda = D / (C n) with C = ``SMALL_C`` below ``SMALL_ROWS`` rows, else 1e-5 (``LARGE_LAM``, as before). With the
  features phi_j = sqrt(2) cos(w_j x + b_j), the objective mean L + (lambda / 2) ||alpha||^2 is an SVM-style one with
  penalty 1 / C on the normalised features' coefficients (sqrt(D) alpha): the usual scaling, so one C serves every n
  and D. C = 30 (with 16 epochs) against the old defaults, over 10 random splits of the five small sets and 3 of
  five larger sets cut to 1,000 and 4,000 training rows: +1.0 to +3.9 points on the small sets, +0.2 to +0.9 at
  1,000 rows, -0.02 to +0.94 at 4,000 (docs/design/2026-11-29-fdskl-small-data.md has the tables); C = 10 and
  C = 100 each lost up to 0.7 point on some of them.
* 16 epochs (``SMALL_EPOCHS``), so that the regularised objective is reached: 4 epochs of 156 rows are 20 steps
  (at C = 30, 16 epochs gave 0.4 to 3.1 points over 4 on the small sets; at 4,000 rows 4 epochs lost up to 0.3
  point to the old default on three of five sets, 16 did not).

From ``SMALL_ROWS`` rows on the width selection runs (selection.py) and the defaults are as before. The regressor
keeps lambda = 1e-5 and 4 epochs: this was not measured on regression.

Both are public functions of n and D, the same at every party (no label-dependent decision, nothing to learn):
the dealer, which knows n from the plan, computes them alike. The sealed protocol applies the weight decay in its
shares (sealed.py, step 6).
"""

from __future__ import annotations

# From SMALL_ROWS rows on the width selection decides on held-out rows (one threshold for both)
from .selection import SELECT_MIN_ROWS as SMALL_ROWS

AUTO = "auto"
SMALL_C = 30.0
LARGE_LAM = 1e-5                # the default before issue 40, kept from SMALL_ROWS rows on
MAX_LAM = 1.0                   # (reached below D / 30 rows: 52 at D = 1536) so that gamma lambda stays far below 1
SMALL_EPOCHS = 16.0
LARGE_EPOCHS = 4.0              # the default before issue 40, kept from SMALL_ROWS rows on


def auto_lam(n: int, D: int) -> float:
    """lambda for n training rows and D random features (module docstring), at most ``MAX_LAM``."""
    n = max(1, int(n))
    return min(MAX_LAM, float(D) / (SMALL_C * n)) if n < SMALL_ROWS else LARGE_LAM


def auto_epochs(n: int) -> float:
    """Passes over n training rows (module docstring)."""
    return SMALL_EPOCHS if int(n) < SMALL_ROWS else LARGE_EPOCHS


__all__ = ["AUTO", "SMALL_ROWS", "SMALL_C", "LARGE_LAM", "SMALL_EPOCHS", "LARGE_EPOCHS", "auto_lam", "auto_epochs"]
