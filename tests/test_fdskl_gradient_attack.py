"""Issue 35: the label holder pools everything it was opened in a real FDSKL run and solves for the passive columns.

Real runs (``launch``: one process per party and the dealer): the active party's view is recorded in its own process
(``fdskl_view.record_active_view``; nothing in the protocol changes) and the attacker solves.

* ``protocol='shared'`` opens the active party the D gradient sums of every step; W and b are public, so one step's
  sums are D equations in the batch's B d_P passive values. ``test_the_gradient_attack_is_real`` solves the first
  step's (``fdskl_view.attack_steps``) on two data sets with few passive columns, where the system is most
  overdetermined: breast cancer at Q = 3 (20 passive columns, 640 unknowns) and Pima diabetes at Q = 2 (4 passive
  columns, 128 unknowns). It must keep working against the protocol it was written for.
* The default (``protocol='sealed'``) opens no per-feature value during training: f on the batch rows of every step
  and, once, the averaged coefficients. ``test_the_default_defeats_the_pooled_attack`` pools all of it over the
  whole run (every step and epoch, and on breast cancer the width selection's four candidate runs, forced onto its
  427 rows: f on their batch rows and on the held-out rows; the default runs no distillation) with the public
  seeds and the attacker's own columns, models each opened number exactly as a function of all n d_P passive
  values (``fdskl_view.pooled_equations``: the residual at the truth is the fixed point's), and
  solves jointly by bounded quasi-Newton from several starts (``fdskl_view.pooled_attack``). It must find nothing
  beyond a regression on the attacker's own columns and f, on breast cancer at Q = 3 and a 3,000-row sample of
  credit_default at Q = 2 (11 passive columns), with 100 and 500 held-out monitor rows whose f the active party is
  opened at every epoch end (as ``vfl fdskl --monitor-rows`` does): their passive values are unknowns too. Pima at Q = 2 is refused at the default's size: 1,536 opened
  coefficients against 2,304 passive values (576 rows x 4) (``sealed.check_sealed``).
"""

import pytest
import torch

from fdskl_view import (attack_steps, column_r2, own_column_baseline, pooled_attack, pooled_equations, pooled_loss,
                        public_view, record_active_view)
from vfltorch.comm import FederationError, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import FDSKLClassifier
from vfltorch.kernels.sealed import MU_NUM, MU_SHIFT

pytestmark = pytest.mark.slow          # 40 s per data set for the gradient attack; minutes for the pooled one

SHARED_CASES = {"breast_cancer": (3, None), "pima": (2, None)}
# (Q, rows, random starts, L-BFGS-B iterations per start, monitor rows, width selection): 203 s for both without the
# selection, runs and solves, on 2 cores. The monitor rows are held-out rows whose f A is opened at every epoch end,
# as `vfl fdskl --monitor-rows` does. The width selection runs by default from 5,000 training rows: on breast
# cancer it is forced (its four candidates' openings pooled too, in the same unknowns).
DEFAULT_CASES = {"breast_cancer": (3, None, 2, 300, 100, True), "credit_default": (2, 3000, 1, 150, 500, False)}


def view_job(fed, dataset, rows, params, monitor_rows=0, select=False):
    if select:
        from vfltorch.kernels import selection

        selection.SELECT_MIN_ROWS = 100          # the default's selection on fewer rows than it needs by default
    view = {}
    if fed.is_active:
        record_active_view(view)
    data = load_party_data(fed, DataConfig(dataset=dataset, scale="minmax", seed=0)) if fed.is_data_party else None
    est = FDSKLClassifier(fed, **params)
    if data is None:
        est.fit(None, monitor=(torch.zeros(monitor_rows, 0), None) if monitor_rows else None)
        return None
    X, y = data.X_train, data.y_train
    if rows is not None:                    # the same leading rows at every party (aligned)
        X, y = X[:rows], (None if y is None else y[:rows])
    X_mon = data.X_test[:monitor_rows]
    monitor = (X_mon, None if data.y_test is None else data.y_test[:monitor_rows]) if monitor_rows else None
    est.fit(X, y, columns=data.columns, monitor=monitor)
    if fed.is_active:
        mine = set(int(c) for c in est.columns_)
        passive = [c for c in range(est.n_columns_total_) if c not in mine]
        return {"view": public_view(view, passive), "passive": passive, "protocol": est.protocol}
    return {"X": torch.as_tensor(X, dtype=torch.float64), "X_mon": torch.as_tensor(X_mon, dtype=torch.float64),
            "columns": [int(c) for c in est.columns_]}


def recorded_run(dataset, Q, rows, params, monitor_rows=0, select=False):
    """(the active party's public view, the passive columns in its order (the monitor rows' after the training
    rows'), the protocol that ran)."""
    out = launch(view_job, Q, args=(dataset, rows, params, monitor_rows, select), coordinator=True)
    columns = sum((out[r]["columns"] for r in range(1, Q)), [])
    truth = torch.cat([torch.cat([out[r]["X"], out[r]["X_mon"]]) for r in range(1, Q)], dim=1)
    return out[0]["view"], truth[:, [columns.index(c) for c in out[0]["passive"]]], out[0]["protocol"]


def skip_without(dataset):
    from vfltorch.data import available

    if dataset in ("pima", "credit_default") and not available(dataset):
        pytest.skip(f"{dataset} needs the shared data folder (../shared/data or $VFLTORCH_DATA; not on this machine)")


@pytest.fixture(scope="module", params=sorted(SHARED_CASES))
def attacked(request):
    skip_without(request.param)
    Q, rows = SHARED_CASES[request.param]
    pv, truth, _ = recorded_run(request.param, Q, rows, {"protocol": "shared"})
    (batch, Z, residual, starts), = attack_steps(pv, [0])
    r2 = column_r2(torch.from_numpy(Z), truth[batch])
    baseline = own_column_baseline(pv["X_A"][batch], truth[batch])
    print(f"\n{request.param} Q={Q}, shared: first step, {len(batch)} rows x {truth.shape[1]} passive columns; "
          f"relative residual {residual:.2e} after {starts} starts; per-column R^2 median {float(r2.median()):.3f} "
          f"(min {float(r2.min()):.3f}), mean abs error {float(abs(torch.from_numpy(Z) - truth[batch]).mean()):.3f}; "
          f"regression on own columns {float(baseline.median()):.3f}")
    return {"r2": r2, "baseline": baseline, "residual": residual}


def test_the_gradient_attack_is_real(attacked):
    r2, baseline = attacked["r2"], attacked["baseline"]
    assert attacked["residual"] < 5e-4                       # the solver reached the sums' quantisation floor
    assert float(r2.median()) > 0.8, r2                      # (0.91-0.98 measured: the width varies with the run)
    assert float(r2.median()) > float(baseline.median()) + 0.05, (r2, baseline)


@pytest.fixture(scope="module", params=sorted(DEFAULT_CASES))
def pooled(request):
    skip_without(request.param)
    Q, rows, starts, iters, monitor_rows, select = DEFAULT_CASES[request.param]
    pv, truth, protocol = recorded_run(request.param, Q, rows, {}, monitor_rows, select)
    assert len(pv["candidates"]) == (4 if select else 0)    # (the default grid's four candidates were pooled)
    equations = pooled_equations(pv, sealed=protocol == "sealed", mu=MU_NUM / 2 ** MU_SHIFT)
    at_truth = float(pooled_loss(pv, equations)(truth))
    Z, residual = pooled_attack(pv, equations, starts=starts, iters=iters)
    n = pv["X_A"].shape[0]
    r2 = column_r2(torch.from_numpy(Z[:n]), truth[:n])
    r2_mon = column_r2(torch.from_numpy(Z[n:]), truth[n:])
    f_last = torch.zeros(n, dtype=torch.float64)
    for rows_t, f in zip(pv["batches"], pv["f"]):
        f_last[rows_t] = f                                   # the last f the attacker was opened on each row
    baseline = own_column_baseline(pv["X_A"], truth[:n], f_last[:, None])
    f_mon = torch.stack([f for _, f in pv["monitor"]], 1)   # m x (epoch ends): every f it was opened on those rows
    baseline_mon = own_column_baseline(pv["X_A_mon"], truth[n:], f_mon)
    print(f"\n{request.param} Q={Q}, default ({protocol}): {n} rows and {monitor_rows} monitor rows x {truth.shape[1]} "
          f"passive columns, {len(pv['f'])} steps, {len(pv['monitor'])} monitor openings, "
          f"{len(pv['candidates'])} selection candidates; relative residual at the "
          f"truth {at_truth:.2e}, the attack's {residual:.2e}; per-column R^2 median {float(r2.median()):.3f} (max "
          f"{float(r2.max()):.3f}), monitor rows {float(r2_mon.median()):.3f} (max {float(r2_mon.max()):.3f}); "
          f"regression on own columns and f {float(baseline.median()):.3f}, monitor rows "
          f"{float(baseline_mon.median()):.3f}")
    return {"pv": pv, "protocol": protocol, "r2": r2, "baseline": baseline, "residual": residual,
            "at_truth": at_truth, "r2_mon": r2_mon, "baseline_mon": baseline_mon}


def test_the_default_defeats_the_pooled_attack(pooled):
    assert pooled["protocol"] == "sealed"
    assert pooled["pv"]["steps"] == []                       # no gradient sum was opened
    # The attacker's equations are the protocol's up to its fixed point (cosines rounded to 6 fractional bits on both
    # sides; the residual is the sum of the relative residuals of the training f values, the opened alpha, the
    # monitor f values and the candidates': measured 7.0e-4 on breast cancer with the selection (1.9-2.8e-4
    # without) and 0.072-0.111 on credit_default, whose f are small; at the small-data defaults since issue 40
    # (16 epochs, lambda = D / (30 n)) 4.9e-3 and 0.20-0.26. It grows with the steps, not with lambda: on
    # credit_default 0.084 at 4 epochs, 0.94-1.18 at 16 epochs with lambda = 1e-5, rms f 4.5-5.1 in all; the cosines'
    # rounding, which depends on masks A does not know, enters every modelled coefficient, whose weights grow with the
    # steps while f stays bounded, and the decay keeps them down. The protocol's rounded step and decay constants in
    # place of the nominal ones change nothing: 0.2598 / 0.2596)
    assert pooled["at_truth"] < 0.35
    # ... and its solve fits them worse than the truth does (measured 2.5e-3 and 0.314-0.330)
    assert pooled["residual"] > pooled["at_truth"]
    r2, baseline = pooled["r2"], pooled["baseline"]
    assert float(r2.median()) <= float(baseline.median()) + 0.05, (r2, baseline)
    # the monitor rows (f opened at every epoch end) give nothing beyond their own columns and those f values either
    assert pooled["pv"]["monitor"]                           # (they were pooled)
    r2_mon, baseline_mon = pooled["r2_mon"], pooled["baseline_mon"]
    assert float(r2_mon.median()) <= float(baseline_mon.median()) + 0.05, (r2_mon, baseline_mon)


def refused_job(fed):
    data = load_party_data(fed, DataConfig(dataset="pima", scale="minmax", seed=0)) if fed.is_data_party else None
    est = FDSKLClassifier(fed)
    return est.fit(None) if data is None else est.fit(data.X_train, data.y_train, columns=data.columns)


def test_the_default_refuses_pima_at_two_parties():
    skip_without("pima")
    with pytest.raises(FederationError, match="n_components <= 1152"):
        launch(refused_job, 2, coordinator=True)
