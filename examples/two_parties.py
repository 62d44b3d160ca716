"""Train and score FDSKL across two parties on loopback: party 0 (the active party) holds columns 0-14 and the
labels, party 1 columns 15-29; a dealer (coordinator) deals masks. Each party process sees only its own columns.
Across organisations the same job runs with `vfl fdskl --federation FILE` (docs/deployment.md)."""
import warnings

from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MinMaxScaler

from vfltorch import FDSKLClassifier, launch


def party(fed):
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = MinMaxScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    cols = slice(0, 15) if fed.rank == 0 else slice(15, 30)
    mine_train = None if fed.is_coordinator else X_train[:, cols]
    mine_test = None if fed.is_coordinator else X_test[:, cols]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = FDSKLClassifier(fed, epochs=2).fit(mine_train, y_train if fed.is_active else None)
    return clf.score(mine_test, y_test if fed.is_active else None)   # collective; the accuracy at the active party


if __name__ == "__main__":
    print("federated test accuracy:", launch(party, 2, coordinator=True)[0])
