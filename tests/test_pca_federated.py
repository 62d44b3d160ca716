"""Federated PCA over real gloo processes: 4 data parties and a server, one launch for every check.

The job fits every estimator and topology on the same vertically split
matrix and returns what each party holds (and its transcript); the tests
compare with the pooled SVD / kernel PCA, with the merge formulas applied to
the gathered local eigenpairs, and inspect the transcripts.
"""

import pytest
import torch

from conftest import as_torch
from vfltorch.comm import launch
from vfltorch.pca import (ExactFederatedKernelPCA, ExactFederatedPCA, VFedAKPCA, VFedPCA, aligned_distances, merge,
                          pooled_kernel_pca, pooled_pca, shared_start)

N, WIDTHS = 40, [3, 5, 3, 5]
BOUNDS = [0, 3, 8, 11, 16]
K = 2


def pooled_data():
    g = torch.Generator().manual_seed(11)
    Z = torch.randn(N, 4, generator=g, dtype=torch.float64) * torch.tensor([6.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    W = torch.randn(4, 16, generator=g, dtype=torch.float64)
    return Z @ W + 0.2 * torch.randn(N, 16, generator=g, dtype=torch.float64) + 2.0


def new_rows():
    return torch.randn(7, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3


def columns(rank):
    return slice(BOUNDS[rank], BOUNDS[rank + 1])


def _kind(value):
    """The type name of a fitted attribute ('list[ndarray]' for history_)."""
    if isinstance(value, list):
        return "list[" + ",".join(sorted({type(v).__name__ for v in value})) + "]"
    return type(value).__name__


ARRAYS = ("sample_components_", "local_components_", "local_eigenvalues_", "history_", "eigenvalues_", "loadings_")


def _state(est):
    """What the checks below compare: the fitted arrays (numpy, issue 37) as tensors, and their types as fitted."""
    keep = ("sample_components_", "local_components_", "local_eigenvalues_", "history_", "rounds_", "bytes_",
            "explained_variance_ratio_", "eigenvalues_", "converged_", "loadings_")
    state = {k: as_torch(getattr(est, k)) if k in ARRAYS else getattr(est, k) for k in keep if hasattr(est, k)}
    state["kinds"] = {k: _kind(v) for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}
    return state


def party_job(fed):
    """Every fit, in the same order at every rank (SPMD); returns the party's results and transcript slices."""
    X = pooled_data()[:, columns(fed.rank)] if fed.is_data_party else None
    out, marks = {}, {}

    def run(name, est, data=X, parties=None):
        start = len(fed.transcript)
        if fed.is_data_party and parties is not None and fed.rank not in parties:
            marks[name] = (start, start)
            return
        est.set_params(fed=fed).fit(data, parties=parties)
        out[name] = _state(est)
        marks[name] = (start, len(fed.transcript))
        return est

    for topo in ("tree", "star", "ring"):
        run(f"exact-{topo}", ExactFederatedPCA(3, protocol="krylov", secure=False, sum_topology=topo))
    run("exact-krylov-secure", ExactFederatedPCA(3, protocol="krylov"))
    exact = run("exact-secure", ExactFederatedPCA(3))
    run("exact-subset", ExactFederatedPCA(2), parties=[0, 2])
    if fed.is_data_party:
        out["transform"] = exact.transform(new_rows()[:, columns(fed.rank)])
        out["train_scores"] = exact.transform()
    for topo in ("server", "complete", "ring", "star"):
        run(f"merge-{topo}", VFedPCA(K, periods=1, topology=topo))
    run("merge-ring-noself", VFedPCA(1, periods=1, topology="ring", include_self=False))
    run("merge-server-scaled", VFedPCA(1, periods=1, topology="server", weight_scaling=True))
    run("vfedpca-periods", VFedPCA(1, periods=6, local_iters=5, warm_start=True))
    run("akpca-server", VFedAKPCA(1, kernel="rbf", gamma=0.01))
    run("akpca-star", VFedAKPCA(1, kernel="sigmoid", gamma=0.001, topology="star", weight_scaling=True))
    rbf = run("exact-rbf", ExactFederatedKernelPCA(2, kernel="rbf", gamma=0.01))
    if fed.is_data_party:
        out["kernel_transform"] = rbf.transform(new_rows()[:, columns(fed.rank)])
    run("exact-poly", ExactFederatedKernelPCA(2, kernel="poly", gamma=0.01, secure=False, sum_topology="star"))
    # A party with a single column: its eigenvector and eigenvalue give the column away (see docs/pca.md).
    narrow = X[:, :1] if fed.rank == 2 else X
    run("narrow", VFedPCA(1, periods=1), data=narrow)
    msgs = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript]
    return {"out": out, "marks": marks, "messages": msgs, "rank": fed.rank}


@pytest.fixture(scope="module")
def results():
    return launch(party_job, 4, coordinator=True, record_transcript=True)


def sent(results, rank, name):
    r = results[rank]
    a, b = r["marks"][name]
    return r["messages"][a:b]


def test_fitted_arrays_are_numpy_at_every_rank(results):
    """Issue 37: under a real federation too, every rank's fitted arrays are numpy (None where it holds none)."""
    seen = set()
    for r in results:
        for name, state in r["out"].items():
            if not isinstance(state, dict):
                continue
            for attr, kind in state["kinds"].items():
                assert "Tensor" not in kind, (r["rank"], name, attr, kind)
                seen.add((attr, kind))
    for attr in ("sample_components_", "loadings_", "components_", "mean_", "eigenvalues_", "local_components_",
                 "merge_coefficients_", "X_fit_", "singular_values_", "explained_variance_"):
        assert (attr, "ndarray") in seen, attr
    assert ("history_", "list[ndarray]") in seen


# ------------------------------------------------------------------------- exact
@pytest.mark.parametrize("name", ["exact-tree", "exact-star", "exact-ring", "exact-krylov-secure", "exact-secure"])
def test_exact_federated_pca_equals_svd_of_the_pooled_data(results, name):
    X = pooled_data()
    U = torch.linalg.svd(X - X.mean(0), full_matrices=False)[0][:, :3]
    for rank in range(4):
        got = results[rank]["out"][name]
        assert got["converged_"]
        assert aligned_distances(got["sample_components_"], U).max() < 1e-6, (name, rank)
        torch.testing.assert_close(got["sample_components_"], results[0]["out"][name]["sample_components_"], rtol=0, atol=0)
    assert results[0]["out"][name]["bytes_"] > 0


def test_exact_on_a_subset_of_parties_is_the_pca_of_their_columns(results):
    X = pooled_data()
    sub = torch.cat([X[:, columns(0)], X[:, columns(2)]], 1)
    U = torch.linalg.svd(sub - sub.mean(0), full_matrices=False)[0][:, :2]
    for rank in (0, 2):
        assert aligned_distances(results[rank]["out"]["exact-subset"]["sample_components_"], U).max() < 1e-6
    assert "exact-subset" not in results[1]["out"]
    assert results[1]["marks"]["exact-subset"][0] == results[1]["marks"]["exact-subset"][1]  # sent nothing


def test_transform_of_new_rows_is_the_pooled_projection(results):
    from sklearn.decomposition import PCA

    X = pooled_data()
    sk = PCA(3).fit(X.numpy())
    expected = torch.as_tensor(sk.transform(new_rows().numpy()))
    for rank in range(4):
        got = results[rank]["out"]["transform"]
        signs = torch.sign((got * expected).sum(0))
        torch.testing.assert_close(got * signs, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[0]["out"]["train_scores"].abs(),
                               torch.as_tensor(sk.transform(X.numpy())).abs(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------ merges
def local_pairs(results, name, k):
    vecs = torch.stack([results[r]["out"][name]["local_components_"] for r in range(4)])
    vals = torch.stack([results[r]["out"][name]["local_eigenvalues_"] for r in range(4)])
    assert vecs.shape == (4, N, k)
    return vecs, vals


def check_merge(results, name, members_of, k, **kw):
    vecs, vals = local_pairs(results, name, k)
    for rank in range(4):
        members = members_of(rank)
        expected = merge(vecs[members], vals[members], reference=shared_start(N, k, 0, 1, device="cpu"), **kw)
        torch.testing.assert_close(results[rank]["out"][name]["sample_components_"], expected, rtol=1e-12, atol=1e-12)


def test_server_merge_is_the_eigenvalue_weighted_sum(results):
    check_merge(results, "merge-server", lambda r: [0, 1, 2, 3], K)
    check_merge(results, "merge-server-scaled", lambda r: [0, 1, 2, 3], 1, weight_scaling=True)
    torch.testing.assert_close(results[4]["out"]["merge-server"]["sample_components_"],
                               results[0]["out"]["merge-server"]["sample_components_"])
    # The meter counts this fit only: each client uploads n + 1 float64, the server sends u (n) to 4 clients.
    assert [results[r]["out"]["merge-server-scaled"]["bytes_"] for r in range(5)] == [(N + 1) * 8] * 4 + [4 * N * 8]


def test_complete_graph_merge_equals_the_server_merge(results):
    check_merge(results, "merge-complete", lambda r: [0, 1, 2, 3], K)
    torch.testing.assert_close(results[2]["out"]["merge-complete"]["sample_components_"],
                               results[2]["out"]["merge-server"]["sample_components_"], rtol=1e-12, atol=1e-12)


def test_ring_and_star_merge_their_neighbourhoods(results):
    check_merge(results, "merge-ring", lambda r: sorted({(r - 1) % 4, r, (r + 1) % 4}), K)
    check_merge(results, "merge-ring-noself", lambda r: sorted({(r - 1) % 4, (r + 1) % 4}), 1)
    check_merge(results, "merge-star", lambda r: [0, 1, 2, 3] if r == 0 else [0, r], K)
    ring = [results[r]["out"]["merge-ring"]["sample_components_"] for r in range(4)]
    assert not torch.allclose(ring[0], ring[2])   # neighbourhoods differ, so estimates differ


def test_vfedpca_stops_changing_after_the_second_period(results):
    X = pooled_data()
    G = pooled_pca(X, 1)[0]
    hist = results[0]["out"]["vfedpca-periods"]["history_"]
    assert len(hist) == 6
    d = [float(aligned_distances(U, G)[0]) for U in hist]
    assert d[1] < d[0]
    for later in d[2:]:
        assert abs(later - d[1]) < 1e-9


def test_akpca_merges_sqrt_eigenvalue_weights_and_projects_own_data(results):
    check_merge(results, "akpca-server", lambda r: [0, 1, 2, 3], 1, power=0.5)
    check_merge(results, "akpca-star", lambda r: [0, 1, 2, 3] if r == 0 else [0, r], 1, power=0.5,
                weight_scaling=True)
    X = pooled_data()
    for rank in range(4):
        got = results[rank]["out"]["akpca-server"]
        torch.testing.assert_close(got["loadings_"], X[:, columns(rank)].T @ got["sample_components_"])


def test_exact_kernel_pca_equals_pooled_kernel_pca(results):
    X = pooled_data()
    for name, kernel in (("exact-rbf", "rbf"), ("exact-poly", "poly")):
        G, lam = pooled_kernel_pca(X, 2, kernel=kernel, gamma=0.01)
        for rank in range(4):
            got = results[rank]["out"][name]
            assert aligned_distances(got["sample_components_"], G).max() < 1e-8, (name, rank)
            torch.testing.assert_close(got["eigenvalues_"], lam, rtol=1e-8, atol=0)


# ----------------------------------------------------------------------- privacy
def raw_columns(rank):
    X = pooled_data()[:, columns(rank)]
    return torch.cat([X, X - X.mean(0)], 1)


def blocks(tensor):
    """A message as an n x m block of sample-space vectors, or None for scalars and headers."""
    flat = tensor.reshape(-1).to(torch.float64)
    m = flat.numel()
    if m >= N and m % N == 0:
        return flat.reshape(N, -1)
    if m >= N + 1 and m % (N + 1) == 0:
        k = m // (N + 1)
        return flat[: N * k].reshape(N, k)            # a packed payload: k eigenvectors, then k eigenvalues
    return None


def residual_in_span(B, x):
    """||x - P_B x|| / ||x|| for the span of B's columns."""
    Q = torch.linalg.qr(B)[0]
    return float(torch.linalg.vector_norm(x - Q @ (Q.T @ x)) / torch.linalg.vector_norm(x))


METHODS_WITHOUT_LEAK = ["merge-server", "merge-complete", "merge-ring", "merge-star",
                        "vfedpca-periods", "akpca-server", "akpca-star", "exact-rbf", "exact-secure"]


@pytest.mark.parametrize("name", METHODS_WITHOUT_LEAK)
def test_no_party_sends_or_linearly_reveals_its_columns(results, name):
    for rank in range(4):
        cols = raw_columns(rank)
        msgs = sent(results, rank, name)
        assert msgs, (name, rank)
        for phase, src, dst, tensor in msgs:
            assert src == rank
            if not tensor.dtype.is_floating_point:
                continue                               # headers, JSON bytes and ring-masked integers
            B = blocks(tensor)
            if B is None:
                assert tensor.numel() <= 2 * K + 1, (name, phase, tensor.shape)   # eigenvalues, votes, sums
                continue
            for c in range(cols.shape[1]):
                # no column, raw or centred, is a message vector or a combination of one message's vectors
                assert residual_in_span(B, cols[:, c]) > 1e-3, (name, rank, phase, c)
            # rows of the party's matrix are f_i long: no message vector equals one
            assert B.shape[0] == N


def test_masked_sums_send_only_ring_elements_or_the_total(results):
    from vfltorch.pca import orthonormalize, shared_start

    X = pooled_data()
    Xc = X - X.mean(0)
    Q1 = orthonormalize(shared_start(N, 13, 0, 0, device="cpu", positive=False))
    for rank in range(4):
        cols = raw_columns(rank)
        floats = 0
        for phase, src, dst, tensor in sent(results, rank, "exact-krylov-secure"):
            if tensor.dtype.is_floating_point and tensor.numel() > 2 * K + 1:
                # The only float blocks are the round totals A Q sent down the tree by the output party:
                # the protocol's public output, not the sender's part.
                assert rank in (0, 2) and "masked-sum" not in phase, (rank, phase)
                if floats == 0:
                    torch.testing.assert_close(tensor, Xc @ (Xc.T @ Q1), rtol=1e-12, atol=1e-9)
                floats += 1
            if tensor.dtype == torch.int64 and tensor.numel() >= N:
                masked = tensor.to(torch.float64).reshape(N, -1)
                for c in range(cols.shape[1]):
                    corr = torch.corrcoef(torch.stack([masked[:, 0], cols[:, c]]))[0, 1].abs()
                    assert corr < 0.7, (rank, phase, c)
        assert rank not in (0, 2) or floats > 0


def test_plain_tree_sum_reveals_the_childs_column_space(results):
    # Documented trade-off: without masks a tree parent receives X_i X_i^T Q, whose span is col(X_i).
    msgs = [m for m in sent(results, 1, "exact-tree") if m[3].dtype.is_floating_point and m[3].numel() >= N]
    B = blocks(msgs[0][3])
    assert max(residual_in_span(B, raw_columns(1)[:, c]) for c in range(5, 10)) < 1e-8


def test_a_single_column_party_gives_its_column_away(results):
    x = pooled_data()[:, columns(2)][:, 0]
    x = x - x.mean()
    payload = [m[3] for m in sent(results, 2, "narrow") if m[3].numel() == N + 1][0]
    a, alpha = payload[:N], payload[N]
    rebuilt = a * alpha.sqrt()
    assert min((rebuilt - x).norm(), (rebuilt + x).norm()) < 1e-8 * x.norm()


def test_exact_kernel_pca_transforms_new_rows_through_the_masked_cross_gram_sum(results):
    from sklearn.decomposition import KernelPCA

    sk = KernelPCA(2, kernel="rbf", gamma=0.01, eigen_solver="dense").fit(pooled_data().numpy())
    expected = torch.as_tensor(sk.transform(new_rows().numpy()))
    for rank in range(4):
        got = results[rank]["out"]["kernel_transform"]
        signs = torch.sign((got * expected).sum(0))
        torch.testing.assert_close(got * signs, expected, rtol=1e-7, atol=1e-7)
