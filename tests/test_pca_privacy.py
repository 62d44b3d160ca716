"""The Gram-matrix attack on exact federated PCA, run on what each party actually received (real processes).

The adversary is a data party: it pools every tensor it received (the transcripts of the others, filtered by
destination), the public seed and its own columns, and tries to rebuild the *other parties'* Gram matrix
sum_{i != j} X_i X_i^T (their data up to a rotation). Against protocol='krylov' it knows every block Q_t
(the first from the public seed, then orth(Y_t)) and receives every Y_t = A Q_t: subtracting its own part
and a Nystrom reconstruction on span{Q_t} rebuild it. Against the default protocol='rotated' it receives ring
elements, the rotation's seed and the output (U, theta) only: its best estimate is the output's rank-k
matrix minus its own part. The coordinator's view, P A P^T, is checked too: the spectrum of A and no more.
"""

import warnings

import pytest
import torch

from conftest import as_torch
from vfltorch.comm import launch
from vfltorch.pca import ExactFederatedPCA, orthonormalize, shared_start
from vfltorch.pca.exact import haar_rotation

N, WIDTHS, K = 60, [6, 6, 6], 3
BOUNDS = [0, 6, 12, 18]
B = K + min(10, N - K)           # the krylov block width


def pooled():
    g = torch.Generator().manual_seed(21)
    # A full-rank spectrum with a clear top 3, so that the output (the top-3 subspace) is not the whole matrix.
    scales = torch.tensor([5.0, 4.0, 3.5] + [2.0] * 15, dtype=torch.float64)
    return torch.randn(N, 18, generator=g, dtype=torch.float64) * scales + 1.0


def own(rank):
    X = pooled()[:, BOUNDS[rank]:BOUNDS[rank + 1]]
    return X - X.mean(0)


def job(fed):
    from vfltorch.comm import sharing
    X = own(fed.rank) if fed.is_data_party else None
    out = {}
    # Record the d x d share each holder brings to the rotation: what it knows after the reduction (test only).
    held, rotate, current = {}, sharing.rotate_shares, [None]

    def recording(fed_, mine, *args, **kwargs):
        held.setdefault(current[0], []).append(None if mine is None else mine.clone())
        return rotate(fed_, mine, *args, **kwargs)

    sharing.rotate_shares = recording
    for name, est in (("krylov", ExactFederatedPCA(K, protocol="krylov")),
                      ("rotated", ExactFederatedPCA(K, protocol="rotated")), ("covariance", ExactFederatedPCA(K)),
                      ("pairwise", ExactFederatedPCA(K, covariance_sharing="pairwise"))):
        current[0] = name
        start = len(fed.transcript)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est.set_params(fed=fed).fit(X)
        out[name] = {"span": (start, len(fed.transcript)), "warnings": [str(w.message) for w in caught],
                     "components": as_torch(est.sample_components_), "eigenvalues": as_torch(est.eigenvalues_),
                     "protocol": est.protocol_}
    sharing.rotate_shares = rotate
    msgs = [(m.phase, m.src, m.dst, m.tensor) for m in fed.transcript]
    return {"out": out, "messages": msgs, "held": held}


@pytest.fixture(scope="module")
def results():
    return launch(job, 3, coordinator=True, record_transcript=True)


def received(results, rank, name):
    """Every tensor sent to ``rank`` during fit ``name``, in sending order per sender."""
    got = []
    for res in results:
        a, b = res["out"][name]["span"] if name in res["out"] else (0, 0)
        got += [m for m in res["messages"][a:b] if m[2] == rank]
    return got


def others_gram(rank):
    A = sum(own(i) @ own(i).T for i in range(3))
    return A - own(rank) @ own(rank).T


def rel(E, T):
    return float(torch.linalg.matrix_norm(E - T) / torch.linalg.matrix_norm(T))


def nystrom_attack(msgs, rank):
    """Krylov-type pairs (Q_t, A Q_t) from the received float n x b blocks and the public seed -> others' Gram."""
    Xj = own(rank)
    Q = orthonormalize(shared_start(N, B, 0, 0, device="cpu", positive=False))
    queries, products = [], []
    for phase, src, dst, t in msgs:
        if t.dtype.is_floating_point and t.numel() == N * B:
            Y = t.reshape(N, B).to(torch.float64)
            queries.append(Q)
            products.append(Y - Xj @ (Xj.T @ Q))     # the others' part of A Q
            Q = orthonormalize(Y)
    if not queries:
        return None
    Qs, Zs = torch.cat(queries, 1), torch.cat(products, 1)
    return Zs @ torch.linalg.pinv(Qs.T @ Zs, rtol=1e-10, hermitian=True) @ Zs.T


def output_attack(msgs, rank):
    """The best a party can do with the output alone: U diag(theta) U^T minus its own Gram matrix."""
    seeds = [t for phase, src, dst, t in msgs if phase.endswith("/seed")]
    blocks = [t for phase, src, dst, t in msgs if t.dtype.is_floating_point and t.numel() == (N + 1) * K]
    if not blocks:
        return None
    block = blocks[-1].reshape(N + 1, K).to(torch.float64)
    if not seeds:                              # party 0 drew the seed itself: see best_attack
        return None
    U = haar_rotation(N, int(seeds[0][0])).T @ block[:N]     # the attacker knows P: rotate back
    Xj = own(rank)
    return U @ torch.diag(block[N]) @ U.T - Xj @ Xj.T


def best_attack(results, rank, name):
    msgs = received(results, rank, name)
    truth = others_gram(rank)
    errors = [rel(E, truth) for E in (nystrom_attack(msgs, rank), output_attack(msgs, rank)) if E is not None]
    if rank == 0 and name == "rotated":
        # Party 0 drew the seed; its output is the same U at every party: the output attack with its own copy.
        r = results[0]["out"][name]
        U, theta = r["components"], r["eigenvalues"]
        errors.append(rel(U @ torch.diag(theta) @ U.T - own(0) @ own(0).T, truth))
    return min(errors) if errors else 1.0


def test_the_attack_rebuilds_the_others_gram_matrix_from_the_krylov_protocol(results):
    for rank in (1, 2):                      # the parties below the masked sum's output receive the totals A Q_t
        assert best_attack(results, rank, "krylov") < 1e-6, rank
    for rank in range(3):
        assert any("rebuild the other parties' Gram matrix" in w for w in results[rank]["out"]["krylov"]["warnings"])


def test_the_attack_fails_against_the_rotated_protocol(results):
    for rank in range(3):
        msgs = received(results, rank, "rotated")
        assert nystrom_attack(msgs, rank) is None                 # no product of a known block ever arrives
        err = best_attack(results, rank, "rotated")
        assert err > 0.3, (rank, err)                             # only the output's rank-3 part: far off
        assert not results[rank]["out"]["rotated"]["warnings"]
        # what it received: int64 ring elements and the seed, the (n + 1) x k output and the variance totals
        for phase, src, dst, t in msgs:
            assert (not t.dtype.is_floating_point) or t.numel() in ((N + 1) * K, K + 1), (phase, t.shape)


def test_both_protocols_give_the_pooled_pca(results):
    X = pooled()
    U = torch.linalg.svd(X - X.mean(0), full_matrices=False)[0][:, :K]
    for name in ("krylov", "rotated", "covariance"):
        for rank in range(3):
            got = results[rank]["out"][name]["components"]
            signs = torch.sign((got * U).sum(0))
            torch.testing.assert_close(got * signs, U, rtol=0, atol=1e-8)


def test_the_coordinator_learns_the_spectrum_and_not_the_gram_matrix(results):
    # Rebuild the coordinator's P A P^T from the rotation's seed (the test reads it from the transcript).
    seed = [t for phase, src, dst, t in received(results, 1, "rotated") if phase.endswith("/seed")][0]
    P = haar_rotation(N, int(seed[0]))
    A = sum(own(i) @ own(i).T for i in range(3))
    view = P @ A @ P.T
    coordinator = 3
    # It received ring elements and the masked-sum bookkeeping only, never the seed or a float block.
    for phase, src, dst, t in received(results, coordinator, "rotated"):
        assert "/seed" not in phase and (not t.dtype.is_floating_point or t.numel() <= K + 1), (phase, t.shape)
    assert results[coordinator]["out"]["rotated"]["components"] is None
    torch.testing.assert_close(torch.linalg.eigvalsh(view), torch.linalg.eigvalsh(A), rtol=1e-9, atol=1e-6)
    # Taking its view for the Gram matrix, or any one party's Gram part for its own, is far off.
    assert rel(view, A) > 0.5
    for rank in range(3):
        assert rel(view, others_gram(rank)) > 0.5


@pytest.mark.parametrize("q", [2, 3, 5, 8])
def test_the_rotated_sum_layout_reveals_no_partial_sum(q):
    # The rotated protocol's masked sum runs over the data parties and the coordinator (the output, with
    # a zero part); the kept mask is the first party's. No node can combine what it receives into a
    # combination of other parties' parts (before the output itself is revealed to the coordinator).
    from vfltorch.comm import masked_sum_leakage, totally_different_trees

    ranks = list(range(q)) + [q]
    t1, t2 = totally_different_trees(ranks, 0)
    assert set(masked_sum_leakage(t1, t2, 0, q).values()) == {0}


# ------------------------------------------------------------------ protocol='covariance' (the default here)
FRAC = 30                     # vfltorch.pca.exact.COVARIANCE_FRAC_BITS


def total_norm2():
    return float(sum((own(i) ** 2).sum() for i in range(3)))


def covariance_seed(results):
    return int([t for phase, src, dst, t in received(results, 1, "covariance") if phase.endswith("/seed")][0][0])


def test_the_default_is_the_covariance_protocol_when_there_are_fewer_features_than_samples(results):
    for rank in range(4):
        assert results[rank]["out"]["covariance"]["protocol"] == "covariance"
        assert not results[rank]["out"]["covariance"]["warnings"]


def column_messages(results, rank):
    """The n-row ring blocks ``rank`` received during the products, cut into 6-column slices: [(sender, slice)].

    Party 0 (first holder) gets party 2's E_2 = enc(X_2 / s) - R_2 and party 1's G_1 = enc(X_1 / s) - B; party 1
    (second holder) gets party 0's F_0 = [enc(X_0 / s) | E_2] - A (12 columns); party 2 gets none."""
    out = []
    for phase, src, dst, t in received(results, rank, "covariance"):
        if src < 3 and t.dtype == torch.int64 and t.numel() % N == 0 and t.numel() >= N * 6 and "/products" in phase:
            t = t.reshape(N, -1)
            out += [(src, t[:, c:c + 6]) for c in range(0, t.shape[1], 6)]
    return out


def test_the_pooled_attack_fails_against_the_covariance_protocol(results):
    s = total_norm2() ** 0.5                  # every party knows ||X||_F^2 (the total variance is an output)
    for rank in range(3):
        msgs = received(results, rank, "covariance")
        truth = others_gram(rank)
        assert nystrom_attack(msgs, rank) is None
        # What arrives: ring elements (masked column blocks at the holders, dealer seeds and shares, masked sums,
        # the rotation's uniform bit-product messages, the 128-bit words of the own rows of V), the seed (holders),
        # the k eigenvalues, X V and variance totals; no float d x k block (issue 39: W went to every party).
        floats = [t for phase, src, dst, t in msgs if t.dtype.is_floating_point]
        assert all(t.numel() in (K, N * K, K + 1, 1) for t in floats), [t.shape for t in floats]
        # P's seed: to the second holder only (the first draws it).
        assert bool([t for phase, src, dst, t in msgs if phase.endswith("/seed")]) == (rank == 1)
        blocks = column_messages(results, rank)
        # Each party's columns are opened once, to the first holder; the first holder's masked share to the second.
        assert sorted(src for src, _ in blocks) == {0: [1, 2], 1: [0, 0], 2: []}[rank]
        errors = []
        # 1. The output: U diag(theta) U^T minus its own Gram matrix.
        U, theta = results[rank]["out"]["covariance"]["components"], results[rank]["out"]["covariance"]["eigenvalues"]
        errors.append(rel(U @ torch.diag(theta) @ U.T - own(rank) @ own(rank).T, truth))
        # 2. Every received block read as the partner's fixed-point columns: their Gram matrix, their sum, and the
        #    columns themselves by least squares on its own columns (the pooled data is correlated across parties).
        Zs = [E.to(torch.float64) / 2 ** FRAC * s for _, E in blocks]
        if Zs:
            errors.append(rel(sum(Z @ Z.T for Z in Zs), truth))
        for Z in Zs:
            for m in range(3):
                if m != rank:
                    errors.append(rel(Z @ Z.T, own(m) @ own(m).T))
                    fit = own(rank) @ torch.linalg.lstsq(own(rank), Z).solution
                    errors.append(rel(fit, own(m)))
        # 3. Every received d x d ring tensor (masked-sum parts, the bit products of the share rotation) read as
        #    the covariance C or its rotation P C P^T, at the 60 and 40 fractional bits the protocol uses.
        Xc = torch.cat([own(i) for i in range(3)], 1)
        C = Xc.T @ Xc
        P = haar_rotation(18, covariance_seed(results))
        square = [t.reshape(18, 18) for phase, src, dst, t in msgs if t.dtype == torch.int64 and t.numel() == 18 * 18]
        assert square or rank == 2            # the third party takes no part once it has sent its columns
        for t in square:
            for bits in (60, 40):
                view = t.to(torch.float64) / 2 ** bits * s ** 2
                errors += [rel(view, C), rel(P.T @ view @ P, C)]
        assert len(errors) > (1 if rank < 2 else 0) and min(errors) > 0.3, (rank, min(errors))


def test_the_coordinator_learns_the_normalised_spectrum_and_not_the_covariance(results):
    d = 18
    P = haar_rotation(d, covariance_seed(results))
    Xc = torch.cat([own(i) for i in range(3)], 1)
    C = Xc.T @ Xc
    view = P @ C @ P.T / total_norm2()          # what its masked sum opens to (decoded)
    coordinator = 3
    for phase, src, dst, t in received(results, coordinator, "covariance"):
        assert "/seed" not in phase and (not t.dtype.is_floating_point or t.numel() <= K + 1), (phase, t.shape)
    got = results[coordinator]["out"]["covariance"]["eigenvalues"]
    torch.testing.assert_close(got, torch.linalg.eigvalsh(view).flip(0)[:K], rtol=1e-7, atol=1e-9)
    assert results[coordinator]["out"]["covariance"]["components"] is None
    assert rel(view * total_norm2(), C) > 0.5
    # The stated trust assumption: a holder (which knows P and ||X||_F; since issue 39 the third party does not know P)
    # colluding with the coordinator gets C exactly; see docs/pca.md.
    torch.testing.assert_close(P.T @ view @ P * total_norm2(), C, rtol=1e-9, atol=1e-9)


def test_the_dealer_or_the_other_holder_colluding_with_the_first_holder_unmasks_columns(results):
    # The stated trust: the coordinator (the dealer) must not collude with a holder, nor the two holders with each
    # other. Party 0 receives E_2 = enc(X_2 / s) - R_2 from party 2; the dealer drew R_2 from the seed it sent to
    # party 2 and to party 1 (the second holder).
    from vfltorch.comm.sharing import _stream_from, _uniform

    (E2,) = [E for src, E in column_messages(results, 0) if src == 2]
    coordinator = 3
    to_party2 = [t for phase, src, dst, t in received(results, 2, "covariance")
                 if src == coordinator and "/products" in phase][0]
    to_holder = [t for phase, src, dst, t in received(results, 1, "covariance")
                 if src == coordinator and "/products" in phase][0]
    for seed in (to_party2[:2], to_holder[4:6]):        # the dealer's, and the second holder's copy of it
        R2 = _uniform(_stream_from(seed), (N, 6))
        X2 = (E2 + R2).to(torch.float64) / 2 ** FRAC * total_norm2() ** 0.5
        torch.testing.assert_close(X2, own(2), rtol=0, atol=1e-6)
    # Without the seed the same message is far from party 2's columns.
    alone = E2.to(torch.float64) / 2 ** FRAC * total_norm2() ** 0.5
    assert rel(alone, own(2)) > 10
    # The dealer itself received no column block during the products (only masked-sum parts later).
    assert not [t for phase, src, dst, t in received(results, coordinator, "covariance") if "/products" in phase]


@pytest.mark.parametrize("name", ["covariance", "pairwise"])
def test_the_second_holder_cannot_read_another_partys_block_from_the_reduction(results, name):
    # The second holder's share of C / s^2 = S0^T S0 + S1^T S1 + cross terms (sharing.holder_gram) holds R_2, its
    # own columns and the dealer's uniform c_1: it must show neither party 2's own block Y_2^T Y_2 nor the cross
    # block Y_1^T Y_2 (an earlier version reduced the shares at party 1 and had to re-randomise first). Party 1
    # reads its share (recorded as it enters the rotation) and every received d x d ring tensor at 60 bits.
    s2 = total_norm2()
    # With covariance_sharing='pairwise' the shares of parties 1..Q-1 are summed at party 1 (a masked sum that reveals
    # its total): party 0's share is zero outside its own rows and columns, so without sharing.rerandomise that total
    # would carry party 2's own block and the cross block in the clear.
    (share,) = [h for h in results[1]["held"][name] if h is not None]
    square = [t.reshape(18, 18) for phase, src, dst, t in received(results, 1, name)
              if t.dtype == torch.int64 and t.numel() == 18 * 18]
    blocks = {(2, 2): own(2).T @ own(2), (1, 2): own(1).T @ own(2)}
    for (a, b), truth in blocks.items():
        rows, cols = slice(BOUNDS[a], BOUNDS[a + 1]), slice(BOUNDS[b], BOUNDS[b + 1])
        errors = [rel(t[rows, cols].to(torch.float64) / 2 ** 60 * s2, truth) for t in [share, *square]]
        assert min(errors) > 0.3, ((a, b), min(errors))
    # Party 0 (the other holder) keeps its own share; the coordinator holds none.
    assert [h is not None for h in results[0]["held"][name]] == [True] and name not in results[2]["held"]


def colluding_holders_error(results, name):
    """Parties 0 and 1 pool everything they received in fit ``name`` (and their own columns) and read party 2's
    columns from every n-row ring block, unmasked by every pair of received words taken as a mask seed, directly
    or by least squares on their own columns: the smallest relative error."""
    from vfltorch.comm.sharing import _stream_from, _uniform

    s = total_norm2() ** 0.5
    pooled_msgs = received(results, 0, name) + received(results, 1, name)
    blocks = [t.reshape(N, -1) for phase, src, dst, t in pooled_msgs
              if t.dtype == torch.int64 and t.numel() % N == 0 and t.numel() >= N * 6 and "/products" in phase]
    assert blocks                                        # party 2's masked columns did reach them
    seeds = [t.reshape(-1) for phase, src, dst, t in pooled_msgs if t.dtype == torch.int64 and t.numel() >= 2]
    known = torch.cat([own(0), own(1)], 1)
    errors = []
    for E in blocks:
        for c in range(0, E.shape[1], 6):
            Z = E[:, c:c + 6]
            views = [Z.to(torch.float64) / 2 ** FRAC * s]
            for seed in seeds:
                for i in range(0, min(int(seed.numel()), 8) - 1, 2):
                    views.append((Z + _uniform(_stream_from(seed[i:i + 2]), (N, 6))).to(torch.float64) / 2 ** FRAC * s)
            for V in views:
                fit = known @ torch.linalg.lstsq(known, V).solution
                errors += [rel(V, own(2)), rel(fit, own(2))]
    return min(errors)


def test_pairwise_sharing_gives_the_same_result_and_two_colluding_holders_learn_no_columns(results):
    """covariance_sharing='pairwise' (each party's masked columns to every other party, no holder pair to trust):
    the same components as the default; parties 0 and 1 pooling what they received read party 2's columns under
    the default (its two holders must not collude) and not under 'pairwise'."""
    for rank in range(3):
        a = results[rank]["out"]["covariance"]["components"]
        b = results[rank]["out"]["pairwise"]["components"]
        torch.testing.assert_close((a.T @ b).abs(), torch.eye(K, dtype=a.dtype), rtol=0, atol=1e-6)
    assert colluding_holders_error(results, "covariance") < 1e-6
    assert colluding_holders_error(results, "pairwise") > 0.5
