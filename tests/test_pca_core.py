"""PCA building blocks in one process: power iteration, merges, data update, kernels, metrics, Q = 1 twins."""

import math

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
import torch

from vfltorch.comm import Federation
from vfltorch.data import VFLInputError
from vfltorch.pca import (ExactFederatedKernelPCA, ExactFederatedPCA, VFedAKPCA, VFedPCA, aligned_distances,
                          center_kernel, eigenvalue_weights, gaussian_data, kernel_from_gram, kernel_matrix, merge,
                          neighbours, orthonormalize, pooled_kernel_pca, pooled_pca, power_iteration,
                          principal_angles, scale_weights, shared_start, unaligned_distances, update_local_data)
from vfltorch.pca.linalg import gram_operator


def low_rank_data(n=40, f=16, seed=0, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(n, 4, generator=g, dtype=torch.float64) * torch.tensor([5.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    W = torch.randn(4, f, generator=g, dtype=torch.float64)
    return Z @ W + noise * torch.randn(n, f, generator=g, dtype=torch.float64) + 3.0


def plain_power(A, b, steps):
    for _ in range(steps):
        b = A @ b
        b = b / b.norm()
    return b


# ---------------------------------------------------------------- linear algebra
def test_power_iteration_is_algorithm_1_for_one_vector():
    X = low_rank_data()
    A = X @ X.T
    b0 = shared_start(40, 1, 3, 1, device="cpu")
    a, alpha = power_iteration(gram_operator(X), b0, 7)
    expected = plain_power(A, b0 / b0.norm(), 7)
    torch.testing.assert_close(a, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(alpha, (expected.T @ A @ expected).reshape(1), rtol=1e-12, atol=0)


def test_block_power_iteration_finds_the_leading_eigenvectors():
    X = low_rank_data()
    lam, V = torch.linalg.eigh(X @ X.T)
    U, alpha = power_iteration(gram_operator(X), shared_start(40, 3, 0, 1, device="cpu"), 60)
    assert aligned_distances(U, V.flip(1)[:, :3]).max() < 1e-8
    torch.testing.assert_close(alpha, lam.flip(0)[:3], rtol=1e-10, atol=0)
    torch.testing.assert_close(U.T @ U, torch.eye(3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_orthonormalize_keeps_directions():
    Y = torch.tensor([[3.0, 1.0], [4.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    Q = orthonormalize(Y)
    torch.testing.assert_close(Q[:, 0], Y[:, 0] / 5.0)
    assert float(Q[:, 1] @ Y[:, 1]) > 0
    torch.testing.assert_close(orthonormalize(-Y[:, :1]), -Y[:, :1] / 5.0)


# ------------------------------------------------------------------------ merges
def test_eigenvalue_weights_and_weight_scaling_follow_algorithm_4():
    alpha = torch.tensor([[4.0], [1.0], [3.0], [2.0]], dtype=torch.float64)
    w = eigenvalue_weights(alpha)
    torch.testing.assert_close(w.reshape(-1), torch.tensor([0.4, 0.1, 0.3, 0.2], dtype=torch.float64))
    eta = 0.25  # the mean of four weights summing to one
    expected = torch.tensor([0.4 * (1 + eta), 0.1 * (1 - eta), 0.3 * (1 + eta), 0.2 * (1 - eta)], dtype=torch.float64)
    torch.testing.assert_close(scale_weights(w).reshape(-1), expected)
    # Odd count: the larger floor(5/2) = 2 are enhanced; one member is left alone.
    w5 = eigenvalue_weights(torch.tensor([[5.0], [1.0], [4.0], [2.0], [3.0]], dtype=torch.float64))
    s5 = scale_weights(w5).reshape(-1) / w5.reshape(-1)
    torch.testing.assert_close(s5, torch.tensor([1.2, 0.8, 1.2, 0.8, 0.8], dtype=torch.float64))
    one = torch.ones(1, 1, dtype=torch.float64)
    torch.testing.assert_close(scale_weights(one), one)
    # sqrt weights (VFedAKPCA)
    torch.testing.assert_close(eigenvalue_weights(torch.tensor([[9.0], [1.0]], dtype=torch.float64), 0.5).reshape(-1),
                               torch.tensor([0.75, 0.25], dtype=torch.float64))


def test_merge_is_the_weighted_sum_then_normalised():
    g = torch.Generator().manual_seed(1)
    vecs = torch.randn(3, 10, 1, generator=g, dtype=torch.float64)
    vals = torch.tensor([[2.0], [1.0], [1.0]], dtype=torch.float64)
    u = vecs[0] * 0.5 + vecs[1] * 0.25 + vecs[2] * 0.25
    torch.testing.assert_close(merge(vecs, vals, mode="paper"), u / u.norm())
    # k = 2: per-column weights, then Gram-Schmidt with positive diagonal.
    vecs2 = torch.randn(2, 10, 2, generator=g, dtype=torch.float64)
    vals2 = torch.tensor([[3.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    raw = torch.stack([0.75 * vecs2[0, :, 0] + 0.25 * vecs2[1, :, 0], 0.5 * vecs2[0, :, 1] + 0.5 * vecs2[1, :, 1]], 1)
    U = merge(vecs2, vals2, mode="paper")
    torch.testing.assert_close(U[:, 0], raw[:, 0] / raw[:, 0].norm())
    assert principal_angles(U, raw).max() < 1e-12


def test_neighbourhoods_of_the_decentralised_graphs():
    parties = [0, 1, 2, 3, 4]
    assert neighbours("complete", parties, 2) == [0, 1, 3, 4]
    assert neighbours("ring", parties, 0) == [1, 4] and neighbours("ring", parties, 3) == [2, 4]
    assert neighbours("star", parties, 0) == [1, 2, 3, 4] and neighbours("star", parties, 3) == [0]
    assert neighbours("ring", [0, 1], 1) == [0] and neighbours("ring", [5], 5) == []


# ----------------------------------------------------------------- data update
def test_data_update_is_the_papers_formula_for_one_vector_and_idempotent():
    X = low_rank_data()
    u = shared_start(40, 1, 0, 1, device="cpu")
    u = u / u.norm()
    M = X.T @ u
    literal = X @ (M @ M.T) / torch.linalg.matrix_norm(M @ M.T)
    X1 = update_local_data(X, u)
    torch.testing.assert_close(X1, literal, rtol=1e-12, atol=1e-12)
    other = torch.randn(40, 1, dtype=torch.float64)
    torch.testing.assert_close(update_local_data(X1, other), X1, rtol=1e-10, atol=1e-10)
    # k = 2: the projector onto span(X^T U); stays rank 2 and well conditioned.
    U = orthonormalize(torch.randn(40, 2, dtype=torch.float64))
    X2 = update_local_data(X, U)
    assert torch.linalg.matrix_rank(X2) == 2
    torch.testing.assert_close(update_local_data(X2, U), X2, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ Q = 1 twins
def test_one_party_vfedpca_is_plain_power_iteration():
    X = low_rank_data()
    Xc = X - X.mean(0)
    b0 = shared_start(40, 1, 0, 1, device="cpu")
    one = VFedPCA(1, periods=1, local_iters=4).fit(X)
    torch.testing.assert_close(torch.as_tensor(one.sample_components_), plain_power(Xc @ Xc.T, b0 / b0.norm(), 4), rtol=0, atol=1e-12)
    # Period 2 adds one power step on the rank-one updated data; later periods change nothing (idempotent update).
    for periods in (2, 5):
        many = VFedPCA(1, periods=periods, local_iters=4, warm_start=True).fit(X)
        torch.testing.assert_close(torch.as_tensor(many.sample_components_), plain_power(Xc @ Xc.T, b0 / b0.norm(), 5),
                                   rtol=0, atol=1e-12)
    assert one.rounds_ == 1 and one.bytes_ == 0


def test_one_party_exact_pca_equals_svd():
    X = low_rank_data(f=9)
    m = ExactFederatedPCA(3).fit(X)
    U = torch.linalg.svd(X - X.mean(0), full_matrices=False)[0][:, :3]
    assert m.converged_ and aligned_distances(m.sample_components_, U).max() < 1e-6
    assert m.explained_variance_ratio_.sum() <= 1.0


def test_one_party_kernel_methods_equal_pooled_kernel_pca():
    from sklearn.decomposition import KernelPCA

    X = low_rank_data(f=6) / 10
    G, lam = pooled_kernel_pca(X, 2, kernel="rbf", gamma=0.5)
    exact = ExactFederatedKernelPCA(2, kernel="rbf", gamma=0.5).fit(X)
    ak = VFedAKPCA(2, kernel="rbf", gamma=0.5).fit(X)
    assert aligned_distances(exact.sample_components_, G).max() < 1e-10
    assert aligned_distances(ak.sample_components_, G).max() < 1e-10
    sk = KernelPCA(2, kernel="rbf", gamma=0.5).fit(X.numpy())
    assert aligned_distances(exact.sample_components_, torch.as_tensor(sk.eigenvectors_)).max() < 1e-8
    np.testing.assert_allclose(exact.eigenvalues_, sk.eigenvalues_, rtol=1e-8)      # numpy, as scikit-learn's


def test_one_party_transform_matches_scikit_learn():
    from sklearn.decomposition import PCA

    X = low_rank_data(f=9)
    X_new = low_rank_data(n=7, f=9, seed=5)
    m = ExactFederatedPCA(2).fit(X)
    sk = PCA(2).fit(X.numpy())
    ours, theirs = m.transform(X_new), torch.as_tensor(sk.transform(X_new.numpy()))
    signs = torch.sign((ours * theirs).sum(0))
    torch.testing.assert_close(ours * signs, theirs, rtol=1e-6, atol=1e-6)
    train = m.transform()
    torch.testing.assert_close(train.abs(), torch.as_tensor(sk.transform(X.numpy())).abs(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(m.explained_variance_, sk.explained_variance_, rtol=1e-8, atol=0)


# ----------------------------------------------------------------------- kernels
@pytest.mark.parametrize("kernel", ["linear", "rbf", "poly", "sigmoid"])
def test_kernels_from_the_gram_matrix_match_scikit_learn(kernel):
    from sklearn.metrics.pairwise import pairwise_kernels

    X = low_rank_data(n=12, f=5) / 10
    params = {} if kernel == "linear" else {"gamma": 0.3}
    if kernel in ("poly", "sigmoid"):
        params.update(coef0=1.0, **({"degree": 3} if kernel == "poly" else {}))
    expected = pairwise_kernels(X.numpy(), metric=kernel, **params)
    got = kernel_matrix(X, kernel, gamma=0.3, degree=3, coef0=1.0)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_rbf_of_pooled_data_is_the_product_of_the_parties_rbf_kernels():
    X = low_rank_data(n=15, f=9) / 10
    parts = [X[:, :2], X[:, 2:7], X[:, 7:]]
    product = torch.ones(15, 15, dtype=torch.float64)
    for P in parts:
        product = product * kernel_matrix(P, "rbf", gamma=0.7)
    G = sum(P @ P.T for P in parts)
    torch.testing.assert_close(kernel_from_gram(G, "rbf", gamma=0.7), product, rtol=1e-10, atol=1e-12)
    K = kernel_matrix(X, "rbf", gamma=0.7)
    H = torch.eye(15, dtype=torch.float64) - 1.0 / 15
    torch.testing.assert_close(center_kernel(K), H @ K @ H, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------- metrics
def test_distances_and_angles():
    G = orthonormalize(torch.randn(20, 2, dtype=torch.float64))
    assert aligned_distances(-G, G).max() < 1e-12
    assert unaligned_distances(-G, G, reference=G).min() > 1.99
    theta = 0.3
    rot = G @ torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
                           dtype=torch.float64)
    assert principal_angles(rot, G).max() < 1e-12                     # same plane
    other = orthonormalize(torch.cat([G[:, :1], torch.randn(20, 1, dtype=torch.float64)], 1))
    w = G[:, 0] * math.cos(1e-7) + other[:, 1] * math.sin(1e-7)        # 1e-7 rad away from g_0
    torch.testing.assert_close(principal_angles(w[:, None], G[:, :1]), torch.tensor([1e-7], dtype=torch.float64),
                               rtol=1e-6, atol=0)
    expected = torch.tensor([2 * math.sin(0.5e-7)], dtype=torch.float64)
    torch.testing.assert_close(aligned_distances(w[:, None], G[:, :1]), expected, rtol=1e-5, atol=0)


def test_pooled_pca_wide_and_tall_agree():
    X = low_rank_data(n=10, f=60)
    U1, l1 = pooled_pca(X, 2)
    U2, S, _ = torch.linalg.svd(X - X.mean(0), full_matrices=False)
    assert aligned_distances(U1, U2[:, :2]).max() < 1e-8
    torch.testing.assert_close(l1, (S ** 2)[:2])


def test_synthetic_data_shapes_and_seed():
    a = gaussian_data(50, 20, "mixture", seed=1)
    assert a.shape == (20, 50) and torch.isfinite(a).all() and (a > 0).all()
    torch.testing.assert_close(a, gaussian_data(50, 20, "mixture", seed=1))
    wide = gaussian_data(600, 5, "mixture", seed=3)
    torch.testing.assert_close(gaussian_data(600, 5, "mixture", seed=3, columns=range(200, 520)), wide[:, 200:520])
    s = gaussian_data(30, 10, "single", seed=0)
    assert s.max() <= 1 / math.sqrt(2 * math.pi) + 1e-12
    with pytest.raises(ValueError, match="single' or 'mixture"):
        gaussian_data(3, 3, "uniform")


# -------------------------------------------------------------------- validation
@pytest.mark.parametrize("make,message", [
    (lambda: VFedPCA(1, topology="mesh"), "unknown topology 'mesh'"),
    (lambda: VFedPCA(0), "n_components must be a positive integer"),
    (lambda: VFedPCA(50), "only 40 samples"),
    (lambda: VFedPCA(1, periods=0), "periods must be a positive integer"),
    (lambda: VFedAKPCA(1, kernel="cosine"), "unknown kernel 'cosine'"),
    (lambda: ExactFederatedPCA(1, sum_topology="mesh"), "unknown sum topology"),
])
def test_bad_hyperparameters_say_what_to_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make().fit(low_rank_data())


def test_bad_data_says_what_to_fix():
    with pytest.raises(VFLInputError, match="2-D array"):
        VFedPCA().fit(torch.zeros(5))
    bad = low_rank_data()
    bad[3, 2] = float("nan")
    with pytest.raises(VFLInputError, match="NaN or inf"):
        ExactFederatedPCA().fit(bad)
    with pytest.raises(NotFittedError, match="not fitted"):
        VFedPCA().transform()
    with pytest.raises(VFLInputError, match="expecting 16 features"):
        ExactFederatedPCA().fit(low_rank_data()).transform(torch.zeros(3, 4, dtype=torch.float64))


def test_narrow_parties_are_warned_about():
    with pytest.warns(UserWarning, match="one column: exactly"):
        VFedPCA(1, fed=Federation.local()).fit(low_rank_data(f=1))


def test_exact_krylov_warns_and_says_not_converged_when_max_rounds_stops_it():
    X = low_rank_data(noise=1.0)
    with pytest.warns(UserWarning, match="stopped at max_rounds=2"):
        est = ExactFederatedPCA(2, protocol="krylov", max_rounds=2, oversample=0).fit(X)
    assert est.converged_ is False and est.rounds_ == 2 and len(est.residuals_) == 2
    done = ExactFederatedPCA(2, protocol="krylov").fit(X)
    assert done.converged_ is True and done.residuals_[-1] <= 1e-10
    # One party alone: both protocols are the local PCA (no coordinator needed, no leak warning).
    rotated = ExactFederatedPCA(2).fit(X)
    assert rotated.converged_ is True
    assert aligned_distances(rotated.sample_components_, done.sample_components_).max() < 1e-8
    with pytest.raises(VFLInputError, match="unknown protocol"):
        ExactFederatedPCA(2, protocol="lanczos").fit(X)


def test_top_eigenpairs_iterative_path_matches_the_dense_solver(monkeypatch):
    import vfltorch.pca.linalg as linalg

    X = low_rank_data(n=300, f=40, noise=0.5)
    K = center_kernel(kernel_matrix(X, "rbf", gamma=0.02))
    lam, V = torch.linalg.eigh(K)
    monkeypatch.setattr(linalg, "DENSE_LIMIT", 100)          # force block subspace iteration at n = 300
    U, theta = linalg.top_eigenpairs(K, 3, reference=shared_start(300, 3, 0, 1, device="cpu"))
    torch.testing.assert_close(theta, lam.flip(0)[:3], rtol=1e-10, atol=0)
    assert aligned_distances(U, V.flip(1)[:, :3]).max() < 1e-8
    assert ((U * shared_start(300, 3, 0, 1, device="cpu")).sum(0) >= 0).all()


def test_numpy_input_components_and_inverse_transform_match_scikit_learn():
    from sklearn.decomposition import PCA

    X = low_rank_data(noise=0.5).numpy()
    new = low_rank_data(n=9, seed=4, noise=0.5).numpy()
    sk = PCA(3).fit(X)
    est = ExactFederatedPCA(3).fit(X)                       # numpy in, Q = 1
    assert isinstance(est.components_, np.ndarray) and est.components_.shape == sk.components_.shape
    signs = torch.as_tensor(np.sign((est.components_ * sk.components_).sum(1)))
    np.testing.assert_allclose(est.components_ * signs[:, None].numpy(), sk.components_, rtol=1e-8, atol=1e-10)
    scores = est.transform(new)                             # numpy out
    assert type(scores) is type(est.inverse_transform(scores)) is type(new)
    torch.testing.assert_close(torch.as_tensor(scores) * signs, torch.as_tensor(sk.transform(new)), rtol=1e-8,
                               atol=1e-8)
    torch.testing.assert_close(torch.as_tensor(est.inverse_transform(scores)),
                               torch.as_tensor(sk.inverse_transform(sk.transform(new))), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(est.explained_variance_, sk.explained_variance_, rtol=1e-8, atol=0)
    with pytest.raises(VFLInputError, match="no inverse_transform"):
        ExactFederatedKernelPCA(2, kernel="rbf", gamma=0.1).fit(X).inverse_transform(scores[:, :2])


@pytest.mark.parametrize("kernel", ["rbf", "poly", "linear"])
def test_exact_kernel_pca_transforms_new_rows_as_scikit_learn(kernel):
    from sklearn.decomposition import KernelPCA

    X = low_rank_data(noise=0.5).numpy()
    new = low_rank_data(n=9, seed=4, noise=0.5).numpy()
    sk = KernelPCA(2, kernel=kernel, gamma=0.01, degree=3, coef0=1.0, eigen_solver="dense").fit(X)
    est = ExactFederatedKernelPCA(2, kernel=kernel, gamma=0.01).fit(X)
    expected = torch.as_tensor(sk.transform(new))
    got = torch.as_tensor(est.transform(new))               # numpy in, numpy out
    signs = torch.sign((got * expected).sum(0))
    torch.testing.assert_close(got * signs, expected, rtol=1e-7, atol=1e-7)
    # the training rows through the new-row path give the training embedding U sqrt(lambda)
    torch.testing.assert_close(torch.as_tensor(est.transform(X)), torch.as_tensor(est.transform()), rtol=1e-7,
                               atol=1e-7)


def test_estimators_are_scikit_learn_citizens():
    from sklearn.base import clone
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    for cls in (ExactFederatedPCA, VFedPCA, VFedAKPCA, ExactFederatedKernelPCA):
        est = cls(2)
        params = est.get_params()
        assert params["n_components"] == 2 and "seed" in params
        copy = clone(est.set_params(n_components=3))
        assert copy is not est and copy.get_params() == est.get_params() and copy.n_components == 3
    assert ExactFederatedPCA().get_params()["protocol"] == "auto"
    X = low_rank_data(noise=0.5).numpy()
    scores = make_pipeline(StandardScaler(), ExactFederatedPCA(2)).fit_transform(X)
    assert tuple(scores.shape) == (X.shape[0], 2)


def test_whiten_matches_scikit_learn():
    from sklearn.decomposition import PCA

    X = low_rank_data(noise=0.5).numpy()
    new = low_rank_data(n=9, seed=4, noise=0.5).numpy()
    sk = PCA(3, whiten=True).fit(X)
    est = ExactFederatedPCA(3, whiten=True).fit(X)
    signs = torch.as_tensor(np.sign((est.components_ * sk.components_).sum(1)))
    T = torch.as_tensor
    torch.testing.assert_close(T(est.transform(new)) * signs, T(sk.transform(new)), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(T(est.transform()) * signs, T(sk.transform(X)), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(T(est.inverse_transform(est.transform(new))),
                               torch.as_tensor(sk.inverse_transform(sk.transform(new))), rtol=1e-8, atol=1e-8)


def test_training_scores_versus_transform_of_the_training_rows():
    X = low_rank_data(noise=1.0)
    exact = ExactFederatedPCA(2).fit(X)
    torch.testing.assert_close(exact.transform(X), exact.transform(), rtol=1e-9, atol=1e-9)
    approx = VFedPCA(2, periods=1, local_iters=2).fit(X)         # far from converged on purpose
    U, s = torch.as_tensor(approx.sample_components_), torch.as_tensor(approx.singular_values_)
    local, shipped = approx.transform(), approx.transform(X)
    assert (local - shipped).abs().max() > 1e-3                  # they differ for an approximate U ...
    Xc = X - X.mean(0)
    residual = (Xc @ (Xc.T @ U) - U * s ** 2) / s
    torch.testing.assert_close(shipped - local, residual, rtol=1e-9, atol=1e-9)   # ... by the residual
    torch.testing.assert_close((U * shipped).sum(0), s, rtol=1e-9, atol=1e-9)     # same projections on U
    torch.testing.assert_close((U * local).sum(0), s, rtol=1e-9, atol=1e-9)
