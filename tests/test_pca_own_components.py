"""Issue 39: exact federated PCA (covariance protocol) gives each data party its own components and no other's.

Until issue 39 the coordinator sent the whole (d + 1) x k block [W; theta / s^2] to every data party, and every
data party knew the rotation P, so each computed V = P^T W for all d columns. With another party's rows V_m and
the scores X V = U sqrt(theta) (an output), a party rebuilds m's centred columns at rank k, X_m ~ (X V) V_m^T, and
its covariance block V_m Theta V_m^T.

The adversary here is each data party in turn: it pools every tensor it received during a real multi-process
fit (the transcripts), every seed among them (expanded as the protocol's own code expands seeds), the rotation
P when it is a holder, its own columns and its output (U, theta, V_l), and tries to rebuild each other party's
columns and covariance block. breast_cancer, columns standardised, 3 parties of 10 columns, k = 3, both
covariance-sharing modes.

* The old protocol's broadcast is rebuilt from this very run: the coordinator's W (recorded as it enters
  ``open_own_rows``) and the holders' P; against it the attack reads the other parties' columns (the attack is
  real: per-column R^2 median above 0.5).
* Against the new messages every reading of every received tensor (floats as W or V, 64-bit words at the
  protocol's fractional bits, 128-bit words alone or unmasked by every received seed, read as W, as V = P^T W
  with the holders' P, or as a party's own rows) rebuilds nothing: R^2 at most that of the output alone (0: a
  party's output does not contain another party's rows of V), covariance blocks no better than a scaled
  identity.
"""

import functools
import warnings

import numpy as np
import pytest
import torch

from conftest import as_torch
from vfltorch.comm import launch
from vfltorch.pca import ExactFederatedPCA
from vfltorch.pca.exact import haar_rotation
from vfltorch.pca.own_rows import P_BITS, W_BITS, _uniform128, decode128

K, Q = 3, 3
MODES = ("holders", "pairwise")


@functools.lru_cache(maxsize=1)
def pooled():
    from vfltorch.data import load_dataset

    X = torch.as_tensor(load_dataset("breast_cancer").X, dtype=torch.float64)
    return (X - X.mean(0)) / X.std(0)            # --scale standard (per column, so per party the same)


def bounds():
    d = pooled().shape[1]
    edges = [0]
    for part in np.array_split(np.arange(d), Q):
        edges.append(edges[-1] + len(part))
    return edges


def own(rank):
    b = bounds()
    X = pooled()[:, b[rank]:b[rank + 1]]
    return X - X.mean(0)


def job(fed):
    import vfltorch.pca.exact as exact

    X = own(fed.rank) if fed.is_data_party else None
    recorded, opener = [], exact.open_own_rows

    def recording(fed_, W, *args, **kwargs):       # the coordinator's W: what the old protocol broadcast
        recorded.append(None if W is None else W.clone())
        return opener(fed_, W, *args, **kwargs)

    exact.open_own_rows = recording
    out = {}
    try:
        for mode in MODES:
            start = len(fed.transcript)
            with warnings.catch_warnings():
                warnings.simplefilter("error")          # the new protocol warns about nothing
                est = ExactFederatedPCA(K, covariance_sharing=mode, fed=fed).fit(X)
            out[mode] = {"span": (start, len(fed.transcript)), "U": as_torch(est.sample_components_),
                         "theta": as_torch(est.eigenvalues_), "components": as_torch(getattr(est, "components_", None)),
                         "bytes": est.bytes_, "W": recorded[-1]}
    finally:
        exact.open_own_rows = opener
    warned = None
    if fed.rank != 2:                            # two parties of 10 columns, k = 10: the output gives the other's Gram
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ExactFederatedPCA(10, fed=fed).fit(X, parties=[0, 1])
        warned = [str(w.message) for w in caught]
    msgs = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript]
    return {"out": out, "messages": msgs, "warned": warned}


@pytest.fixture(scope="module")
def results():
    return launch(job, Q, coordinator=True, record_transcript=True)


def received(results, rank, mode):
    got = []
    for res in results:
        a, b = res["out"][mode]["span"]
        got += [m for m in res["messages"][a:b] if m[2] == rank]
    return got


def rotation(results, mode):
    """P, from the seed the first holder sent the second (the holders know it; the third party does not)."""
    (seed,) = [t for phase, src, dst, t in received(results, 1, mode) if phase.endswith("/seed")]
    return haar_rotation(bounds()[-1], int(seed[0]))


def r2(est, truth):
    """Per-column R^2 of an estimate of centred columns (no fit: 0 for the zero estimate)."""
    return 1 - ((truth - est) ** 2).sum(0) / (truth ** 2).sum(0)


def rel(E, T):
    return float(torch.linalg.matrix_norm(E - T) / torch.linalg.matrix_norm(T))


def reading(rank, out, Vm, m, *, signs):
    """(median per-column R^2, covariance-block relative error) of party m's columns rebuilt from a candidate of
    its rows of V (f_m x k) and ``rank``'s own output. ``signs``: 'own' aligns the candidate with the attacker's
    own rows (needs a whole-V candidate), 'best' takes the best of the 2^k sign choices against the truth (an
    upper bound on any attacker's choice)."""
    U, theta = out["U"], out["theta"]
    scores = U * theta.clamp_min(0).sqrt()               # X V, the output
    truth = own(m)
    choices = [torch.ones(K, dtype=torch.float64)] if signs == "own" else [
        torch.tensor([1.0 if (c >> j) & 1 else -1.0 for j in range(K)], dtype=torch.float64) for c in range(2 ** K)]
    best = (-np.inf, np.inf)
    for s in choices:
        V = Vm * s
        if not torch.isfinite(V).all():
            continue
        col = float(r2(scores @ V.T, truth).median())
        cov = rel(V @ torch.diag(theta) @ V.T, truth.T @ truth)
        best = (max(best[0], col), min(best[1], cov))
    return best


def old_broadcast_attack(results, mode, rank):
    """The old protocol: every party got [W; theta / s^2] and the seed of P; V = P^T W, every party's rows."""
    b = bounds()
    W = results[Q]["out"][mode]["W"]                     # the coordinator's, from this run
    V = rotation(results, mode).T @ W
    out = results[rank]["out"][mode]
    Va = out["components"].T                             # the attacker's own rows: they fix V's signs
    V = V * torch.sign((V[b[rank]:b[rank + 1]] * Va).sum(0))
    return {m: reading(rank, out, V[b[m]:b[m + 1]], m, signs="own") for m in range(Q) if m != rank}


def candidates(results, mode, rank, extra=(), knows_p=False):
    """Every d x k or f x k reading of every tensor ``rank`` received (module docstring), and of ``extra``."""
    b = bounds()
    d = b[-1]
    msgs = received(results, rank, mode) + list(extra)
    P = rotation(results, mode) if rank < 2 or knows_p else None    # the holders know P
    seeds = [t.reshape(-1)[:2] for _, _, _, t in msgs if t.dtype == torch.int64 and t.numel() == 2]
    full, rows = [], []

    def as_v(M):                                         # a d x k reading: as V, and as W rotated back
        full.append(M)
        if P is not None:
            full.append(P.T @ M)

    words128 = []
    for _, _, _, t in msgs:
        if t.dtype.is_floating_point:
            if t.numel() >= d * K:
                as_v(t.reshape(-1)[:d * K].reshape(d, K).to(torch.float64))
        elif t.dtype == torch.int64:
            if t.numel() == 2 * d * K or (t.numel() % (2 * K) == 0 and t.numel() // (2 * K) in np.diff(b)):
                words128.append(t.reshape(2, -1, K))
            if t.numel() == d * K:
                for bits in (30, 40, 60):
                    as_v(t.reshape(d, K).to(torch.float64) / 2 ** bits)
    # Pairs of same-shape 128-bit messages added up too (a party's two shares of its own rows open its output,
    # which is not another party's: dropped below).
    pairs = [torch.from_numpy(np.stack(_add(a.numpy().view(np.uint64), b.numpy().view(np.uint64))).view(np.int64))
             for i, a in enumerate(words128) for b in words128[i + 1:] if a.shape == b.shape]
    for t in words128 + pairs:
        w = t.numpy().view(np.uint64)
        views = [(w[0], w[1])]
        for seed in seeds:                    # unmasked by every received seed, both ways, whole or a party's rows
            hi, lo = _uniform128(seed, (d, K))
            masks = [(hi, lo)] if w.shape[1] == d else [(hi[b[i]:b[i + 1]], lo[b[i]:b[i + 1]]) for i in range(Q)
                                                         if b[i + 1] - b[i] == w.shape[1]]
            masks.append(_uniform128(seed, w.shape[1:]))
            for mask in masks:
                views += [_add(w, mask), _add(w, _negate(mask))]
        for view in views:
            for bits in (W_BITS, W_BITS + P_BITS):
                M = decode128(view, bits)
                (as_v if M.shape[0] == d else rows.append)(M)
    return full, rows


def _add(x, y):
    from vfltorch.comm.sharing import _add128
    return _add128((x[0], x[1]), y)


def _negate(x):
    from vfltorch.comm.sharing import _neg128
    return _neg128(x)


def pooled_attack(results, mode, rank, extra=(), knows_p=False):
    """The best reading of the other parties' columns and blocks from everything ``rank`` received."""
    b = bounds()
    out = results[rank]["out"][mode]
    full, rows = candidates(results, mode, rank, extra, knows_p)
    best = {}
    for m in range(Q):
        if m == rank:
            continue
        mine = out["components"].T
        cands = [V[b[m]:b[m + 1]] for V in full] + [R for R in rows if R.shape[0] == b[m + 1] - b[m]
                                                     and not (R.shape == mine.shape
                                                              and torch.allclose(R.abs(), mine.abs(), atol=1e-6))]
        readings = [reading(rank, out, Vm, m, signs="best") for Vm in cands]
        best[m] = (max([r[0] for r in readings], default=0.0), min([r[1] for r in readings], default=np.inf))
    return best


def output_baseline(results, mode, rank):
    """What the output alone gives: R^2 0 (no rows of another V), and the best scaled identity for a block."""
    b = bounds()
    out = results[rank]["out"][mode]
    total = float(sum((own(i) ** 2).sum() for i in range(Q)))           # the total variance: an output
    others = (total - float((own(rank) ** 2).sum())) / (b[-1] - (b[rank + 1] - b[rank]))
    del out
    return {m: rel(others * torch.eye(b[m + 1] - b[m], dtype=torch.float64), own(m).T @ own(m))
            for m in range(Q) if m != rank}


@pytest.mark.parametrize("mode", MODES)
def test_the_fit_is_the_pooled_pca_and_each_party_gets_its_own_rows(results, mode):
    X = torch.cat([own(i) for i in range(Q)], 1)
    _, S, Vt = torch.linalg.svd(X, full_matrices=False)
    b = bounds()
    for rank in range(Q):
        got = results[rank]["out"][mode]["components"]
        truth = Vt[:K, b[rank]:b[rank + 1]]
        signs = torch.sign((got * truth).sum(1, keepdim=True))
        torch.testing.assert_close(got * signs, truth, rtol=0, atol=1e-8)
        torch.testing.assert_close(results[rank]["out"][mode]["theta"], S[:K] ** 2, rtol=1e-9, atol=0)
    # The coordinator's W is the rotated V: P W's rows are every party's components (what used to be broadcast).
    V = rotation(results, mode).T @ results[Q]["out"][mode]["W"]
    torch.testing.assert_close((V.T @ Vt[:K].T).abs(), torch.eye(K, dtype=torch.float64), rtol=0, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_the_old_broadcast_gives_away_the_other_parties_columns(results, mode):
    for rank in range(Q):
        for m, (col, cov) in old_broadcast_attack(results, mode, rank).items():
            assert col > 0.5 and cov < 0.5, (rank, m, col, cov)


@pytest.mark.parametrize("mode", MODES)
def test_what_a_party_receives_now_rebuilds_nothing_beyond_its_output(results, mode):
    for rank in range(Q):
        msgs = received(results, rank, mode)
        # No float d x k block, no seed of P at the third party; what is left are the k eigenvalues, X V, totals.
        n = pooled().shape[0]
        assert all(t.numel() in (K, n * K, K + 1, 1) for _, _, _, t in msgs if t.dtype.is_floating_point)
        assert bool([t for phase, _, _, t in msgs if phase.endswith("/seed")]) == (rank == 1)     # 0 draws it
        baseline = output_baseline(results, mode, rank)
        attack = pooled_attack(results, mode, rank)
        for m, (col, cov) in attack.items():
            assert col < 0.05, (rank, m, col)                  # the output alone: 0
            assert cov > 0.95 * baseline[m], (rank, m, cov, baseline[m])



def test_the_pooled_attack_finds_the_old_broadcast_and_opens_the_own_rows(results):
    """The solver's readings are real: given the old block [W; theta / s^2] and P (the old protocol sent every data
    party the seed), the third party reads the others' columns; its two received 128-bit shares open its own rows."""
    mode = "holders"
    W, theta = results[Q]["out"][mode]["W"], results[Q]["out"][mode]["theta"]
    old = ("pca/exact", Q, 2, torch.cat([W, theta[None, :]]))
    attack = pooled_attack(results, mode, 2, extra=[old], knows_p=True)
    assert all(attack[m][0] > 0.5 for m in (0, 1)), attack
    _, rows = candidates(results, mode, 2)
    mine = results[2]["out"][mode]["components"].T
    assert any(torch.allclose(R.abs(), mine.abs(), rtol=0, atol=1e-8) for R in rows if R.shape == mine.shape)


def test_what_the_output_itself_implies():
    """The products stated in docs/pca.md ('What the output implies'), from the output alone (U, theta, own columns):
    the others' joint scores X_o V_o = U sqrt(theta) - X_l V_l and V_o^T V_o = I - V_l^T V_l give the others' pooled
    Gram matrix on the k-dimensional span of V_o, X_o V_o (V_o^T V_o)^+ V_o^T X_o^T; exactly their Gram matrix when
    they hold at most k columns together (the estimator warns then)."""
    X = pooled()
    for widths, exact in (((27, 3), True), ((10, 20), False)):
        U, S, Vt = torch.linalg.svd(X, full_matrices=False)
        U, theta, V = U[:, :K], S[:K] ** 2, Vt[:K].T
        Xl, Xo, Vl = X[:, :widths[0]], X[:, widths[0]:], V[:widths[0]]
        scores = U * theta.sqrt() - Xl @ Vl
        G = torch.eye(K, dtype=torch.float64) - Vl.T @ Vl
        err = rel(scores @ torch.linalg.pinv(G, rtol=1e-10, hermitian=True) @ scores.T, Xo @ Xo.T)
        assert (err < 1e-10) if exact else (err > 0.1), (widths, err)



def test_the_estimator_warns_when_the_others_hold_at_most_k_columns(results):
    # The fixture's last fit: parties 0 and 1 (10 columns each) with k = 10.
    for rank in (0, 1):
        assert any("learns their Gram matrix exactly" in w for w in results[rank]["warned"]), results[rank]["warned"]
    assert not results[Q]["warned"]
