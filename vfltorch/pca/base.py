"""What every federated PCA estimator shares: set-up, validation, loadings, scores, explained variance.

Conventions (all estimators):

* A party's data X_i is n x f_i: the same n samples (rows) at every party,
  its own f_i features (columns). Linear PCA centres each column locally
  (``center=True``), which centres the pooled matrix exactly.
* ``components_`` has scikit-learn's meaning for the linear estimators: the
  rows of V^T (k x f_i), each data party holding the slice for its own columns
  (``None`` at a coordinator). The learned directions that the parties share
  live in sample space: ``sample_components_`` is n x k with orthonormal
  columns, an estimate of the leading left singular vectors U of
  the pooled (centred) matrix X = [X_1, ..., X_Q] = U S V^T. Every data
  party (and the server) holds the same block, except in the decentralised
  topologies, where each party holds its own estimate.
* ``loadings_`` is the party's own projection Z_i = X_i^T U (f_i x k), the
  paper's output: for the exact method Z_i = V_i S, the rows of the pooled
  right singular vectors that belong to party i's features, scaled.
* ``explained_variance_`` (s_j^2 / (n - 1) with s_j^2 = u_j^T X X^T u_j) and
  ``explained_variance_ratio_`` are computed through a masked sum
  (``secure_allreduce``) over the parties of ||X_i^T u_j||^2 and ||X_i||_F^2:
  k + 1 numbers per party, of which only the totals are revealed (in the
  decentralised topologies: for the first party's estimate).
* ``Estimator(..., fed=fed).fit(X, parties=None)``: ``X`` is this party's block
  (``None`` at the coordinator), ``fed`` the party's ``Federation``, a
  constructor argument as for every vfltorch estimator (default
  ``Federation.local()``: one party, the centralised algorithm; the old
  ``fit(X, fed)`` still works and warns ``DeprecationWarning``), ``parties``
  the data ranks taking part (default all). ``X`` may be numpy, pandas or
  torch: scores come back as numpy for numpy / pandas input, as torch tensors
  for torch input.
* Fitted arrays are numpy (issue 37: scikit-learn's estimators hold ndarrays): the estimators
  compute with torch tensors on the party's device and keep them under private names, an
  underscore before the public one (``_components_``, ``_mean_``, ...: ``FITTED_ARRAYS``), which
  transform, save / load, the CLI and ``vfl predict`` read. ``fit`` (and ``load``) end by
  publishing them under the public names as float64 numpy arrays on the host
  (``_publish_fitted``, through ``vfltorch.devices.to_numpy``; on the CPU a view of the tensor,
  no copy). ``history_`` is a list of them.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin

from ..comm import Federation, broadcast, pairwise_tree, secure_allreduce
from ..data import VFLInputError
from ..devices import same_device, to_device, to_numpy
from ..model_store import ShardedModelMixin
from ..data.estimator_input import check_fitted, features, output, resolve_fed


def as_tensor(X):
    """numpy arrays (and anything array-like) as float64 tensors; tensors and None pass through."""
    if X is None or isinstance(X, torch.Tensor):
        return X
    try:
        import numpy as np
    except ImportError:                     # pragma: no cover - numpy comes with torch's usual installs
        return X
    if isinstance(X, np.ndarray) or hasattr(X, "__array__"):
        return torch.as_tensor(np.asarray(X, dtype=np.float64))
    return X


# The fitted arrays of the PCA estimators: kept as tensors under "_" + name, published as numpy under name.
FITTED_ARRAYS = ("mean_", "components_", "singular_values_", "explained_variance_", "eigenvalues_",
                 "sample_components_", "eigenvectors_", "loadings_", "local_components_", "local_eigenvalues_",
                 "merge_coefficients_", "X_fit_", "history_", "scores_", "feature_components_")


def _as_numpy(value):
    """A fitted tensor (or a list of them, ``history_``) as numpy on the host; None stays None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_as_numpy(v) for v in value]
    return to_numpy(value)


class FederatedPCABase(ShardedModelMixin, TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """Set-up and the outputs that every federated PCA estimator shares (see the module docstring).

    scikit-learn citizens: ``get_params`` / ``set_params`` / ``clone`` / ``repr`` come from
    ``BaseEstimator`` (every constructor argument is an attribute of the same name), ``fit_transform``
    from here. ``fit(X, y=None, *, parties=None)``: ``y`` is ignored (scikit-learn's convention for
    transformers); the federation is the constructor's ``fed``. ``set_output`` (pandas output) is not
    wired, and ``transform()`` without ``X`` must stay callable (the training samples' scores).
    """

    def __init_subclass__(cls, **kwargs):
        # scikit-learn would wrap transform(X, ...) for set_output and make X mandatory; ours is optional.
        super().__init_subclass__(auto_wrap_output_keys=None, **kwargs)

    method = "pca"          # phase names: pca/<method>
    linear = True           # explained variance / scores of the linear model make sense

    def fit(self, X=None, y=None, fed=None, parties=None):
        """Fit on this party's columns ``X`` (None at a coordinator); ``y`` is ignored.

        ``fed`` here is deprecated (pass it to the constructor); ``fit(X, fed, parties)``, the old
        positional form, still works and warns.
        """
        if isinstance(y, Federation):                      # the old fit(X, fed[, parties])
            if fed is not None and parties is None:
                parties = fed
            fed, y = y, None
        elif fed is not None and not isinstance(fed, Federation) and parties is None:
            fed, parties = None, fed                       # the old fit(X, None, parties)
        fed = resolve_fed(self, fed)
        self._fed_in_fit = fed
        federated = fed is not None and fed.world_size > 1
        self._torch_io = X is None or isinstance(X, torch.Tensor)
        if X is not None:
            X, _ = features(self, X, reset=True, federated=federated)
            X = as_tensor(X)
        self._forget_fitted()
        self._fit(X, fed, parties)
        self._publish_fitted()
        return self

    def __getstate__(self):
        # A pickle keeps the tensors once: the public numpy copies are made again on unpickling.
        state = super().__getstate__()
        return {k: v for k, v in state.items() if not (k in FITTED_ARRAYS and "_" + k in state)}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._publish_fitted()

    def _forget_fitted(self) -> None:
        """Drop a previous fit's arrays (private tensors and public numpy), so that a refit shows only its own."""
        for name in FITTED_ARRAYS:
            for attr in ("_" + name, name):
                if attr in self.__dict__:
                    delattr(self, attr)

    def _publish_fitted(self) -> None:
        """The fitted tensors (``_NAME``) as numpy arrays under their public names (``NAME``), the last step of
        ``fit`` and of ``load``: what the user sees is scikit-learn's, what the estimator computes with stays
        on its device. Names the fit did not set (a coordinator's ``loadings_``, ...) stay unset."""
        for name in FITTED_ARRAYS:
            if "_" + name in self.__dict__:
                setattr(self, name, _as_numpy(self.__dict__["_" + name]))

    def transform(self, X=None, fed=None):
        """Scores of the training samples (``X=None``) or of new rows of this party's columns (see ``_transform``).

        numpy / pandas in, numpy out; torch in (or ``X=None`` after a torch fit), torch out.
        """
        check_fitted(self, "sample_components_")
        fed = resolve_fed(self, fed, "transform") if fed is not None else getattr(self, "_fed_in_fit", None)
        as_torch = getattr(self, "_torch_io", True)
        if X is not None:
            as_torch = isinstance(X, torch.Tensor)
            X, _ = features(self, X, reset=False, federated=fed is not None and fed.world_size > 1)
            X = as_tensor(X)
        return output(self._transform(X, fed), as_torch)

    def _setup(self, X, fed: Federation | None, parties, *, needs_coordinator: bool = False):
        """Validate, agree on n (and the total number of features) across the parties."""
        X = as_tensor(X)
        if fed is None:
            fed = Federation.local(X.device if isinstance(X, torch.Tensor) else "cpu")
        parties = list(fed.parties if parties is None else (int(p) for p in parties))
        if not parties or any(p not in fed.parties for p in parties):
            raise VFLInputError(f"parties must be a non-empty subset of the data parties {fed.parties}, got {parties}")
        k = self.n_components
        if not isinstance(k, int) or k < 1:
            raise VFLInputError(f"n_components must be a positive integer, got {k!r}")
        if needs_coordinator and fed.world_size > 1 and fed.coordinator is None:
            raise VFLInputError("the server-client topology needs a server: start the federation with a coordinator "
                                "(launch(..., coordinator=True), or `vfl pca --topology server`), or choose a "
                                "decentralised topology (complete, ring, star)")
        client = fed.rank in parties
        if client:
            if not isinstance(X, torch.Tensor) or X.dim() != 2:
                raise VFLInputError(f"{fed.name()} must pass its own columns as a 2-D tensor (n samples x f_i "
                                    f"features), got {type(X).__name__}"
                                    f"{'' if not isinstance(X, torch.Tensor) else f' of shape {tuple(X.shape)}'}")
            if not X.dtype.is_floating_point:
                raise VFLInputError(f"{fed.name()}'s columns must be floating point, got {X.dtype}")
            if not torch.isfinite(X).all():
                raise VFLInputError(f"{fed.name()}'s columns contain NaN or inf: impute them (--impute) first")
            X = X.to(torch.float64)
        self._device = X.device if client else fed.device
        self._meter_before = self._bytes_in(fed)
        with fed.phase("pca/setup"):
            info = [int(X.shape[0]), int(X.shape[1])] if client else None
            if len(parties) == 1 and fed.world_size == 1:
                plan = {"n": info[0], "features": info[1], "widths": [info[1]], "error": None}
            else:
                hub = parties[0]
                gathered = fed.gather_json(info, hub, ranks=parties) if client else None
                plan = None
                if fed.rank == hub:
                    rows = {p: g[0] for p, g in zip(parties, gathered)}
                    error = None
                    if len(set(rows.values())) != 1:
                        error = ("the parties hold different numbers of samples ("
                                 + ", ".join(f"party {p}: {r}" for p, r in rows.items())
                                 + "); every party must hold the same rows in the same order")
                    plan = {"n": gathered[0][0], "features": sum(g[1] for g in gathered),
                            "widths": [g[1] for g in gathered], "error": error}
                ranks = parties + ([fed.coordinator] if fed.coordinator is not None else [])
                if fed.rank in ranks:
                    plan = fed.broadcast_json(plan, hub, ranks=ranks)
        if plan is None:
            raise VFLInputError(f"{fed.name()} takes no part in this fit (parties {parties})")
        if plan["error"]:
            raise VFLInputError(plan["error"])
        n = plan["n"]
        if k > n:
            raise VFLInputError(f"n_components={k} but there are only {n} samples: ask for at most {n}")
        self.n_samples_ = n
        self.n_features_total_ = plan["features"]
        self.party_widths_ = list(plan["widths"])     # f_i of each party of ``parties``, in order (public)
        self.parties_ = parties
        return fed, parties, X, n

    def _kernel_gamma(self, fed: Federation, parties, X: torch.Tensor | None) -> float:
        """The kernel's gamma: a number as given; None: 1 / (total features); 'scale': scikit-learn's
        1 / (F var(X)), var over every entry of the pooled matrix, from three sums per party
        (sum of squares, sum, count)."""
        if self.gamma is None:
            return 1.0 / max(self.n_features_total_, 1)
        if isinstance(self.gamma, str):
            if self.gamma != "scale":
                raise VFLInputError(f"gamma must be a positive number, None or 'scale', got {self.gamma!r}")
            if fed.rank not in parties:
                return float("nan")   # the server merges vectors; it needs no kernel
            part = torch.stack([(X ** 2).sum(), X.sum(), torch.tensor(float(X.numel()), dtype=X.dtype,
                                                                      device=X.device)])
            with fed.phase("pca/setup"):
                summed = secure_allreduce(fed, part, parties=parties) if len(parties) > 1 else part
                sq, total, count = summed.tolist()
            var = sq / count - (total / count) ** 2
            return 1.0 / (self.n_features_total_ * var) if var > 0 else 1.0
        if not float(self.gamma) > 0:
            raise VFLInputError(f"gamma must be positive, got {self.gamma!r}")
        return float(self.gamma)

    # ------------------------------------------------------------------ outputs
    def _finish(self, fed: Federation, parties, Xc: torch.Tensor | None, U: torch.Tensor | None, *,
                shared: bool = True) -> None:
        """Loadings and the explained variance of the components (a sum of k + 1 numbers per party).

        ``shared=False`` (decentralised topologies): each party has its own
        estimate; the explained variance is that of the first party's, which
        it sends down the pairwise tree for the purpose.
        """
        self._sample_components_ = U
        client = fed.rank in parties
        self._loadings_ = Xc.T @ U if client else None
        if not self.linear:
            self._eigenvectors_ = U              # scikit-learn KernelPCA's name for the sample-space vectors
            return
        self._components_ = None
        if client:
            with fed.phase("pca/variance"):
                common = U
                if not shared and len(parties) > 1:
                    common = broadcast(fed, U if fed.rank == parties[0] else None, pairwise_tree(parties),
                                       shape=U.shape, dtype=U.dtype).to(U.device)
                proj = Xc.T @ common
                parts = torch.cat([(proj ** 2).sum(dim=0), (Xc ** 2).sum().reshape(1)])
                # Masked: no party learns another's captured or total variance, only the sums.
                sums = secure_allreduce(fed, parts, parties=parties) if len(parties) > 1 else parts
            captured, total = sums[:-1], sums[-1]
            dof = max(self.n_samples_ - 1, 1)
            self._singular_values_ = captured.clamp_min(0).sqrt()
            self._explained_variance_ = captured / dof
            self.total_variance_ = float(total / dof)
            # numpy, as scikit-learn's PCA (a report of the fit: nothing in vfltorch computes with it)
            self.explained_variance_ratio_ = to_numpy(captured / total if total > 0 else torch.zeros_like(captured),
                                                      np.float64)
            # scikit-learn's components_ restricted to this party's columns (k x f_i): V_i^T.
            sv = self._singular_values_
            self._components_ = (self._loadings_ / torch.where(sv > 0, sv, torch.ones_like(sv))).T.contiguous()

    def _transform(self, X: torch.Tensor | None = None, fed: Federation | None = None) -> torch.Tensor:
        """Scores of samples on the components, at every data party.

        ``X=None``: the training samples, U S (n x k), computed locally. New
        samples: this party's columns of them (m x f_i); each party computes
        (X_i - mean_i) V_i with V_i = Z_i / s, its block of the pooled right
        singular vectors, and the m x k parts are summed over the parties.

        ``transform()`` and ``transform(X_train)`` (every party passing its
        training columns) agree when U holds exact eigenvectors of A = X X^T
        (the exact method): X V = A U / s = U s. For the approximate VFedPCA
        estimate they differ by the residual (A U - U s^2) / s, column by
        column; what always holds is u_j^T transform(X_train)_j = s_j =
        u_j^T transform()_j. ``transform()`` is the one that costs no message
        and reveals nothing (A U would be one Krylov product of the others'
        Gram matrix). ``whiten=True`` divides the scores by
        sqrt(explained_variance_), as scikit-learn's ``PCA(whiten=True)``.
        """
        if not self.linear:
            raise VFLInputError(f"{type(self).__name__}.transform takes no new samples: a kernel between new "
                                "and training samples would need every party's columns; use transform() for "
                                "the training samples' embedding")
        if X is None:
            if self._sample_components_ is None:
                raise VFLInputError(f"this {type(self).__name__} was loaded from a saved model, which keeps no "
                                    f"training embedding: pass the rows to transform")
            return self._whiten(self._sample_components_ * self._singular_values_)
        if self._loadings_ is None:
            raise VFLInputError("only a data party can transform its columns of new samples")
        X = as_tensor(X)
        fed = Federation.local(X.device) if fed is None else fed
        if X.dim() != 2 or X.shape[1] != self._loadings_.shape[0]:
            raise VFLInputError(f"expected this party's {self._loadings_.shape[0]} columns of the new samples "
                                f"(m x {self._loadings_.shape[0]}), got shape {tuple(X.shape)}")
        # (on the model's device: numpy rows, or rows on another device, move there)
        X = to_device(X, self._loadings_.device, torch.float64)
        Xc = X - same_device(self._mean_, X)
        sv = same_device(self._singular_values_, X)
        s = torch.where(sv > 0, sv, torch.ones_like(sv))
        part = Xc @ (same_device(self._loadings_, X) / s)
        with fed.phase("pca/transform"):
            # Masked: a tree parent would otherwise see its child's m x k part (X_i V_i of the new rows).
            scores = secure_allreduce(fed, part, parties=self.parties_) if len(self.parties_) > 1 else part
        return self._whiten(scores)

    def _whiten(self, scores: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """``whiten=True``: scores / sqrt(explained_variance_) (scikit-learn's PCA), or back with ``inverse``."""
        if not getattr(self, "whiten", False):
            return scores
        sd = self._explained_variance_.clamp_min(0).sqrt()
        sd = torch.where(sd > 0, sd, torch.ones_like(sd)).to(scores.device)
        return scores * sd if inverse else scores / sd

    def fit_transform(self, X=None, y=None, fed=None, parties=None):
        """``fit`` then the training samples' scores (``transform()``, no further message)."""
        return self.fit(X, y, fed, parties).transform()

    def inverse_transform(self, scores) -> torch.Tensor:
        """This party's columns reconstructed from scores (m x k): scores V_i^T + mean_i (m x f_i), locally.

        Every party holds the scores (``transform`` returns them everywhere), so no
        message is needed; each party gets back only its own columns. For the exact
        method this is scikit-learn's ``PCA.inverse_transform`` restricted to them.
        """
        check_fitted(self, "sample_components_")
        if not self.linear:
            raise VFLInputError(f"{type(self).__name__} has no inverse_transform (kernel PCA has no linear "
                                f"map back to the features)")
        if getattr(self, "_components_", None) is None:
            raise VFLInputError("only a data party can reconstruct (its own) columns")
        as_torch = isinstance(scores, torch.Tensor)
        scores = as_tensor(scores).to(torch.float64)
        k = self._components_.shape[0]
        if scores.dim() != 2 or scores.shape[1] != k:
            raise VFLInputError(f"expected scores of shape (m, {k}), got {tuple(scores.shape)}")
        V = self._components_
        return output(self._whiten(scores.to(V.device), inverse=True) @ V + self._mean_, as_torch)

    # -------------------------------------------------- save / load (vfltorch.model_store)
    _model_method = "pca"

    def _shard_state(self):
        """A data party's loadings (its columns' rows of V S), column means and the spectrum: what
        ``transform`` of new rows needs. The sample-space components (n x k, one value per training
        row) are not stored. A coordinator's shard holds nothing but the manifest."""
        if not hasattr(self, "_sample_components_"):
            raise VFLInputError(f"{type(self).__name__} is not fitted yet: call fit first")
        if not self.linear:
            # (VFedAKPCA: its transform of new rows needs the party's training columns, local eigenpairs, merge
            # block and kernel means, which no shard format keeps yet)
            raise VFLInputError(f"{type(self).__name__} cannot be saved yet: it scores new rows in the session that "
                                f"fitted it only; ExactFederatedKernelPCA and RandomFeatureKernelPCA can be saved")
        state = self._layout_state()
        if self._loadings_ is None:
            return state, {}
        arrays = {"loadings": self._loadings_, "mean": self._mean_, "singular_values": self._singular_values_,
                  "explained_variance": self._explained_variance_,
                  "explained_variance_ratio": self.explained_variance_ratio_}
        return state, {k: to_numpy(v, np.float64) for k, v in arrays.items()}

    def _layout_state(self) -> dict:
        """Who took part and the public shape of the fit (every shard has it)."""
        return {"parties": list(self.parties_), "n_samples": int(self.n_samples_),
                "n_features_total": int(self.n_features_total_), "party_widths": list(self.party_widths_)}

    def _restore_layout(self, state: dict) -> None:
        self.parties_ = list(state["parties"])
        self.n_samples_ = state["n_samples"]
        self.n_features_total_ = state["n_features_total"]
        self.party_widths_ = list(state["party_widths"])

    def _restore_shard(self, manifest, arrays, fed):
        """``load``'s hook (``model_store.restore_estimator``): the estimator's tensors, then their numpy copies."""
        self._restore_fitted(manifest, arrays, fed)
        self._publish_fitted()

    def _restore_fitted(self, manifest, arrays, fed):
        self._restore_layout(manifest["state"])
        self._sample_components_ = None
        # (on the loading federation's device, as a fit there would leave them)
        t = {k: to_device(v, fed.device, torch.float64) for k, v in arrays.items()}
        self._loadings_ = t.get("loadings")
        self._mean_ = t.get("mean")
        self._singular_values_ = t.get("singular_values")
        self._explained_variance_ = t.get("explained_variance")
        self.explained_variance_ratio_ = arrays.get("explained_variance_ratio")
        self._components_ = None
        if self._loadings_ is not None:
            sv = self._singular_values_
            self._components_ = (self._loadings_ / torch.where(sv > 0, sv, torch.ones_like(sv))).T.contiguous()

    def _bytes_in(self, fed: Federation) -> dict:
        """This party's meter totals for the fit proper (phases pca/<method>...), since the federation began."""
        phases = [p for p in fed.meter.as_dict() if p == f"pca/{self.method}" or p.startswith(f"pca/{self.method}/")]
        return fed.meter.totals(phases)

    def _count_bytes(self, fed: Federation) -> None:
        """``bytes_`` / ``messages_``: what this party sent during this fit (the meter counts since the start)."""
        now = self._bytes_in(fed)
        self.bytes_ = now["bytes_sent"] - self._meter_before["bytes_sent"]
        self.messages_ = now["messages_sent"] - self._meter_before["messages_sent"]
