"""Private random-feature kernel PCA (``vfl pca --method rffkpca``) on abalone against scikit-learn's exact
RBF ``KernelPCA``: seconds, bytes, principal angles and eigenvalues (docs/pca.md).

    VFLTORCH_DATA=/work/shared/data python -m experiments.rffkpca_abalone --features 256 1024

Per D: one launch of 3 data parties + the coordinator on abalone's 4177 rows (the CLI's loader and
partition), the same fit centrally (Q = 1, float64, the same grid phases: the twin), and scikit-learn's
KernelPCA (dense, n x n: the oracle only) with the same gamma ('scale').
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.pca.linalg import shared_start
from vfltorch.pca.metrics import compare
from vfltorch.pca.rff_kpca import RandomFeatureKernelPCA

K = 3


def job(fed, D):
    data = load_party_data(fed, DataConfig(dataset="abalone", seed=0, test_fraction=0.0)) if fed.is_data_party \
        else None
    est = RandomFeatureKernelPCA(K, n_random_features=D, gamma="scale", fed=fed)
    est.fit(None if data is None else data.X_train)
    return {"U": est.sample_components_, "lam": est.eigenvalues_, "bytes": est.bytes_, "seconds": est.fit_seconds_,
            "gamma": est.gamma_}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--features", type=int, nargs="+", default=[256])
    args = p.parse_args(argv)
    X = load_party_data(Federation.local("cpu"), DataConfig(dataset="abalone", seed=0, test_fraction=0.0)).X_train
    X = X.to(torch.float64)
    n = X.shape[0]
    ref = shared_start(n, K, 0, 1, device="cpu")
    oracle = None
    for D in args.features:
        started = time.perf_counter()
        out = launch(job, 3, args=(D,), coordinator=True)
        wall = time.perf_counter() - started
        gamma = out[0]["gamma"]
        if oracle is None:
            from sklearn.decomposition import KernelPCA
            kp = KernelPCA(K, kernel="rbf", gamma=gamma).fit(X.numpy())
            oracle = (torch.tensor(kp.eigenvectors_), torch.tensor(kp.eigenvalues_))
        central = RandomFeatureKernelPCA(K, n_random_features=D, gamma=gamma).fit(X)
        row = {"D": D, "n": n, "gamma": gamma, "fit_seconds": max(o["seconds"] for o in out[:3]),
               "launch_seconds": wall, "bytes": sum(o["bytes"] for o in out),
               "to_sklearn": compare(out[0]["U"], oracle[0], ref),
               "twin_max_abs": float(np.abs(out[0]["U"] - central.sample_components_).max()),
               "eigenvalues": out[0]["lam"].tolist(), "sklearn_eigenvalues": oracle[1].tolist()}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
