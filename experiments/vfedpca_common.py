"""What the VFedPCA experiments share: each party's columns, many fits in one launch, the metrics.

Every experiment runs the real federated code: one process per party (and a
server rank), started once with ``launch``; inside, each *job* (a dataset, a
number of clients p, an estimator and its settings) is fitted by the first p
ranks, which read the data and keep only their own columns, exactly as
``vfl pca`` does. The pooled reference is computed in the parent process,
which may read everything: it is the evaluation oracle, not a party.

A dataset is a registered name (``vfl datasets``) or
``synthetic:<single|mixture>:<features>x<samples>[:seed]``.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from vfltorch.comm import launch
from vfltorch.data import load_dataset, partition_columns, scale_columns
from vfltorch.pca import (aligned_distances, equal_merge, gaussian_data, pooled_kernel_pca, pooled_pca,
                          principal_angles, shared_start, unaligned_distances)

# The five structured datasets of the paper's Figures 6-8 and the numbers of clients p used with them:
# the paper's p = 3, 5, 10, capped by the number of features (PimaIndiansDiabetes has 8 here; the
# paper's copy may have been the 34-column file mislabelled as Pima, see the data MANIFEST, note 1).
STRUCTURED = {"sonar": [3, 5, 10], "vehicle": [3, 5, 10], "pima": [2, 4, 8], "glaucoma": [3, 5, 10],
              "college": [3, 5, 10]}


@dataclass
class Job:
    """One fit: ``estimator(**params, fed=fed).fit(own columns, parties=range(p))``."""

    name: str
    dataset: str
    p: int
    estimator: type
    params: dict = field(default_factory=dict)
    scale: str = "none"
    tags: dict = field(default_factory=dict)


# ------------------------------------------------------------------------ data
def _synthetic_spec(dataset: str):
    _, pattern, shape, *rest = dataset.split(":")
    m, n = (int(v) for v in shape.split("x"))
    return pattern, m, n, int(rest[0]) if rest else 0


@functools.lru_cache(maxsize=4)
def _whole(dataset: str) -> np.ndarray:
    return np.asarray(load_dataset(dataset).X, dtype=np.float64)


def n_features(dataset: str) -> int:
    if dataset.startswith("synthetic:"):
        return _synthetic_spec(dataset)[1]
    return _whole(dataset).shape[1]


def party_columns(dataset: str, p: int, index: int, scale: str = "none") -> torch.Tensor:
    """Party ``index``'s block of ``dataset`` split contiguously among p parties, scaled on its own columns."""
    cols = partition_columns(n_features(dataset), p)[index]
    if dataset.startswith("synthetic:"):
        pattern, m, n, seed = _synthetic_spec(dataset)
        return gaussian_data(m, n, pattern, seed=seed, columns=cols)
    X = scale_columns(_whole(dataset)[:, cols], None, scale)[0]
    return torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float64)


def pooled_matrix(dataset: str, scale: str = "none") -> torch.Tensor:
    """All columns with the same per-column preprocessing (the oracle's view)."""
    if dataset.startswith("synthetic:"):
        pattern, m, n, seed = _synthetic_spec(dataset)
        return gaussian_data(m, n, pattern, seed=seed)
    return torch.as_tensor(scale_columns(_whole(dataset), None, scale)[0], dtype=torch.float64)


# ----------------------------------------------------------------------- fits
def _torch(value):
    """A fitted array (numpy since issue 37), or a list of them, as tensors: the experiments compute with torch."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_torch(v) for v in value]
    return torch.as_tensor(value)


def _party(fed, jobs):
    out = []
    for job in jobs:
        parties = list(range(job.p))
        if fed.is_data_party and fed.rank not in parties:
            out.append(None)
            continue
        X = party_columns(job.dataset, job.p, fed.rank, job.scale) if fed.is_data_party else None
        est = job.estimator(**job.params)
        started = time.perf_counter()
        est.set_params(fed=fed).fit(X, parties=parties)
        elapsed = time.perf_counter() - started
        out.append({
            "components": _torch(getattr(est, "sample_components_", None)),
            "history": _torch(getattr(est, "history_", None)) if fed.rank in (0, fed.coordinator) else None,
            "local_components": _torch(getattr(est, "local_components_", None)),
            "local_eigenvalues": _torch(getattr(est, "local_eigenvalues_", None)),
            "loadings": _torch(getattr(est, "loadings_", None)),
            "bytes": getattr(est, "bytes_", 0), "rounds": getattr(est, "rounds_", 0),
            "seconds": elapsed, "converged": getattr(est, "converged_", None),
            "gamma": getattr(est, "gamma_", None),
        })
    return out


def run_jobs(jobs: list[Job], *, coordinator: bool = True, timeout: float = 600.0) -> list[dict]:
    """Fit every job in one launch of max(p) parties (+ a server); per job: what the parties hold."""
    world = max(job.p for job in jobs)
    per_rank = launch(_party, world, args=(jobs,), coordinator=coordinator, timeout=timeout)
    results = []
    for j, job in enumerate(jobs):
        ranks = [per_rank[r][j] for r in range(job.p)]
        server = per_rank[world][j] if coordinator else None
        results.append({
            "job": job,
            "components": [r["components"] for r in ranks],
            "history": ranks[0]["history"],
            "local_components": [r["local_components"] for r in ranks],
            "local_eigenvalues": [r["local_eigenvalues"] for r in ranks],
            "loadings": [r["loadings"] for r in ranks],
            "bytes": sum(r["bytes"] for r in ranks) + (server["bytes"] if server else 0),
            "rounds": ranks[0]["rounds"],
            "seconds": max(r["seconds"] for r in ranks),
            "converged": ranks[0]["converged"],
            "gamma": ranks[0]["gamma"],
        })
    return results


# -------------------------------------------------------------------- metrics
def reference(dataset: str, k: int, scale: str = "none", *, kernel: str | None = None, gamma=None, **kw):
    """The pooled eigenvectors (n x k) the federated ones are compared with."""
    X = pooled_matrix(dataset, scale)
    if kernel is None:
        return pooled_pca(X, k)[0]
    return pooled_kernel_pca(X, k, kernel=kernel, gamma=gamma, **kw)[0]


def distances(U: torch.Tensor, G: torch.Tensor, seed: int = 0) -> dict:
    r = shared_start(G.shape[0], G.shape[1], seed, 1, device="cpu")
    return {"distance": float(aligned_distances(U, G).max()),
            "distance_unaligned": float(unaligned_distances(U, G, r).max()),
            "angle_deg": float(principal_angles(U, G).max()) * 180 / math.pi}


def curve(result: dict, G: torch.Tensor, seed: int = 0) -> list[dict]:
    """Distance per period: period 0 is the paper's 'isolated' average of the local eigenvectors."""
    local = [c for c in result["local_components"] if c is not None]
    points = []
    if local:
        iso = equal_merge(torch.stack(local))
        own = [distances(c, G, seed)["distance"] for c in local]
        points.append({"period": 0, **distances(iso, G, seed), "own_mean": float(np.mean(own)),
                       "own_min": float(np.min(own))})
    for t, U in enumerate(result["history"] or [], start=1):
        points.append({"period": t, **distances(U, G, seed)})
    return points


def final_distance(result: dict, G: torch.Tensor, seed: int = 0) -> dict:
    """Largest distance over the parties' final estimates (they differ in decentralised topologies)."""
    per = [distances(U, G, seed) for U in result["components"] if U is not None]
    return {key: max(p[key] for p in per) for key in per[0]} | {"distance_mean": float(np.mean([p["distance"]
                                                                                                 for p in per]))}
