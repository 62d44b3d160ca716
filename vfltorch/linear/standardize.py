"""Each party standardises its own columns for training; the fitted model is mapped back to its raw columns.

Why: the Taylor-loss SGD / SQN with its default steps diverges on unscaled columns (scikit-learn's
checks draw features around 100), and the fixed-point encoding has a public range. ``vfl hetero-lr``
scales the columns when it loads them (``--scale standard``); ``HeteroLogisticRegression(standardize=True)``,
the default, does the same inside ``fit`` for rows given to it directly.

Every data party q fits the mean m_q and standard deviation s_q of *its own* training columns with
the routine behind ``--scale standard`` (``vfltorch.data.preprocess.ColumnPreprocessing``; a constant
column gets s = 1) and trains on z_q = (x_q - m_q) / s_q. Nothing crosses the wire for that. The
trained model sum_q z_q . w_q + b is, on raw rows,

    sum_q x_q . (w_q / s_q)  +  b - sum_q (w_q / s_q) . m_q,

so party q's raw coefficients are coef_q = w_q / s_q, computed by q alone for its own block, and the
guest's intercept is b - sum_q c_q with the scalar c_q = coef_q . m_q of each party. The c_q are
added by the masked sum that already sums partial scores at prediction (``vfltorch.comm.secure_sum``,
ring masks, result at the guest only): the guest learns the one number sum_q c_q - with a single host,
its c_A, the mean over the training rows of the host's raw partial score x_A . coef_A - and, as in every
such sum, the parties learn the binary exponent of the largest c_q. Nothing per feature and nothing per
row leaves a party; the hosts learn nothing. Scoring then uses the raw-scale blocks, so rows scored
later need no scaler: the scores are those of the trained model.

Without an intercept (``fit_intercept=False``) the columns are only divided by s_q (centring would
add an intercept the model does not have) and nothing is summed.
"""

from __future__ import annotations

import numpy as np
import torch

from ..comm import secure_sum
from ..data.preprocess import ColumnPreprocessing
from ..devices import to_numpy


class OwnColumnScaling:
    """One party's standardisation of its own training columns: z = (x - shift) / div."""

    def __init__(self, shift: torch.Tensor, div: torch.Tensor):
        self.shift = shift
        self.div = div

    @classmethod
    def fit(cls, X: torch.Tensor, *, center: bool) -> "OwnColumnScaling":
        """Mean and standard deviation of each column of ``X`` (the CLI's ``--scale standard``)."""
        pre = ColumnPreprocessing.fit(to_numpy(X, np.float64), "none", "standard", None)
        shift = pre.shift if center else np.zeros_like(pre.shift)
        as_t = lambda a: torch.as_tensor(a, dtype=torch.float64, device=X.device)  # noqa: E731
        return cls(as_t(shift), as_t(pre.div))

    def apply(self, X: torch.Tensor) -> torch.Tensor:
        return (X.to(torch.float64) - self.shift.to(X.device)) / self.div.to(X.device)

    def raw_coef(self, w: torch.Tensor) -> torch.Tensor:
        """The coefficients of the raw columns for coefficients ``w`` of the standardised ones."""
        return w / self.div.to(w.device)

    def offset(self, coef: torch.Tensor) -> torch.Tensor:
        """c = coef . shift: what the raw-scale intercept loses for this party's block (a 1-element tensor)."""
        return (coef * self.shift.to(coef.device)).sum().reshape(1)


def to_raw_scale(fed, scaling: OwnColumnScaling, w: torch.Tensor, *, has_intercept: bool, fit_intercept: bool,
                 stream) -> torch.Tensor:
    """This data party's block of the model on its raw columns (the guest's with the intercept last).

    Collective over the data parties when ``fit_intercept``: one masked sum of one number each (the module
    docstring says who learns what). ``has_intercept``: this block carries the intercept (the guest's).
    """
    coef = scaling.raw_coef(w[:-1] if has_intercept else w)
    if not fit_intercept:
        return coef
    offset = scaling.offset(coef)
    total = offset if fed.world_size == 1 else secure_sum(fed, offset, out=fed.active, stream=stream,
                                                          parties=fed.parties)
    if not has_intercept:
        return coef
    return torch.cat([coef, w[-1:] - total.to(w.device, torch.float64)])


__all__ = ["OwnColumnScaling", "to_raw_scale"]
