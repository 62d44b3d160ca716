"""How close federated components are to the pooled ones, and the pooled references themselves.

The references need the pooled data, which no party has in a real
federation: they are evaluation oracles for experiments, tests and the
``vfl pca`` report (the simulation can read the whole file), never part of a
protocol.

Distances compare unit vectors u (federated) and g (pooled), per component:

* sign-aligned: min(||u - g||, ||u + g||) (an eigenvector's sign is arbitrary);
  in [0, sqrt(2)], equal to 2 sin(angle / 2) of the smaller angle;
* the paper's ``Dis(V, U)``: ||u - g|| with no alignment; in [0, 2], near 2
  when the sign came out the other way. The paper's g is a power iteration
  on the pooled data from a random positive start; here g is oriented so
  that g^T r >= 0 for the start r that the federated methods share
  (``linalg.shared_start(n, k, seed, 1)``), the sign that power iteration
  from r gives. (Orienting by the sum of entries would not do: centred
  PCA's and kernel PCA's eigenvectors are orthogonal to the ones vector.)
  Without a reference the largest entry of each column is made positive.

Principal angles compare subspaces: the k angles between span(U) and span(G),
computed from the singular values of (I - G G^T) U (their sines) so that
angles near zero are accurate.

The comparisons take tensors or numpy arrays (the estimators' fitted attributes are numpy, issue 37).
"""

from __future__ import annotations

import math

import torch

from ..devices import to_device
from .kernels import center_kernel, kernel_matrix
from .linalg import align_signs, center_columns


def orient(G: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
    """A fixed sign per column: g^T r >= 0 for ``reference`` r, else the largest |entry| positive."""
    if reference is not None:
        return align_signs(G, reference)
    lead = G.abs().argmax(dim=0)
    s = torch.sign(G[lead, torch.arange(G.shape[1], device=G.device)])
    return G * torch.where(s == 0, torch.ones_like(s), s)


def pooled_pca(X: torch.Tensor, k: int, *, center: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Leading k left singular vectors of the pooled (centred) matrix and the eigenvalues s^2 of X X^T."""
    X = X.to(torch.float64)
    if center:
        X = center_columns(X)[0]
    if X.shape[1] > 4 * X.shape[0]:
        # Wide data: the n x n eigenproblem is much cheaper than the SVD, and as accurate here.
        lam, V = torch.linalg.eigh(X @ X.T)
        return orient(V.flip(1)[:, :k]), lam.flip(0)[:k]
    U, S, _ = torch.linalg.svd(X, full_matrices=False)
    return orient(U[:, :k]), (S ** 2)[:k]


def pooled_kernel_pca(X: torch.Tensor, k: int, *, kernel: str, gamma: float, degree: int = 3,
                      coef0: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Leading k eigenpairs of the centred kernel matrix of the pooled data."""
    K = center_kernel(kernel_matrix(X.to(torch.float64), kernel, gamma=gamma, degree=degree, coef0=coef0))
    lam, V = torch.linalg.eigh((K + K.T) / 2)
    return orient(V.flip(1)[:, :k]), lam.flip(0)[:k]


def _tensors(U, G):
    """U and G as tensors on one device (the tensor's, when only one is): numpy arrays become tensors."""
    if not isinstance(G, torch.Tensor):
        G = to_device(G, U.device if isinstance(U, torch.Tensor) else "cpu")
    if not isinstance(U, torch.Tensor):
        U = to_device(U, G.device)
    return U, G


def _unit(U: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(U, dim=0)
    return U / torch.where(norms > 0, norms, torch.ones_like(norms))


def aligned_distances(U: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Per component: min(||u - g||, ||u + g||) for unit u, g."""
    U, G = _tensors(U, G)
    U, G = _unit(U), _unit(G)
    return torch.minimum(torch.linalg.vector_norm(U - G, dim=0), torch.linalg.vector_norm(U + G, dim=0))


def unaligned_distances(U: torch.Tensor, G: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
    """Per component: ||u - g|| (the paper's Dis(V, U)), g oriented by ``orient(G, reference)``."""
    U, G = _tensors(U, G)
    return torch.linalg.vector_norm(_unit(U) - orient(_unit(G), reference), dim=0)


def principal_angles(U: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The principal angles (radians, ascending) between span(U) and span(G) (orthonormal columns)."""
    U, G = _tensors(U, G)
    Qu = torch.linalg.qr(U)[0]
    Qg = torch.linalg.qr(G)[0]
    sines = torch.linalg.svdvals(Qu - Qg @ (Qg.T @ Qu)).clamp(0.0, 1.0)
    return torch.asin(sines).flip(0)


def compare(U: torch.Tensor, G: torch.Tensor, reference: torch.Tensor | None = None) -> dict[str, float]:
    """The scalar metrics of ``vfl pca``: distance (largest aligned), distance_unaligned, largest angle."""
    return {
        "distance": float(aligned_distances(U, G).max()),
        "distance_unaligned": float(unaligned_distances(U, G, reference).max()),
        "principal_angle_deg": float(principal_angles(U, G).max()) * 180.0 / math.pi,
    }
