"""FDSKL's compressed model with the public support (compress.py), and prediction's narrow rings (issue 16).

* federated == centralised for the public-support student under the shared protocol and the paper's
  (breast cancer, Q = 3 + the dealer): the same support at every rank, drawn from the public seed with
  no message, alpha and f as the centralised twin's;
* the support carries nothing label-dependent: two label vectors give the same public support, while
  the |alpha| support (``compress_support='alpha'``, kept selectable) lets a passive party tell them
  apart from the support alone;
* prediction bytes equal the formula at each ring width (20, 24, 32 bits), and f at each width is the
  32-bit f to its rounding;
* a compressed model saved by ``vfl fdskl --save-model`` scores the same in fresh processes with
  ``vfl predict``;
* ``compress_to='if-faithful'`` (the default; ``'if-faithful:N'`` here, as the data are small): the active party's
  keep-or-not decision on the check rows equals the centralised twin's, its one bit reaches every rank (the dealer
  too), a student of 96 of 128 features is kept and one of 8 is not (the teacher predicts); both outcomes survive
  ``vfl fdskl --save-model`` / ``vfl predict``.
"""

import json
import warnings

import numpy as np
import pytest
import torch

from vfltorch.comm import Federation, launch
from vfltorch.data import DataConfig, load_party_data
from vfltorch.kernels import FDSKLClassifier
from vfltorch.kernels.compress import CHECK_ROWS, compress_rows, public_support
from vfltorch.kernels.estimator import LeakWarning
from vfltorch.kernels.random_features import derive_key
from vfltorch.kernels.trainer import phase_totals
from conftest import as_torch

# Prune 128 features to 48 (a public subset) and distil; both training products in Z_2^32 so that the twin is close.
PUBLIC = dict(protocol="shared", batch_size=32, epochs=2, random_state=3, n_components=128, features_per_step=16, compress_to=48,
              product_bits=32)
WIDTHS = (32, 24, 20)
# compress_to='if-faithful:N': a faithful student (96 of 128 features) and an unfaithful one (8 features).
FAITHFUL = dict(PUBLIC, compress_to=None)
OUTCOMES = {"if-faithful:96": "student", "if-faithful:8": "teacher"}


def bc(fed):
    return load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0))


def arr(x):
    return torch.as_tensor(x).detach().cpu().double().numpy()


def _support_leaks(caught) -> bool:
    return any(issubclass(w.category, LeakWarning) and "compress_support" in str(w.message) for w in caught)


def job(fed):
    warnings.simplefilter("ignore")
    data = bc(fed) if fed.is_data_party else None
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _public_runs(fed, data, out)
    out["public_warned"] = _support_leaks(caught)
    for value in OUTCOMES:                     # the checked default, shared protocol
        est = FDSKLClassifier(fed, **dict(FAITHFUL, compress_to=value))
        est.fit(None) if data is None else est.fit(data.X_train, data.y_train, columns=data.columns)
        out[value] = {"support": as_torch(est.support_), "alpha": as_torch(est.alpha_), "info": est.compress_,
                      "f": est.decision_function(None if data is None else data.X_test)}
    # The |alpha| support under the paper's protocol (the dealer sits it out): the LeakWarning at the active party.
    if data is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            FDSKLClassifier(fed, mask_seed="seed", compress_support="alpha",
                            **dict(PUBLIC, protocol="paper", epochs=0.3, compress_epochs=0.0)).fit(
                data.X_train, data.y_train, columns=data.columns)
        out["alpha_warned"] = _support_leaks(caught)
    return out


def _public_runs(fed, data, out):
    for protocol in ("shared", "paper"):
        if fed.is_coordinator and protocol == "paper":
            continue
        est = FDSKLClassifier(fed, mask_seed="seed" if protocol == "paper" else "random", **dict(PUBLIC, protocol=protocol))
        est.fit(None) if data is None else est.fit(data.X_train, data.y_train, columns=data.columns)
        rec = {"support": as_torch(est.support_), "alpha": as_torch(est.alpha_), "info": est.compress_}
        for bits in (WIDTHS if protocol == "shared" else (32,)):
            est.set_params(predict_bits=bits)
            before = phase_totals(fed, "fdskl/predict")["bytes_sent"]
            f = est.decision_function(None if data is None else data.X_test)
            rec[bits] = {"f": f, "bytes": phase_totals(fed, "fdskl/predict")["bytes_sent"] - before}
        if data is not None:
            rec["rows"] = int(data.X_test.shape[0])
        out[protocol] = rec


@pytest.fixture(scope="module")
def runs():
    return launch(job, 3, coordinator=True)


@pytest.fixture(scope="module")
def twin():
    data = bc(Federation.local())
    return FDSKLClassifier(**PUBLIC).fit(data.X_train, data.y_train), data


def test_public_support_student_equals_its_centralised_twin(runs, twin):
    ref, data = twin
    expected = public_support(128, 48, derive_key(PUBLIC["random_state"], 0xC0DE5))
    torch.testing.assert_close(as_torch(ref.support_), expected)
    f_ref = arr(ref.decision_function(data.X_test))
    assert np.mean(np.where(f_ref >= 0, 1, -1) == data.y_test.numpy()) > 0.9
    for protocol in ("shared", "paper"):
        ranks = runs if protocol == "shared" else runs[:3]
        for r in ranks:                                   # every rank, the dealer included, holds the same support
            torch.testing.assert_close(r[protocol]["support"], expected)
        got = runs[0][protocol]
        assert got["info"]["features"] == 48 and got["info"]["refit_iterations"] == ref.compress_["refit_iterations"]
        off = torch.ones(128, dtype=torch.bool)
        off[expected] = False
        assert float(got["alpha"][off].abs().max()) == 0.0
        assert all(r[protocol]["alpha"] is None and r[protocol][32]["f"] is None for r in ranks[1:])
        # 16-bit angles (and under shared the products' fixed point, training's in Z_2^32 here).
        scale = float(as_torch(ref.alpha_).abs().max())
        torch.testing.assert_close(got["alpha"].double(), as_torch(ref.alpha_).double(), rtol=0, atol=5e-3 * scale)
        np.testing.assert_allclose(arr(got[32]["f"]), f_ref, rtol=0, atol=1e-2 * np.abs(f_ref).max())


@pytest.fixture(scope="module")
def faithful_twins():
    data = bc(Federation.local())
    return {value: FDSKLClassifier(**dict(FAITHFUL, compress_to=value)).fit(data.X_train, data.y_train)
            for value in OUTCOMES}, data


def test_if_faithful_decision_equals_its_centralised_twin_and_reaches_every_rank(runs, faithful_twins):
    """Q = 3 + the dealer, shared protocol: the same decision as centralised, held by every rank (the dealer
    too); the kept student predicts on its public support, the rejected one leaves the teacher's D features."""
    twins, data = faithful_twins
    n = data.X_train.shape[0]
    check, _ = compress_rows(n, derive_key(FAITHFUL["random_state"], 0xC4EC))
    assert len(check) == min(n, CHECK_ROWS)
    for value, outcome in OUTCOMES.items():
        ref = twins[value]
        assert ref.compress_["decision"] == outcome, (value, ref.compress_)
        keep = int(value.split(":")[1])
        support = public_support(128, keep, derive_key(FAITHFUL["random_state"], 0xC0DE5))
        for r in runs:                                   # both parties, the dealer: the one bit and its consequence
            assert r[value]["info"]["decision"] == outcome
            assert r[value]["info"]["features"] == (keep if outcome == "student" else 128)
            if outcome == "student":
                torch.testing.assert_close(r[value]["support"], support)
            else:
                assert r[value]["support"] is None
        assert all("check" not in r[value]["info"] for r in runs[1:])        # the figures stay at the active party
        got = runs[0][value]
        mine, theirs = got["info"]["check"], ref.compress_["check"]
        assert mine["rows"] == theirs["rows"] == len(check)
        assert abs(mine["student_accuracy"] - theirs["student_accuracy"]) <= 100.0 / n + 1e-9
        assert abs(mine["student_loss"] / theirs["student_loss"] - 1) < 0.02
        scale = float(as_torch(ref.alpha_).abs().max())
        torch.testing.assert_close(got["alpha"].double(), as_torch(ref.alpha_).double(), rtol=0, atol=5e-3 * scale)
        f_ref = arr(ref.decision_function(data.X_test))
        np.testing.assert_allclose(arr(got["f"]), f_ref, rtol=0, atol=1e-2 * np.abs(f_ref).max())
    # The decision is the check's: the 8-feature student is clearly worse on the check rows, the 96-feature one not.
    bad, good = twins["if-faithful:8"].compress_["check"], twins["if-faithful:96"].compress_["check"]
    assert bad["student_loss"] > 1.1 * bad["teacher_loss"] and good["student_loss"] <= 1.1 * good["teacher_loss"]


def test_prediction_bytes_follow_the_formula_at_each_ring_width(runs):
    """Scoring m rows on D' features under shared: the phase star 2 (Q - 1) m D', the product's words
    (2 m D' of 4, 3 or 2.5 bytes), the dealer's corrections and the opening (m words each; at 32 bits the
    corrections are int64: 12 m in all) and 128-bit seeds (32 Q - 16); f at each width is f in Z_2^32 to the
    ring's rounding, and no row's sign changes here."""
    Q, Dp = 3, PUBLIC["compress_to"]
    got = runs[0]["shared"]
    m = got["rows"]
    product = {32: 8 * m * Dp + 12 * m, 24: 6 * m * Dp + 6 * m, 20: 5 * m * Dp + 2 * (2 * m + (m + 1) // 2)}
    f32 = arr(got[32]["f"])
    for bits in WIDTHS:
        total = sum(r["shared"][bits]["bytes"] for r in runs)
        expected = 2 * (Q - 1) * m * Dp + product[bits] + 32 * Q - 16
        assert 0 <= total - expected < 1000, (bits, total, expected)
        f = arr(got[bits]["f"])
        # Measured here: max error / max |f| 1.0e-3 at 24 bits, 5.9e-3 at 20 (on the shared sets with D' = 496 to
        # 1536 features, benchmarks/fdskl_compress.py: 2e-3 to 5e-3 at 24 bits, 1e-2 to 2e-2 at 20).
        assert np.abs(f - f32).max() <= {32: 0.0, 24: 4e-3, 20: 2e-2}[bits] * np.abs(f32).max(), bits
        assert np.mean(np.sign(f) == np.sign(f32)) > 0.98
    assert sum(r["shared"][24]["bytes"] for r in runs) < sum(r["shared"][32]["bytes"] for r in runs)


def test_the_public_support_does_not_depend_on_the_labels():
    """The adversary: a passive party that knows two candidate label vectors and sees the support. Under the |alpha|
    support it tells them apart (the support moves with the labels); under the public support it sees the same
    indices whatever the labels."""
    data = bc(Federation.local())
    X, y = data.X_train, data.y_train.numpy()
    rng = np.random.default_rng(1)
    other = np.where(X[:, 3].numpy() > np.median(X[:, 3].numpy()), 1.0, -1.0)   # another labelling of the rows
    other[rng.random(len(other)) < 0.1] *= -1
    small = dict(PUBLIC, epochs=1, compress_epochs=0.2)
    public = [FDSKLClassifier(**small).fit(X, labels).support_ for labels in (y, other)]
    torch.testing.assert_close(public[0], public[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        # (the support is chosen before the distillation: no pass needed to see it)
        alpha = [FDSKLClassifier(compress_support="alpha", **dict(small, compress_epochs=0.0)).fit(X, labels)
                 for labels in (y, other)]
    supports = [set(as_torch(a.support_).tolist()) for a in alpha]
    assert len(supports[0] ^ supports[1]) >= 10
    # The distinguisher: which candidate's |alpha| ranking does the observed support match best?
    for observed in (0, 1):
        overlaps = [len(supports[observed] & set(torch.topk(as_torch(a.alpha_).abs(), 48).indices.tolist()))
                    for a in alpha]
        assert int(np.argmax(overlaps)) == observed


def test_one_vs_rest_classes_share_the_public_support():
    """Every class's model keeps the same public features, so prediction evaluates D' features for all classes
    (with the |alpha| support, the union of the classes' supports: here more than D')."""
    from test_fdskl_bounded import WINE, wine

    Xtr, ytr, Xte, yte = wine()
    # (lambda as measured when the 0.85 was set: the small-data default's 0.023 gives 0.84-0.91 over random_state 0-3
    # against 0.86-0.93, one or two of the 44 test rows)
    kw = dict(WINE, compress_to=32, compress_epochs=0.5, lam=1e-5)
    public = FDSKLClassifier(**kw).fit(Xtr, ytr)
    assert len(public.estimators_) == 3 and as_torch(public.support_).shape == (32,)
    for e in public.estimators_:
        torch.testing.assert_close(as_torch(e.support_), as_torch(public.support_))
    assert public.score(Xte, yte) > 0.85
    alpha = FDSKLClassifier(compress_support="alpha", **dict(kw, compress_epochs=0.0)).fit(Xtr, ytr)
    assert len(as_torch(alpha.support_)) > 32


def test_alpha_support_warns_in_a_federation(runs):
    """compress_support='alpha' (kept selectable) warns at the active party, naming the leak; 'public' does not."""
    assert runs[0]["alpha_warned"] is True and runs[0]["public_warned"] is False
    assert runs[1]["alpha_warned"] is False        # passive parties: nothing to warn about (they are the observers)


# The student (the default's usual outcome) in the default run; the teacher kept (the fallback) with the slow tests.
# (both slow since 2026-11-29: 9 s of CLI runs; the default run keeps the in-process compression tests and FDSKL's
# save / predict in fresh processes, tests/test_model_store.py)
@pytest.mark.parametrize("compress_to,outcome", [pytest.param("if-faithful:112", "student", marks=pytest.mark.slow),
                                                 pytest.param("if-faithful:8", "teacher", marks=pytest.mark.slow)])
def test_compressed_model_round_trips_through_vfl_predict(tmp_path, compress_to, outcome):
    """`vfl fdskl --compress-to` (public support; the checked default's two outcomes: at one epoch the 112-feature
    student is within the tolerances on the check rows, the 8-feature one not) with --save-model, then
    `vfl predict` in fresh processes."""
    from test_model_store import _round_trip
    from vfltorch.model_store import read_shard

    model, lines = _round_trip(tmp_path, "compressed",
                               ["fdskl", "--parties", "2", "--epochs", "1", "--n-components", "128",
                                "--features-per-step", "16", "--compress-to", compress_to, "--product-bits", "32"],
                               [])
    keep = int(compress_to.split(":")[-1])
    expected = public_support(128, keep, derive_key(0, 0xC0DE5)).tolist() if outcome == "student" else None
    for rank in range(3):                                 # both parties and the dealer
        manifest = read_shard(model, rank)[0]
        assert manifest["state"].get("support") == expected
        assert manifest["hyperparameters"]["compress_support"] == "public"
        assert manifest["hyperparameters"]["compress_to"] == (int(compress_to) if compress_to.isdigit() else compress_to)
        assert manifest["hyperparameters"]["predict_bits"] == 24
    record = json.loads((tmp_path / "compressed.json").read_text())
    assert record["fdskl"]["compress"]["decision"] == outcome
    trained = record["metrics"]
    scored = json.loads((tmp_path / "compressed-predict.json").read_text())["metrics"]
    assert trained["test_accuracy"] > 0.9
    # The default Z_2^24 ring: two scorings with fresh masks agree to its rounding (about 1e-3 of max |f|), so
    # at most a row near f = 0 (1 / 142) may change class and a pair near each other may swap in the AUC.
    assert abs(scored["test_accuracy"] - trained["test_accuracy"]) <= 1 / 142 + 1e-12
    assert abs(scored["test_auc"] - trained["test_auc"]) < 2e-3
