"""L-BFGS two-loop recursion against the dense BFGS inverse-Hessian update, and the curvature memory."""

import pytest
import torch

from vfltorch.linear.lbfgs import CurvatureMemory, two_loop


def dense_bfgs_inverse(pairs, d):
    """H_{k+1} = (I - rho s v^T) H_k (I - rho v s^T) + rho s s^T from H_0 = (s^T v / v^T v) I of the newest pair."""
    s_new, v_new = pairs[-1]
    H = float(s_new @ v_new) / float(v_new @ v_new) * torch.eye(d, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for s, v in pairs:                      # oldest first
        rho = 1.0 / float(v @ s)
        H = (eye - rho * torch.outer(s, v)) @ H @ (eye - rho * torch.outer(v, s)) + rho * torch.outer(s, s)
    return H


def random_pairs(d, m, seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64)      # SPD, like (1/4) X^T X / n + lambda I
    pairs = []
    for _ in range(m):
        s = torch.randn(d, generator=g, dtype=torch.float64)
        pairs.append((s, A @ s))
    return A, pairs, torch.randn(d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("d,m,seed", [(7, 1, 0), (7, 5, 1), (12, 10, 2), (3, 6, 3)])
def test_two_loop_equals_dense_bfgs(d, m, seed):
    _, pairs, g = random_pairs(d, m, seed)
    H = dense_bfgs_inverse(pairs, d)
    torch.testing.assert_close(two_loop(g, pairs), H @ g, rtol=1e-10, atol=1e-12)


def test_two_loop_satisfies_the_newest_secant_condition():
    _, pairs, _ = random_pairs(9, 4, 5)
    s, v = pairs[-1]
    torch.testing.assert_close(two_loop(v, pairs), s, rtol=1e-10, atol=1e-12)   # H_t v_t = s_t


def test_no_pairs_is_an_sgd_step():
    g = torch.arange(5, dtype=torch.float64)
    torch.testing.assert_close(two_loop(g, []), g)


def test_memory_keeps_the_last_M_pairs_and_rejects_non_positive_curvature():
    _, pairs, g = random_pairs(6, 8, 7)
    mem = CurvatureMemory(3)
    for s, v in pairs:
        assert mem.push(s, v)
    assert len(mem) == 3 and mem.accepted == 8
    torch.testing.assert_close(mem.direction(g), dense_bfgs_inverse(pairs[-3:], 6) @ g, rtol=1e-10, atol=1e-12)
    s, v = pairs[0]
    assert not mem.push(s, -v)                       # v^T s < 0: BFGS would lose positive definiteness
    assert not mem.push(torch.zeros(6, dtype=torch.float64), v)
    assert mem.rejected == 2 and len(mem) == 3
    with pytest.raises(ValueError, match="at least 1"):
        CurvatureMemory(0)
