"""Vertical federated PCA: two parties hold 15 columns each of breast_cancer; the exact federated PCA equals the
pooled one, and each party gets the same scores without showing its columns."""
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

from vfltorch import ExactFederatedPCA, launch


def party(fed):
    X = StandardScaler().fit_transform(load_breast_cancer().data)
    if fed.is_coordinator:                                      # the dealer / eigensolver holds no columns
        ExactFederatedPCA(2, fed=fed).fit(None)
        return None
    mine = X[:, :15] if fed.rank == 0 else X[:, 15:]            # this party's own columns only
    pca = ExactFederatedPCA(2, fed=fed).fit(mine)
    return {"scores": pca.transform(), "ratio": pca.explained_variance_ratio_.tolist()}


if __name__ == "__main__":
    results = launch(party, 2, coordinator=True)
    pooled = ExactFederatedPCA(2).fit(StandardScaler().fit_transform(load_breast_cancer().data)).transform()
    print("explained variance ratio", np.round(results[0]["ratio"], 4).tolist())
    print("federated == pooled:", np.allclose(np.abs(results[0]["scores"]), np.abs(pooled), atol=1e-6))
