"""The Yale faces case study (the paper's Figures 10/11): components as images, and k-means on the features.

    python -m experiments.vfedpca_yale --output-dir results/vfedpca_yale

Yale 32x32 (165 faces, 15 subjects, 1024 pixels) split by columns among
Q = 8 parties (as in the reference code: 128 pixels, i.e. four image columns,
each) and a server. Fitted, with k components:

* pooled PCA (the oracle) and the exact federated PCA (masked sums);
* VFedPCA, T = 10, l = 10, plain and with warm start (Algorithm 3);
* VFedAKPCA, RBF kernel with gamma = 'scale', and the exact kernel PCA;
* isolated: every party's own k leading eigenvectors of its own pixels.

Outputs: ``components.png`` - the leading components as images (the pooled
right singular vectors, Z = X^T u, reshaped 32 x 32; for the federated
methods each party's Z_i = X_i^T u put side by side; for 'isolated' each
party's Z_i = X_i^T a_i of its own eigenvector, as in the reference code);
``clustering.json`` / ``summary.md`` - k-means with 15 clusters on the
sample features (PCA scores U S; kernel methods U sqrt(lambda)), scored by
NMI and clustering accuracy (Hungarian matching) against the 15 subjects,
mean and standard deviation over ``--restarts`` k-means seeds; the isolated
row is the mean over the 8 parties (and the best party). ``--quick``: k = 5,
3 restarts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from vfltorch.data import load_dataset
from vfltorch.pca import (ExactFederatedKernelPCA, ExactFederatedPCA, VFedAKPCA, VFedPCA, aligned_distances,
                          pooled_kernel_pca, pooled_pca)

from .vfedpca_common import Job, distances, pooled_matrix, run_jobs
from .outputs import pyplot as plt, write_json

PAPER = ("Figures 10/11 show the projected images of the unsplit, federated and isolated methods (the reference "
         "code also k-means the pixels of those images); there is no clustering score against the subjects to "
         "compare with")
Q = 8


def cluster_scores(features: np.ndarray, labels: np.ndarray, restarts: int) -> dict:
    from scipy.optimize import linear_sum_assignment
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    nmi, acc = [], []
    for seed in range(restarts):
        pred = KMeans(15, n_init=10, random_state=seed).fit_predict(features)
        nmi.append(normalized_mutual_info_score(labels, pred))
        table = np.zeros((15, 15))
        np.add.at(table, (pred, labels), 1)
        rows, cols = linear_sum_assignment(-table)
        acc.append(table[rows, cols].sum() / len(labels))
    return {"nmi": float(np.mean(nmi)), "nmi_std": float(np.std(nmi)), "acc": float(np.mean(acc)),
            "acc_std": float(np.std(acc))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", default="results/vfedpca_yale")
    ap.add_argument("--components", type=int, default=10)
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    k = 5 if args.quick else args.components
    restarts = 3 if args.quick else args.restarts
    out = Path(args.output_dir)
    ds = "yale"
    jobs = [
        Job("exact", ds, Q, ExactFederatedPCA, dict(n_components=k)),
        Job("vfedpca", ds, Q, VFedPCA, dict(n_components=k, periods=10, local_iters=10, merge="paper")),
        Job("vfedpca-warm", ds, Q, VFedPCA, dict(n_components=k, periods=10, local_iters=10, warm_start=True,
                                                     merge="paper")),
        Job("akpca", ds, Q, VFedAKPCA, dict(n_components=k, kernel="rbf", gamma="scale", merge="paper")),
        Job("exact-kernel", ds, Q, ExactFederatedKernelPCA, dict(n_components=k, kernel="rbf", gamma="scale")),
    ]
    results = {r["job"].name: r for r in run_jobs(jobs)}
    X = pooled_matrix(ds)
    labels = np.asarray(load_dataset(ds).y)
    Xc = X - X.mean(0)
    G, lam = pooled_pca(X, k)
    gamma = results["akpca"]["gamma"]
    GK, lamK = pooled_kernel_pca(X, k, kernel="rbf", gamma=gamma)

    def scores(U, s):
        return (U * s).numpy()

    def linear_scale(U):
        # s_j = ||X^T u_j||: what the federation computes by a sum over the parties
        return torch.linalg.vector_norm(Xc.T @ U, dim=0)

    feats = {"pooled PCA (oracle)": (scores(G, lam.sqrt()), G, G)}
    for name in ("exact", "vfedpca", "vfedpca-warm"):
        U = results[name]["components"][0]
        feats[name] = (scores(U, linear_scale(U)), U, G)
    ak = results["akpca"]
    lam_ak = torch.stack([v for v in ak["local_eigenvalues"]]).mean(0)
    feats["akpca"] = (scores(ak["components"][0], lam_ak.clamp_min(0).sqrt()), ak["components"][0], GK)
    ek = results["exact-kernel"]
    feats["exact-kernel"] = (scores(ek["components"][0], lamK.sqrt()), ek["components"][0], GK)
    feats["pooled kernel PCA (oracle)"] = (scores(GK, lamK.sqrt()), GK, GK)
    table = {}
    for name, (F, U, ref) in feats.items():
        table[name] = {**cluster_scores(F, labels, restarts), **distances(U, ref),
                       "distance_c1": float(aligned_distances(U[:, :1], ref[:, :1])[0])}
    # Isolated: each party clusters on its own k leading components (VFedPCA's first local power iteration).
    iso = []
    for U_i, alpha_i in zip(results["vfedpca"]["local_components"], results["vfedpca"]["local_eigenvalues"]):
        iso.append({**cluster_scores(scores(U_i, alpha_i.clamp_min(0).sqrt()), labels, restarts),
                    **distances(U_i, G), "distance_c1": float(aligned_distances(U_i[:, :1], G[:, :1])[0])})
    table["isolated (mean of 8 parties)"] = {key: float(np.mean([r[key] for r in iso])) for key in iso[0]}
    best = max(iso, key=lambda r: r["nmi"])
    table["isolated (best party)"] = best
    table["raw pixels (oracle)"] = cluster_scores(X.numpy(), labels, restarts)
    record = {"paper": PAPER, "settings": {"parties": Q, "components": k, "restarts": restarts, "gamma": gamma},
              "clustering": table, "bytes": {n: r["bytes"] for n, r in results.items()},
              "rounds": {n: r["rounds"] for n, r in results.items()}}
    write_json(out / "clustering.json", record)
    _images(out, X, results, G)
    lines = ["# Yale faces: k-means (15 clusters) on federated, pooled and isolated features (measured)", "",
             f"settings: {record['settings']}", "",
             "| features | NMI | accuracy | distance, component 1 | largest distance, k components "
             "| largest angle (deg) | bytes | rounds |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in table.items():
        key = name.split(" ")[0]
        lines.append(f"| {name} | {r['nmi']:.3f} ± {r['nmi_std']:.3f} | {r['acc']:.3f} ± {r['acc_std']:.3f} | "
                     f"{r.get('distance_c1', float('nan')):.3g} | {r.get('distance', float('nan')):.3g} | {r.get('angle_deg', float('nan')):.3g} | "
                     f"{record['bytes'].get(key, '')} | {record['rounds'].get(key, '')} |")
    lines += ["", f"Paper: {PAPER}"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _images(out: Path, X: torch.Tensor, results: dict, G: torch.Tensor) -> None:
    """Leading components as 32 x 32 images (pixel (r, c) is column c * 32 + r)."""
    pyplot = plt()
    Xc = X - X.mean(0)
    rows = {"pooled PCA": Xc.T @ G}
    for name in ("exact", "vfedpca", "vfedpca-warm", "akpca"):
        rows[name] = torch.cat(results[name]["loadings"], 0)
    rows["isolated"] = torch.cat([Xi.T @ a for Xi, a in zip(torch.tensor_split(Xc, Q, dim=1),
                                                             results["vfedpca"]["local_components"])], 0)
    # Eigenvectors have no sign: show every image with the sign that matches the pooled one.
    ref = rows["pooled PCA"]
    rows = {name: Z * torch.where((Z * ref).sum(0) < 0, -1.0, 1.0).to(Z.dtype) for name, Z in rows.items()}
    shown = min(4, G.shape[1])
    f, axes = pyplot.subplots(len(rows), shown, figsize=(1.8 * shown, 1.9 * len(rows)), squeeze=False)
    for i, (name, Z) in enumerate(rows.items()):
        for j in range(shown):
            ax = axes[i][j]
            ax.imshow(Z[:, j].reshape(32, 32).T.numpy(), cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(name, fontsize=8)
    f.tight_layout()
    f.savefig(out / "components.png", dpi=110)
    pyplot.close(f)


if __name__ == "__main__":
    raise SystemExit(main())
