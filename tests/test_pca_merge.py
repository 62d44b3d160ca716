"""The sign-free subspace merge: invariant to local signs, and on real data no worse than the best party alone."""

import math
import sys
from pathlib import Path

import pytest
import torch

from conftest import needs_dataset
from vfltorch.pca import (aligned_distances, merge, pooled_pca, power_iteration, principal_angles, shared_start,
                          subspace_merge)
from vfltorch.pca.linalg import center_columns, gram_operator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))


def local_pairs(m=4, n=30, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    vecs = torch.stack([torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))[0] for _ in range(m)])
    vals = torch.rand(m, k, generator=g, dtype=torch.float64).sort(dim=1, descending=True).values * 10 + 0.1
    return vecs, vals


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("kw", [{}, {"weight_scaling": True}, {"power": 0.5}])
def test_flipping_any_local_vector_leaves_the_merge_unchanged(k, kw):
    vecs, vals = local_pairs(k=k)
    ref = shared_start(30, k, 0, 1, device="cpu")
    base = merge(vecs, vals, reference=ref, **kw)
    g = torch.Generator().manual_seed(5)
    for _ in range(6):
        signs = torch.randint(0, 2, (4, 1, k), generator=g).to(torch.float64) * 2 - 1
        assert (signs < 0).any()
        torch.testing.assert_close(merge(vecs * signs, vals, reference=ref, **kw), base, rtol=0, atol=1e-12)
        # without a reference the result is still a fixed function of the inputs (largest entry positive)
        torch.testing.assert_close(merge(vecs * signs, vals, **kw), merge(vecs, vals, **kw), rtol=0, atol=1e-12)
    # The paper's merge is not sign-free: flipping one member's vector changes it.
    flipped = vecs.clone()
    flipped[0] = -flipped[0]
    assert aligned_distances(merge(flipped, vals, mode="paper", **kw), merge(vecs, vals, mode="paper", **kw)).max() > 1e-3


def test_subspace_merge_is_the_leading_eigenvectors_of_the_weighted_projector_sum():
    vecs, vals = local_pairs(k=2)
    M = sum(vecs[i] @ torch.diag(vals[i]) @ vecs[i].T for i in range(4))   # eigenvalue weights, unnormalised
    lam, V = torch.linalg.eigh(M)
    U = subspace_merge(vecs, vals)
    assert aligned_distances(U, V.flip(1)[:, :2]).max() < 1e-10
    torch.testing.assert_close(U.T @ U, torch.eye(2, dtype=torch.float64), rtol=0, atol=1e-12)
    # k = 1: the leading eigenvector of sum_i w_i a_i a_i^T with the paper's weights w_i = alpha_i / sum alpha
    v1, a1 = vecs[:, :, :1], vals[:, :1]
    w = a1[:, 0] / a1.sum()
    M1 = sum(w[i] * v1[i] @ v1[i].T for i in range(4))
    top = torch.linalg.eigh(M1)[1][:, -1:]
    assert aligned_distances(subspace_merge(v1, a1), top).max() < 1e-10
    with pytest.raises(ValueError, match="unknown merge"):
        merge(vecs, vals, mode="average")


def test_one_member_merge_returns_its_own_vectors():
    vecs, vals = local_pairs(m=1, k=3)
    assert aligned_distances(merge(vecs, vals), vecs[0]).max() < 1e-12


# --------------------------------------------------------------- real datasets
# The paper's structured datasets and numbers of clients (vfedpca_common.STRUCTURED) plus credit_default and
# Yale; every party runs Algorithm 1 (10 local iterations from the shared start) on its centred columns.
# Known exception: college with p = 5 and k = 1. Party 1's second local eigenvalue is 0.54 of its first and
# the pooled leading direction needs it; a one-vector payload cannot carry it (best party 0.303, merge 0.474).
KNOWN_SHORTFALL = {("college", 5, 1)}


def merge_against_best_party(name, ps, ks=(1, 3)):
    from vfedpca_common import party_columns, pooled_matrix

    X = pooled_matrix(name)
    n = X.shape[0]
    rows = []
    for k in ks:
        G = pooled_pca(X, k)[0]
        ref = shared_start(n, k, 0, 1, device="cpu")
        for p in ps:
            vecs, vals = [], []
            for i in range(p):
                Xi = center_columns(party_columns(name, p, i))[0]
                a, alpha = power_iteration(gram_operator(Xi), ref, 10)
                vecs.append(a)
                vals.append(alpha)
            best = min(float(principal_angles(a, G).max()) for a in vecs)
            got = float(principal_angles(merge(torch.stack(vecs), torch.stack(vals), reference=ref), G).max())
            paper = float(principal_angles(merge(torch.stack(vecs), torch.stack(vals), mode="paper"), G).max())
            rows.append((k, p, best * 180 / math.pi, got * 180 / math.pi, paper * 180 / math.pi))
    return rows


def check_dataset(name, ps, ks=(1, 3)):
    for k, p, best, got, paper in merge_against_best_party(name, ps, ks):
        if (name, p, k) in KNOWN_SHORTFALL:
            assert got > best        # still documented as it is; if this starts passing, drop the exception
            continue
        assert got <= best + 1e-6, (name, k, p, best, got, paper)


@pytest.mark.parametrize("name", [pytest.param(d, marks=needs_dataset(d))
                                  for d in ("sonar", "vehicle", "pima", "glaucoma", "college")])
def test_subspace_merge_is_no_worse_than_the_best_single_party(name):
    from vfedpca_common import STRUCTURED

    check_dataset(name, STRUCTURED[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(d, marks=needs_dataset(d)) for d in ("credit_default", "yale")])
def test_subspace_merge_is_no_worse_than_the_best_single_party_large(name):
    check_dataset(name, [3, 5, 10])
