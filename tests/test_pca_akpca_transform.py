"""VFedAKPCA scores new rows: each party's Nystrom extension of its local kernel eigenvectors, combined as the merge
combined the vectors, summed over the parties (``vfltorch/pca/akpca.py``).

* In one process, Q = 2 and 3 simulated parties (scikit-learn's kernels and ``KernelCenterer``, the merge's
  coefficients by least squares, not the estimator's code): the combination of the extensions gives the merged
  embedding back on the training rows, for the default (subspace) merge and the paper's;
* one party: the scores of new rows are scikit-learn's ``KernelPCA.transform`` / sqrt(lambda);
* real party processes (``launch``, a server and Q = 2, 3 data parties): ``transform(X_train)`` is the training
  embedding, ``transform(X_new)`` equals the simulation at every party, the complete graph gives the same, a star
  of three (one estimate per party) is refused; what the parties receive is the documented k x k block and the
  output.
"""

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import pairwise_kernels
from sklearn.preprocessing import KernelCenterer

from conftest import as_torch
from vfltorch.comm import launch
from vfltorch.data import VFLInputError
from vfltorch.pca import VFedAKPCA, merge, shared_start
from vfltorch.pca.linalg import top_eigenpairs
from vfltorch.pca.merge import merge_with_coefficients

N, M, F, K, GAMMA = 40, 7, 9, 2, 0.05
MERGES = ["subspace", "paper"]


def data():
    g = torch.Generator().manual_seed(5)
    Z = torch.randn(N + M, 3, generator=g, dtype=torch.float64) * torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    X = torch.tanh(Z @ torch.randn(3, F, generator=g, dtype=torch.float64)) * 2
    X = X + 0.3 * torch.randn(N + M, F, generator=g, dtype=torch.float64) + 10.0
    return X[:N].numpy(), X[N:].numpy()


def blocks(parties):
    return np.array_split(np.arange(F), parties)


def simulate(parties, mode, X_new):
    """The protocol in one process: local kernel PCAs, the server's merge, the parties' summed extensions."""
    X, _ = data()
    reference = shared_start(N, K, 0, 1, device="cpu")
    vectors, values, extensions = [], [], []
    for cols in blocks(parties):
        K_fit = pairwise_kernels(X[:, cols], metric="rbf", gamma=GAMMA)
        centerer = KernelCenterer().fit(K_fit)
        v, lam = top_eigenpairs(torch.as_tensor(centerer.transform(K_fit)), K, reference=reference)
        K_new = centerer.transform(pairwise_kernels(X_new[:, cols], X[:, cols], metric="rbf", gamma=GAMMA))
        vectors.append(v)
        values.append(lam)
        extensions.append(torch.as_tensor(K_new) @ v / lam)
    U = merge(torch.stack(vectors), torch.stack(values), power=0.5, mode=mode, reference=reference)
    # U lies in the span of the local vectors (both merges are linear in them): its coefficients, by least squares
    C = torch.linalg.lstsq(torch.cat(vectors, dim=1), U).solution.reshape(parties, K, K)
    scores = sum(e @ c for e, c in zip(extensions, C))
    return U, C, scores, (torch.stack(vectors), torch.stack(values), reference)


@pytest.mark.parametrize("parties", [2, 3])
@pytest.mark.parametrize("mode", MERGES)
def test_simulated_parties_extensions_combine_to_the_training_embedding(parties, mode):
    X, _ = data()
    U, C, scores, (vectors, values, reference) = simulate(parties, mode, X)
    torch.testing.assert_close(scores, U, rtol=0, atol=1e-9)
    # the merge's own coefficients are the least-squares ones
    U2, C2 = merge_with_coefficients(vectors, values, power=0.5, mode=mode, reference=reference)
    assert torch.equal(U2, U)
    torch.testing.assert_close(C2, C, rtol=0, atol=1e-9)


@pytest.mark.parametrize("mode", MERGES)
def test_one_party_scores_new_rows_as_scikit_learn_kernel_pca(mode):
    from sklearn.decomposition import KernelPCA

    X, X_new = data()
    est = VFedAKPCA(K, gamma=GAMMA, merge=mode).fit(X)
    np.testing.assert_allclose(est.transform(X), est.transform(), rtol=0, atol=1e-10)
    sk = KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X)
    expected = sk.transform(X_new) / np.sqrt(sk.eigenvalues_)
    got = est.transform(X_new)
    np.testing.assert_allclose(got * np.sign((got * expected).sum(0)), expected, rtol=0, atol=1e-9)
    assert isinstance(got, np.ndarray) and isinstance(est.transform(torch.as_tensor(X_new)), torch.Tensor)


def test_new_rows_with_the_wrong_columns_say_what_to_pass():
    X, X_new = data()
    est = VFedAKPCA(K, gamma=GAMMA).fit(torch.as_tensor(X))
    with pytest.raises(VFLInputError, match=f"X has 4 features, but VFedAKPCA is expecting {F} features"):
        est.transform(torch.as_tensor(X_new[:, :4]))
    with pytest.raises(VFLInputError, match="NaN or inf"):
        est.transform(torch.full((2, F), float("nan"), dtype=torch.float64))


# ------------------------------------------------------------------------------ real party processes
def party_job(fed, parties):
    X, X_new = data()
    cols = blocks(parties)[fed.rank] if fed.is_data_party else None
    mine, mine_new = (X[:, cols], X_new[:, cols]) if cols is not None else (None, None)
    out = {}
    for name, kw in [("subspace", {}), ("paper", {"merge": "paper"}), ("complete", {"topology": "complete"})]:
        start = len(fed.transcript)
        est = VFedAKPCA(K, gamma=GAMMA, fed=fed, **kw).fit(mine)
        fitted = len(fed.transcript)
        got = {"U": est.transform() if fed.is_data_party else None, "C": as_torch(est.merge_coefficients_)}
        if fed.is_data_party:                              # (numpy in, numpy out)
            got["train"] = torch.as_tensor(est.transform(mine))
            got["new"] = torch.as_tensor(est.transform(mine_new))
            try:                                           # refused locally, before any message
                est.transform(mine_new[:, :1])
            except VFLInputError as exc:
                got["wrong_columns"] = str(exc)
        got["fit_sent"] = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript.messages[start:fitted]]
        got["transform_sent"] = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript.messages[fitted:]]
        out[name] = got
    # A star: with 3 parties each leaf merges itself and the centre only, its own estimate; with 2 both merge both.
    est = VFedAKPCA(K, gamma=GAMMA, fed=fed, topology="star").fit(mine)        # (the server joins the set-up)
    try:
        out["star"] = torch.as_tensor(est.transform(mine_new)) if fed.is_data_party else None
    except VFLInputError as exc:
        out["star"] = str(exc)
    return out


@pytest.fixture(scope="module", params=[2, 3])
def launched(request):
    parties = request.param
    return parties, launch(party_job, parties, args=(parties,), coordinator=True, record_transcript=True)


@pytest.mark.parametrize("name", ["subspace", "paper", "complete"])
def test_parties_score_training_and_new_rows_as_the_simulation(launched, name):
    parties, results = launched
    mode = "paper" if name == "paper" else "subspace"
    X, X_new = data()
    U, C, scores, _ = simulate(parties, mode, X_new)
    for rank in range(parties):
        got = results[rank][name]
        assert isinstance(got["U"], np.ndarray)
        torch.testing.assert_close(torch.as_tensor(got["U"]), U, rtol=0, atol=1e-9)
        torch.testing.assert_close(got["train"], U, rtol=0, atol=1e-9)         # transform(X_train) = U
        torch.testing.assert_close(got["new"], scores, rtol=0, atol=1e-9)
        torch.testing.assert_close(got["C"], C[rank], rtol=0, atol=1e-9)
        assert torch.equal(got["new"], results[0][name]["new"])                # the same sums everywhere
        width = len(blocks(parties)[rank])
        assert f"expected this party's {width} columns of the new samples (m x {width}), got (7, 1)" \
            in got["wrong_columns"]
    if name != "complete":
        assert results[parties][name]["C"] is None                             # the server keeps no block


@pytest.mark.parametrize("name", ["subspace", "paper"])
def test_what_each_party_receives_for_new_rows(launched, name):
    """Fit: the server sends each client its own k x k block, to it alone. Transform: ring-masked integers and,
    from the party that unmasks the sum, the m x k scores (the output); nothing else in the clear."""
    parties, results = launched
    server = parties
    blocks_from_server = [(dst, t) for ph, src, dst, t in results[server][name]["fit_sent"]
                          if tuple(t.shape) == (K, K) and t.dtype == torch.float64]
    assert [dst for dst, _ in blocks_from_server] == list(range(parties))
    for dst, t in blocks_from_server:
        assert torch.equal(t, results[dst][name]["C"])
    assert results[server][name]["transform_sent"] == []
    for rank in range(parties):
        received = [(ph, t) for res in results for ph, src, dst, t in res[name]["transform_sent"] if dst == rank]
        assert received and all(ph.startswith("pca/akpca/transform") for ph, _ in received)
        floats = [t for _, t in received if t.dtype.is_floating_point]
        outputs = (results[rank][name]["train"], results[rank][name]["new"])      # transform(X_train), (X_new)
        assert all(any(t.numel() == o.numel() and torch.equal(t.reshape(o.shape), o) for o in outputs)
                              for t in floats)
        assert all(t.dtype == torch.int64 for _, t in received if not t.dtype.is_floating_point)


def test_a_star_scores_new_rows_only_where_every_party_merged_every_pair(launched):
    parties, results = launched
    for rank in range(parties):
        if parties == 3:
            assert "needs one merged estimate shared by every party" in results[rank]["star"]
        else:
            torch.testing.assert_close(results[rank]["star"], simulate(2, "subspace", data()[1])[2], rtol=0,
                                       atol=1e-9)
