"""DP-SCD with a privacy budget: (epsilon, delta) = (1, 1e-3); the noise is calibrated by opacus' PRV accountant
and the epsilon actually spent is reported. Rows are divided by their norm by default (the sensitivity bound)."""
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vfltorch import DPSCD

X, y = load_breast_cancer(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
pipe = make_pipeline(StandardScaler(), DPSCD(epsilon=1.0, delta=1e-3, epochs=5)).fit(X_train, y_train)
dp = pipe[-1]
print(f"DP-SCD: test accuracy {pipe.score(X_test, y_test):.3f}, epsilon spent {dp.epsilon_:.3f} "
      f"(delta {dp.delta_}), noise multiplier sigma {dp.sigma_:.3f}")
