"""Kernel matrices over the samples, from a Gram matrix: linear, RBF, polynomial, sigmoid.

All four kernels here are functions of inner products, so the kernel matrix
of the pooled data is a function of the pooled Gram matrix
G = X X^T = sum_i X_i X_i^T, a *sum* over the parties:

* linear   k(x, y) = <x, y>                         K = G
* poly     k(x, y) = (gamma <x, y> + coef0)^degree   K = (gamma G + coef0)^degree
* sigmoid  k(x, y) = tanh(gamma <x, y> + coef0)      K = tanh(gamma G + coef0)
* rbf      k(x, y) = exp(-gamma ||x - y||^2)         K = exp(-gamma D), D_ab = G_aa + G_bb - 2 G_ab

(scikit-learn's conventions, so ``sklearn.metrics.pairwise`` is the
reference.) For RBF this is the factorisation over feature groups:
D = sum_i D_i, so K = prod_i exp(-gamma D_i), the elementwise product of the
parties' own RBF kernels with the same gamma. That is what makes exact
federated kernel PCA possible (``exact_kernel.py``): sum the parties' Gram
matrices, then evaluate the kernel.

Kernel PCA works with the kernel centred in feature space,
K_c = H K H with H = I - 11^T / n. New rows x are centred consistently with the
training rows (scikit-learn's ``KernelCenterer``): k~(x, x_b) = k(x, x_b) - mean_a K_ab
- mean_b' k(x, x_b') + mean K, so the training rows themselves get the rows of K_c back.
"""

from __future__ import annotations

import torch

KERNELS = ("linear", "rbf", "poly", "sigmoid")


def check_kernel(kernel: str) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
    return kernel


def kernel_from_gram(G: torch.Tensor, kernel: str, *, gamma: float, degree: int = 3,
                     coef0: float = 1.0) -> torch.Tensor:
    """The n x n kernel matrix from the Gram matrix G = X X^T (see the module docstring)."""
    check_kernel(kernel)
    if kernel == "linear":
        return G
    if kernel == "poly":
        return (gamma * G + coef0) ** degree
    if kernel == "sigmoid":
        return torch.tanh(gamma * G + coef0)
    sq = torch.diagonal(G)
    D = (sq[:, None] + sq[None, :] - 2.0 * G).clamp_min(0.0)
    return torch.exp(-gamma * D)


def kernel_matrix(X: torch.Tensor, kernel: str, *, gamma: float, degree: int = 3,
                  coef0: float = 1.0) -> torch.Tensor:
    """k(X, X) over the rows of X (n x f)."""
    return kernel_from_gram(X @ X.T, kernel, gamma=gamma, degree=degree, coef0=coef0)


def cross_kernel_from_gram(Gx: torch.Tensor, sq_rows: torch.Tensor, sq_fit: torch.Tensor, kernel: str, *,
                           gamma: float, degree: int = 3, coef0: float = 1.0) -> torch.Tensor:
    """k(X_new, X_fit) (m x n) from the cross-Gram matrix Gx = X_new X_fit^T and the squared row norms of
    X_new (``sq_rows``) and X_fit (``sq_fit``; only RBF uses the norms)."""
    check_kernel(kernel)
    if kernel == "rbf":
        return torch.exp(-gamma * (sq_rows[:, None] + sq_fit[None, :] - 2.0 * Gx).clamp_min(0.0))
    return kernel_from_gram(Gx, kernel, gamma=gamma, degree=degree, coef0=coef0)


def center_cross_kernel(Kx: torch.Tensor, fit_col_mean: torch.Tensor, fit_mean: torch.Tensor) -> torch.Tensor:
    """k(X_new, X_fit) centred with the training kernel's column means and grand mean (module docstring)."""
    return Kx - fit_col_mean[None, :] - Kx.mean(dim=1, keepdim=True) + fit_mean


def center_kernel(K: torch.Tensor) -> torch.Tensor:
    """H K H: the kernel of the feature-space-centred data (K - row means - column means + grand mean)."""
    row = K.mean(dim=1, keepdim=True)
    col = K.mean(dim=0, keepdim=True)
    return K - row - col + K.mean()
