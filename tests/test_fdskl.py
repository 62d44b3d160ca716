"""FDSKL across real party processes: Lemma 1 (federated == centralised), privacy of the transcript, bad input."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from vfltorch.cli import main
from vfltorch.comm import Federation, FederationError, launch, masked_sum_leakage, totally_different_trees
from vfltorch.data import DataConfig, VFLInputError, load_party_data
from vfltorch.kernels import FDSKLClassifier, FDSKLRegressor, ScalingWarning

from conftest import as_torch, needs_dataset

# The paper's protocol with mask_seed="seed": masks and phases derived from the public seed, so Q parties
# reproduce Q = 1 exactly (the default protocol is tested in test_fdskl_attack.py).
SMALL = dict(n_components=None, batch_size=64, features_per_step=16, epochs=2, random_state=3, mask_seed="seed", protocol="paper")
VARIANTS = {
    "cached64": dict(SMALL, angle_bits=64),
    "paper32_laplace_hinge": dict(SMALL, angle_bits=32, schedule="paper", kernel="laplace", loss="smooth_hinge"),
    "regressor": dict(SMALL, angle_bits=64, regressor=True),
    "default16": dict(SMALL),                           # the default: 16-bit angles
    "prefetch64": dict(SMALL, angle_bits=64, prefetch=5),   # 5 iterations' features per round of masked sums
}
# Lemma 1 holds to the rounding of each party's part on the angle grid (2 pi / 2**bits): tolerance on alpha.
ALPHA_TOL = {"cached64": 1e-9, "prefetch64": 1e-9, "regressor": 1e-9, "paper32_laplace_hinge": 1e-6, "default16": 1e-4}


def load(fed, partition="contiguous"):
    return load_party_data(fed, DataConfig(dataset="breast_cancer", scale="minmax", seed=0, partition=partition))


def fit_variants(fed, data, variants):
    out = {}
    for name, kw in variants.items():
        kw = dict(kw)
        Est = FDSKLRegressor if kw.pop("regressor", False) else FDSKLClassifier
        est = Est(fed, **kw).fit(data.X_train, data.y_train, columns=data.columns,
                                 monitor=(data.X_test, data.y_test))
        out[name] = {"alpha": as_torch(est.alpha_), "f": est.decision_function(data.X_test), "n_iter": est.n_iter_,
                     "sigma": est.sigma_, "keepers": list(est.feature_map_.keepers), "comm": est.comm_,
                     "history": est.history_, "score": est.score(data.X_test, data.y_test)}
    return out


def lemma1_job(fed, partition, names):
    return fit_variants(fed, load(fed, partition), {k: VARIANTS[k] for k in names})


def reference(partition, names):
    return lemma1_job(Federation.local(), partition, names)


def check_lemma1(fed_out, ref, names):
    for name in names:
        got, want = fed_out[name], ref[name]
        tol = dict(rtol=0, atol=ALPHA_TOL[name])
        assert got["n_iter"] == want["n_iter"] and got["sigma"] == pytest.approx(want["sigma"], rel=1e-12)
        assert got["alpha"].shape == want["alpha"].shape
        torch.testing.assert_close(got["alpha"], want["alpha"], **tol)
        np.testing.assert_allclose(got["f"], want["f"], rtol=0, atol=100 * tol["atol"])
        # Same predictions (no test row sits within rounding distance of the boundary).
        assert np.array_equal(np.sign(np.asarray(got["f"])), np.sign(np.asarray(want["f"]))) or name == "regressor"
        assert got["score"] == pytest.approx(want["score"], abs=1e-6)
        assert got["comm"]["bytes_per_iteration"] > 0


# ---------------------------------------------------------------------------------------------- Q = 4
def privacy_job(fed):
    """Lemma 1 variants, then a cached fit whose transcript is checked inside the party that sent it."""
    data = load(fed)
    out = fit_variants(fed, data, VARIANTS)
    start = len(fed.transcript.messages)
    est = FDSKLClassifier(fed, **SMALL).fit(data.X_train, data.y_train,             # default 16-bit angles
                                           monitor=(data.X_test, data.y_test))
    est.decision_function(data.X_test)
    sent = fed.transcript.messages[start:]
    fmap = est.feature_map_
    circle = fmap.circle
    omega = fmap.omega
    raw = torch.cat([data.X_train, data.X_test])                              # candidates, by row count
    candidates = {
        data.n_train: (data.X_train, data.X_train @ omega, circle.encode(data.X_train @ omega)),
        data.n_test: (data.X_test, data.X_test @ omega, circle.encode(data.X_test @ omega)),
    }
    matches, turns, angle_messages = 0, [], 0
    for m in sent:
        t = m.tensor
        if t.dtype == circle.dtype and m.phase.split("/")[1] in ("train", "predict", "monitor"):
            angle_messages += 1
            turns.append(circle.decode(t.reshape(-1)) / (2 * math.pi) + 0.5)
        if t.dtype == torch.uint8:
            continue                                                          # JSON: counts and verdicts
        flat = t.reshape(-1)
        for rows, (X, Z, E) in candidates.items():
            if flat.numel() % rows or flat.numel() == 0:
                continue
            M = flat.reshape(rows, -1)
            for j in range(M.shape[1]):
                col = M[:, j]
                if col.dtype == circle.dtype:
                    matches += int((E == col.unsqueeze(1)).all(0).sum())      # an unmasked encoded projection
                colf = col.to(torch.float64)
                matches += int(((X - colf.unsqueeze(1)).abs().max(0).values < 1e-9).sum())   # a raw column
                matches += int(((Z - colf.unsqueeze(1)).abs().max(0).values < 1e-9).sum())   # a raw projection
        if flat.numel() == raw.shape[0] and torch.allclose(flat.to(torch.float64), raw[:, 0]):
            matches += 1
    turns = torch.cat(turns) if turns else torch.zeros(0)
    # Masks cancel exactly: the active party's phases are sum of the parties' encoded parts + the kept phase.
    theta = fmap.phases(data.X_test, range(fmap.n_blocks))
    own = circle.encode(data.X_test @ omega)
    out["privacy"] = {"matches": matches, "angle_messages": angle_messages,
                      "turns": turns[torch.randperm(len(turns), generator=torch.Generator().manual_seed(0))[:50_000]],
                      "theta": theta, "own": own, "phase_words": dict(fmap.phase_words),
                      "keepers": list(fmap.keepers), "block": fmap.block_size}
    return out


@pytest.fixture(scope="module")
def q4():
    return launch(privacy_job, 4, record_transcript=True)


def test_lemma1_four_parties_equal_one_party(q4):
    names = list(VARIANTS)
    check_lemma1(q4[0], reference("contiguous", names), names)
    for r in (1, 2, 3):
        assert all(q4[r][n]["alpha"] is None and q4[r][n]["f"] is None for n in names)   # model privacy
        assert all(q4[r][n]["keepers"] == q4[0][n]["keepers"] for n in names)
    # Prefetching changes when the phases cross the wire, not what crosses it or what is computed.
    torch.testing.assert_close(q4[0]["prefetch64"]["alpha"], q4[0]["cached64"]["alpha"], rtol=0, atol=1e-9)
    assert q4[0]["prefetch64"]["comm"]["bytes_per_iteration"] == q4[0]["cached64"]["comm"]["bytes_per_iteration"]
    assert [p["test_accuracy"] for p in q4[0]["prefetch64"]["history"]] == [
        p["test_accuracy"] for p in q4[0]["cached64"]["history"]]
    assert 0 not in q4[0]["cached64"]["keepers"]          # the active party never keeps a phase
    assert len(set(q4[0]["cached64"]["keepers"])) > 1     # kept parties vary by block


def test_masks_cancel_exactly(q4):
    p = q4[0]["privacy"]
    expected = torch.stack([q4[r]["privacy"]["own"].to(torch.int64) for r in range(4)]).sum(0)
    r = p["block"]
    for t, keeper in enumerate(p["keepers"]):
        expected[:, t * r:(t + 1) * r] += q4[keeper]["privacy"]["phase_words"][t].to(torch.int64)
    expected = expected.to(p["theta"].dtype)              # keeps the low bits: the sum mod 2**bits
    assert p["theta"].dtype == torch.int16                # the default angle width
    assert torch.equal(p["theta"], expected)
    for r_ in (1, 2, 3):
        assert q4[r_]["privacy"]["theta"] is None


def test_masked_values_are_uniform_and_nothing_raw_leaves_a_party(q4):
    for r in range(4):
        p = q4[r]["privacy"]
        assert p["matches"] == 0, f"party {r} sent a raw column or an unmasked projection"
        assert p["angle_messages"] > 10 and len(p["turns"]) > 5_000
        assert kstest(p["turns"].numpy(), "uniform").pvalue > 1e-3, f"party {r}'s masked phases are not uniform"


def test_trees_are_totally_different_and_leak_nothing():
    for q in (2, 3, 4, 7):
        for keep in range(1, q):
            t1, t2 = totally_different_trees(list(range(q)), keep)
            assert set(masked_sum_leakage(t1, t2, keep, 0).values()) == {0}


def test_learning_curve_and_bytes(q4):
    hist = q4[0]["cached64"]["history"]
    assert hist and hist[-1]["iteration"] == q4[0]["cached64"]["n_iter"]
    assert all(a["bytes"] < b["bytes"] for a, b in zip(hist, hist[1:]))
    assert hist[-1]["test_accuracy"] == pytest.approx(q4[0]["cached64"]["score"], abs=1e-9)
    # Cached schedule: the same bytes every iteration; paper schedule: more every iteration (O(t)).
    for name, growing in (("cached64", False), ("paper32_laplace_hinge", True)):
        h = q4[0][name]["history"]
        per = np.diff([p["bytes"] for p in h]) / np.diff([p["iteration"] for p in h])
        assert (np.all(np.diff(per) > 0) if growing else np.allclose(per, per[0])), (name, per)
    # Exactly the analysis: (2Q - 2) messages of n x r angles of 8 bytes per iteration (Q = 4, n = 427, r = 16).
    assert q4[0]["cached64"]["comm"]["bytes_per_iteration"] == 8 * 6 * 427 * 16
    n_iter = q4[0]["paper32_laplace_hinge"]["n_iter"]
    paper_total = sum(4 * 6 * 64 * 16 * (t + 1) for t in range(n_iter))
    assert q4[0]["paper32_laplace_hinge"]["comm"]["bytes_per_iteration"] == paper_total / n_iter


# ------------------------------------------------------------------------------------------- Q = 2, 3
def two_party_job(fed):
    data = load(fed)
    out = {"lemma1": fit_variants(fed, data, {"cached64": VARIANTS["cached64"]})}
    budget = FDSKLClassifier(fed, **dict(SMALL, epochs=None, max_time=0.2, batch_size=16)).fit(
        data.X_train, data.y_train)
    out["budget_iters"] = budget.n_iter_
    errors = {}

    def attempt(name, fn):
        try:
            fn()
            errors[name] = None
        except VFLInputError as exc:
            errors[name] = str(exc)

    passive = fed.rank == 1
    X0 = data.X_train[:, :0] if passive else data.X_train
    attempt("zero_columns", lambda: FDSKLClassifier(fed, **SMALL).fit(X0, data.y_train))
    y1 = None if data.y_train is None else torch.ones_like(data.y_train)       # any two labels work; one does not
    attempt("one_class", lambda: FDSKLClassifier(fed, **SMALL).fit(data.X_train, y1))
    attempt("hyper", lambda: FDSKLClassifier(fed, **dict(SMALL, gamma=1.0 + fed.rank)).fit(data.X_train,
                                                                                           data.y_train))
    y_everywhere = torch.ones(data.n_train)
    attempt("passive_labels", lambda: FDSKLClassifier(fed, **SMALL).fit(
        data.X_train, data.y_train if fed.is_active else y_everywhere))
    est = FDSKLClassifier(fed, **SMALL).fit(data.X_train, data.y_train)
    attempt("predict_rows", lambda: est.decision_function(data.X_test[: 10 + fed.rank]))
    out["errors"] = errors
    return out


def test_two_parties_lemma1_time_budget_and_bad_input():
    res = launch(two_party_job, 2)
    check_lemma1(res[0]["lemma1"], reference("contiguous", ["cached64"]), ["cached64"])
    # The time budget stops every party at the same iteration.
    assert res[0]["budget_iters"] == res[1]["budget_iters"] > 0
    e = res[0]["errors"]
    assert e == res[1]["errors"]                          # every party raises the same message
    assert "party 1 (passive) has no columns" in e["zero_columns"]
    assert "only one class [1.0]" in e["one_class"]
    assert "different hyperparameters" in e["hyper"]
    assert "only the active party may hold them" in e["passive_labels"]
    assert "different numbers of rows" in e["predict_rows"]


def test_three_parties_random_partition_lemma1():
    names = ["cached64"]
    res = launch(lemma1_job, 3, args=("random", names))
    check_lemma1(res[0], reference("random", names), names)


# ------------------------------------------------------------------------------------ bad input, Q = 1
def bc():
    return load(Federation.local())


@pytest.mark.parametrize("kw,message", [
    (dict(sigma=0.0), "sigma must be > 0"),
    (dict(sigma=-1.0), "sigma must be > 0"),
    (dict(gamma=10.0, lam=0.2), "gamma * lambda = 10 * 0.2 = 2 must be < 1"),
    (dict(loss="logistic", regressor=True), "not regression: use square"),
    (dict(epochs=None), "give a number of epochs, a time budget"),
    (dict(batch_size=0), "batch_size must be a positive integer"),
])
def test_bad_hyperparameters_get_clear_messages(kw, message):
    data = bc()
    Est = FDSKLRegressor if kw.pop("regressor", False) else FDSKLClassifier
    with pytest.raises(VFLInputError, match=re.escape(message)):
        Est(**kw).fit(data.X_train, data.y_train)


def test_labels_and_scaling_are_checked():
    data = bc()
    with pytest.raises(VFLInputError, match=re.escape("only one class [1.0]")):     # any two labels are fine
        FDSKLClassifier(**SMALL).fit(data.X_train, torch.ones_like(data.y_train))
    raw = load_party_data(Federation.local(), DataConfig(dataset="breast_cancer", scale="none", seed=0))
    with pytest.warns(ScalingWarning, match="--scale minmax"):
        FDSKLClassifier(**dict(SMALL, epochs=0.2)).fit(raw.X_train, raw.y_train)
    with pytest.raises(VFLInputError, match="not fitted yet"):
        FDSKLClassifier().predict(data.X_test)


def test_centralised_baseline_learns_and_is_sklearn_style():
    from sklearn.base import clone

    data = bc()
    clf = FDSKLClassifier(batch_size=32, epochs=5)
    assert clone(clf).get_params()["batch_size"] == 32
    clf.fit(data.X_train.numpy(), data.y_train.numpy())
    pred = clf.predict(data.X_test.numpy())
    assert isinstance(pred, np.ndarray) and set(np.unique(pred)) <= {-1.0, 1.0}
    assert clf.score(data.X_test.numpy(), data.y_test.numpy()) > 0.94
    assert as_torch(clf.alpha_).shape == (clf.n_random_features_,) and clf.n_iter_ == math.ceil(5 * 427 / 32)
    # float32 inputs stay float32; predictions agree with float64 almost everywhere.
    clf32 = FDSKLClassifier(batch_size=32, epochs=5).fit(data.X_train.float(), data.y_train)
    f32 = clf32.decision_function(data.X_test.float())
    assert f32.dtype == torch.float32
    assert (torch.sign(f32) == torch.as_tensor(np.sign(clf.decision_function(data.X_test.numpy())))).float().mean() > 0.98
    reg = FDSKLRegressor(batch_size=32, epochs=5).fit(data.X_train, data.X_train[:, 0] * 3 + 1)
    assert reg.score(data.X_test, data.X_test[:, 0] * 3 + 1) > 0.9


# -------------------------------------------------------------------------------------------------- CLI
def test_vfl_fdskl_demo_writes_the_record(tmp_path):
    out = tmp_path / "bc.json"
    r = subprocess.run([sys.executable, "-m", "vfltorch", "fdskl", "--dataset", "breast_cancer", "--parties", "3",
                        "--output-json", str(out), "--logdir", str(tmp_path / "tb")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "test_accuracy=" in r.stdout
    rec = json.loads(out.read_text())
    assert rec["metrics"]["test_accuracy"] > 0.94
    # The bounded model (default): D = 1536 features whatever the number of iterations (B = 32 here),
    # under the sealed protocol, with its held-out curve.
    assert rec["fdskl"]["protocol"] == "sealed" and rec["fdskl"]["random_features"] == 1536
    assert any("test_accuracy" in p for p in rec["fdskl"]["history"])
    # under 5,000 rows 16 epochs and lambda = D / (30 n) (small_data.py)
    assert rec["fdskl"]["iterations"] == math.ceil(16 * 427 / 32)
    assert rec["fdskl"]["epochs"] == 16 and rec["fdskl"]["lam"] == pytest.approx(1536 / (30 * 427))
    assert all(rec["comm"][str(p)]["bytes_sent"] > 0 for p in range(3))
    assert any((tmp_path / "tb").iterdir())


@pytest.mark.parametrize("args,message", [
    (["--sigma", "-2"], "sigma must be > 0"),
    (["--gamma", "100", "--lam", "0.1"], "must be < 1"),
    (["--sigma", "wide"], "--sigma takes a positive number or 'median'"),
])
def test_vfl_fdskl_bad_options(args, message, capsys):
    with pytest.raises(SystemExit) if "wide" in args else _no_raise():
        code = main(["fdskl", "--parties", "1", "--quiet", *args])
        assert code == 2
    assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@needs_dataset("vehicle")
def test_vfl_fdskl_one_vs_rest_on_a_multiclass_dataset(tmp_path):
    # Vehicle: 4 classes; one binary model per class, the largest decision value wins (chance: 26%).
    out = tmp_path / "vehicle.json"
    assert main(["fdskl", "--dataset", "vehicle", "--parties", "1", "--quiet", "--epochs", "3",
                 "--output-json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["task"] == "multiclass" and rec["metrics"]["test_accuracy"] > 0.6


@needs_dataset("abalone")
def test_vfl_fdskl_regression_under_the_default_protocol(tmp_path):
    # The dealer builds the active party's estimator (a regressor here: no class count to agree on).
    out = tmp_path / "abalone.json"
    assert main(["fdskl", "--dataset", "abalone", "--parties", "2", "--quiet", "--epochs", "1",
                 "--n-components", "64", "--output-json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["task"] == "regression" and rec["fdskl"]["protocol"] == "sealed"
    assert rec["metrics"]["test_r2"] > 0.3 and rec["fdskl"]["sigma_multiplier"] == 1.0   # 3,133 rows: no selection


def a9a_job(fed):
    if fed.is_coordinator:                  # the shared protocol's dealer: no data, takes part in fit and scoring
        clf = FDSKLClassifier(fed).fit(None)
        clf.decision_function()
        return None
    data = load_party_data(fed, DataConfig(dataset="a9a", scale="minmax", dtype="float32"))
    clf = FDSKLClassifier(fed).fit(data.X_train, data.y_train, columns=data.columns)
    return clf.score(data.X_test, data.y_test)


@pytest.mark.slow
@needs_dataset("a9a")
def test_a9a_four_parties_reach_svc_accuracy():
    # scikit-learn SVC (RBF, gamma='scale', C=1) reaches 85.06% on this split; the target is within 0.5 points.
    assert launch(a9a_job, 4, coordinator=True, timeout=600)[0] >= 0.8506 - 0.005


def test_default_masks_and_phases_are_private_to_each_party():
    """By default each party draws its masks and phases from the OS: nobody can recompute them from --seed."""
    fed = Federation.local()
    draws = {FDSKLClassifier()._seeds(fed) for _ in range(3)}
    assert len(draws) == 3
    assert FDSKLClassifier(mask_seed="seed")._seeds(fed) == FDSKLClassifier(mask_seed="seed")._seeds(fed)
    assert FDSKLClassifier(mask_seed=7)._seeds(fed) == FDSKLClassifier(mask_seed=7)._seeds(fed)
    data = bc()
    with pytest.raises(VFLInputError, match="mask_seed must be 'random'"):
        FDSKLClassifier(mask_seed="secret").fit(data.X_train, data.y_train)
