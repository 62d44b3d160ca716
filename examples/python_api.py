"""The Python API on one machine: vfltorch's estimators are scikit-learn estimators (one party: the centralised
algorithm). Runs in seconds on breast_cancer."""
import warnings

from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vfltorch import FDSKLClassifier, HeteroLogisticRegression

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)

for model in (FDSKLClassifier(epochs=2, calibration=0.1), HeteroLogisticRegression()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # scaling advice and single-party notes
        pipe = make_pipeline(StandardScaler(), model).fit(X_train, y_train)
    proba = pipe.predict_proba(X_test)[:, 1]
    print(f"{type(model).__name__}: test accuracy {pipe.score(X_test, y_test):.3f}, "
          f"P(benign) of the first rows {proba[:3].round(3).tolist()}")
