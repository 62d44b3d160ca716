"""What one party's shard of a saved FDSKL model holds, and how the party's estimator is rebuilt from it.

One function each way (``fdskl_shard_state`` / ``restore_fdskl_shard``), so that a change of
FDSKL's model representation changes this file only.

A party's shard: its global column indices (the rows of W it draws), sigma, the number of blocks
of random features, the floating-point type, and the phase key of the blocks it keeps (under the
paper's protocol a secret of that party; under the shared protocol derived from the public seed).
W itself is not stored: it is a pure function of (random_state, column, feature) and is redrawn
for the party's own columns. The active party's shard alone holds alpha (the coefficients, which
need the labels) and, for regression, the target scaling. The dealer's shard (shared protocol)
holds the public schedule only. A compressed model (``compress.py``) adds its support, the
indices of the kept features, to every shard (every party knows it). The dealer's cosine table is a fixed public function and is
rebuilt locally; fresh masks come from the operating system at every prediction.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..devices import to_device, to_numpy
from .circle import Circle
from .protocol import FederatedFeatureMap
from .random_features import FourierSampler
from .shared import cosine_table, pair_table


def fdskl_shard_state(est) -> tuple[dict, dict]:
    subs = getattr(est, "estimators_", None)
    if subs:
        # One-vs-rest: one shard for all classes when every class was trained on the same random features
        # (same public seed and phase key: the shared protocol's case); alpha_ is then D x classes.
        keys = {(str(e.feature_map_._phase_key), e.feature_map_.n_blocks) for e in subs}
        if len(keys) != 1 or est._alpha is not None and est._alpha.dim() != 2:
            from ..data.validation import VFLInputError

            raise VFLInputError("this one-vs-rest (multi-class) FDSKL model cannot be saved: its classes were "
                                "trained on different random features (private phase keys of --protocol paper); "
                                "train it with --protocol shared (the default) to save it")
    fmap = est.feature_map_
    fed = fmap.fed
    state = {"n_blocks": fmap.n_blocks, "dtype": str(fmap.dtype).replace("torch.", ""),
             "sigma": None if not np.isfinite(est.sigma_) else float(est.sigma_),
             "n_features_in": int(est.n_features_in_),
             "n_columns_total": int(getattr(est, "n_columns_total_", est.n_features_in_)),
             "n_iter": int(est.n_iter_), "phase_key": str(fmap._phase_key),
             "predict_coordinator": bool(est._shared(fed))}
    support = getattr(est, "_support", None)
    if support is not None:                           # a compressed model's kept features (public, every party)
        state["support"] = [int(j) for j in support.tolist()]
    if subs:
        state["one_vs_rest"] = len(subs)
    arrays = {"columns": np.asarray(est.columns_, dtype=np.int64)}
    if est._alpha is not None and fed.is_active:
        arrays["alpha"] = to_numpy(est._alpha)
        state["y_offset"] = float(getattr(est, "y_offset_", 0.0))
        state["y_scale"] = float(getattr(est, "y_scale_", 1.0))
        platt = getattr(est, "platt_", None)
        if platt is not None:                         # Platt scaling's (A, B): the active party's, like alpha
            state["platt"] = [float(platt[0]), float(platt[1])]
    return state, arrays


def restore_fdskl_shard(est, manifest: dict, arrays: dict, fed) -> None:
    state = manifest["state"]
    est.fed = fed if fed.world_size > 1 else None
    dtype = getattr(torch, state["dtype"])
    device = torch.device(est.device) if est.device is not None else fed.device
    columns = np.asarray(arrays["columns"], dtype=np.int64)
    sigma = state["sigma"]
    masks, _ = est._masks(fed)                        # fresh private masks (or the simulation's seeded ones)
    est.n_features_in_ = state["n_features_in"]
    est.n_columns_total_ = state["n_columns_total"]
    est.columns_ = columns
    est.sigma_ = float("nan") if sigma is None else float(sigma)
    est.n_iter_ = state["n_iter"]
    fmap = FederatedFeatureMap(
        fed, FourierSampler(est.kernel, 1.0 if sigma is None else sigma, est.random_state), columns,
        est.features_per_step, seed=est.random_state, phase_key=int(state["phase_key"]), masks=masks,
        circle=Circle(est.angle_bits), dtype=dtype, device=device, max_elements=est.max_elements,
        public_phases=est.protocol in ("shared", "sealed"))
    for _ in range(state["n_blocks"]):
        fmap.add_block()                              # W of this party's columns, keepers, kept phases
    est.feature_map_ = fmap
    est.n_random_features_ = fmap.n_features
    est._set_support(torch.tensor(state["support"], dtype=torch.int64) if state.get("support") is not None else None)
    est._set_alpha(None)
    platt = state.get("platt")
    est.platt_ = None
    if "alpha" in arrays and isinstance(platt, list) and len(platt) == 2 and all(
            isinstance(v, (int, float)) and np.isfinite(v) for v in platt):
        est.platt_ = (float(platt[0]), float(platt[1]))
    if "alpha" in arrays:
        est._set_alpha(to_device(arrays["alpha"], device))
        if "y_offset" in state:
            est.y_offset_, est.y_scale_ = state["y_offset"], state["y_scale"]
    shared = est._shared(fed)
    est.table_ = None
    if shared and not fed.is_active:
        est.table_ = pair_table(cosine_table().to(torch.int64))
    est.estimators_ = None
    if state.get("one_vs_rest"):
        # One binary model per class over the same features: class k's coefficients are column k of alpha.
        subs = []
        for k in range(int(state["one_vs_rest"])):
            sub = copy.copy(est)
            sub._set_alpha(None if est._alpha is None else est._alpha[:, k].contiguous())
            subs.append(sub)
        est.estimators_ = subs
