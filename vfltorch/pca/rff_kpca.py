"""Private random-feature kernel PCA: RBF kernel PCA past a few thousand rows, no n x n matrix, no phases seen.

The RBF kernel k(x, x') = exp(-gamma ||x - x'||^2) is approximated by D random
Fourier features phi_j(x) = sqrt(2) cos(w_j^T x + b_j) (``kernels.random_features``:
W and b from the public seed, entry (column, feature) from a counter, so each
party draws exactly its own rows of W). Kernel PCA of K~ = Phi Phi^T / D is the
PCA of Phi (n x D): the eigenvectors V of the D x D matrix Phi_c^T Phi_c
(Phi_c: columns centred) give the sample vectors U = Phi_c V / sqrt(theta).
Memory and work are O(n D + D^2) per party; the coordinator solves a D x D
eigenproblem.

Roles: data parties (the first, A, and the second, K, the *keeper*, are the
two share holders), and the coordinator (dealer of Beaver material and
eigensolver; it holds no data). Steps:

1. Phases hidden from everyone (as FDSKL's ``shared`` protocol). Each party
   encodes its partial phases X_l W_l on the 16-bit angle grid; one Algorithm-3
   masked sum (``comm.masked_sum``) at A whose kept mask, K's, is beta + b:
   beta uniform on the grid from K's OS entropy, b the public phases. A gets
   S = theta + beta (exactly uniform), K knows beta, nobody sees theta.
2. Features in shares: phi = sqrt(2) cos(S - beta) = sqrt(2) (cos S cos beta +
   sin S sin beta), one ``sharing.mul_private`` (kind ``rowdot``) of A's
   [sqrt2 cos S, sqrt2 sin S] and K's [cos beta, sin beta], both at G = 14
   fractional bits: shares of Phi at 28 bits, truncated to 14
   (``sharing.truncate``; it fails with probability about 2**-35 per entry,
   about 2**-15 for n D = 10**6 entries, and a failure is caught in step 5).
3. Centred products without division: n Phi_c^T Phi_c = n Phi^T Phi - s s^T with
   s = Phi^T 1 (local column sums of the shares). Phi^T Phi by
   ``sharing.cross_products`` over the two holders (each opens its masked n x D
   share once), s s^T by one ``sharing.mul_shared``; all exact in Z_2^64 at 28
   bits (|n Phi_c^T Phi_c| <= 2 n^2, so n up to about 90 000).
4. ``sharing.rotate_shares`` turns the shares into shares of P M P^T with
   M = n Phi_c^T Phi_c / 2**e, 2**e >= 2 n^2 D (so ||M||_F <= 1), and P a Haar
   rotation whose seed A draws and sends to K only.
5. One masked ring sum opens P M P^T at the coordinator, which checks
   ||.||_F <= 1 (a failed truncation shows as entries near 2**23: the fit then
   stops with an error at every rank), takes the k leading eigenpairs (W,
   theta) and sends them to every party.
6. The holders rotate back, V = P^T W, and open n Phi_c V = (n Z_h - 1 s_h^T) V
   (V at 28 bits, exact in the ring) to every data party: the output
   (scores Phi_c V, U = Phi_c V / sqrt(theta), eigenvalues theta / D).

What each role learns (semi-honest, no collusion with the coordinator):
A: S (uniform), the uniform messages of the products (K's f = y - b, K's
masked share E_K, the mul_shared openings, the truncation bit product), the
seed of P, (W, theta), V and the scores. K: beta (its own), A's e = x - a and
E_A (uniform), the same product openings, P, (W, theta), V, the scores.
A third party: uniform masked-sum words, (W, theta) (W in P's unknown basis),
the scores. The coordinator: P M P^T, a uniformly rotated matrix with the
spectrum of Phi_c^T Phi_c (the eigenvalues, nothing else), and the masked
words of the sum it opens; it receives nothing else. Collusions: A with K
gets theta (the pooled phases, hence the others' columns by phase least
squares); the coordinator (who dealt A's mask a) with K unmasks A's
[cos S, sin S] and, with beta, theta; the coordinator with A or K learns P and
so M (the pooled random-feature Gram, up to centring).
"""

from __future__ import annotations

import math
import time

import torch

from ..comm import FixedPoint, Federation, MaskStream, RingGroup, broadcast, masked_sum, sharing, star
from ..data import VFLInputError
from ..kernels.circle import Circle, KeptPhases
from ..kernels.random_features import FourierSampler, counter_uniform, derive_key
from .base import FederatedPCABase
from .exact import haar_rotation, rotation_seed
from .linalg import align_signs, shared_start

CIRCLE = Circle(16)
FACTOR_BITS = 14          # fractional bits of each factor of a feature; products carry 28, truncated back to 14
V_BITS = 28               # fractional bits of V in the opened scores
OPEN_BITS = 40            # fractional bits of the rotated matrix the coordinator opens
SQRT2 = math.sqrt(2.0)


def phase_offsets(seed: int, n_random_features: int) -> torch.Tensor:
    """The public phases b_j (radians in [0, 2 pi)) from the public seed."""
    u = counter_uniform(derive_key(int(seed), 0xB0FF), torch.zeros(1, dtype=torch.int64),
                        torch.arange(n_random_features))
    return (2 * math.pi) * u[0]


def partial_phase_words(X_l: torch.Tensor, columns, sampler: FourierSampler, n_random_features: int) -> torch.Tensor:
    """Party l's partial phases X_l W_l on the 16-bit grid (what it puts into the masked sum)."""
    W = sampler.omega(columns, range(n_random_features), dtype=torch.float64, device=X_l.device)
    return CIRCLE.encode(X_l.to(torch.float64) @ W).cpu()


def reference_fit(theta_words: torch.Tensor, n_components: int, seed: int = 0):
    """Centralised random-feature kernel PCA on the grid phases (int16 words, n x D), in float64.

    Returns (U, eigenvalues, scores): sample vectors (n x k), eigenvalues of the centred K~ = Phi Phi^T / D,
    scores Phi_c V / sqrt(D) = U sqrt(eigenvalues) (scikit-learn KernelPCA's ``transform()``).
    """
    Phi = SQRT2 * torch.cos(CIRCLE.decode(theta_words).to(torch.float64))
    n, D = Phi.shape
    Phic = Phi - Phi.mean(0)
    theta, V = torch.linalg.eigh(Phic.T @ Phic)
    theta, V = theta.flip(0)[:n_components], V.flip(1)[:, :n_components]
    T = Phic @ V
    U = align_signs(T / theta.clamp_min(1e-300).sqrt(), shared_start(n, n_components, seed, 1, device="cpu"))
    lam = theta / D
    return U, lam, U * lam.clamp_min(0).sqrt()


class TruncationFailure(RuntimeError):
    """A two-holder share truncation went wrong (probability ~2**-35 per feature entry): run the fit again."""


class RandomFeatureKernelPCA(FederatedPCABase):
    """Private random-feature RBF kernel PCA (see the module docstring and docs/pca.md).

    Parameters: ``n_components`` (k); ``n_random_features`` (D, default 256); ``gamma`` of the RBF kernel
    (number, None: 1 / total features, 'scale': scikit-learn's); ``seed`` (public: W, b and the sign
    reference); ``fed``.

    Attributes: ``sample_components_`` (U, n x k; also ``eigenvectors_``), ``eigenvalues_`` (of the centred
    random-feature kernel Phi Phi^T / D), ``scores_`` (U sqrt(eigenvalues), = ``transform()``),
    ``feature_components_`` (V, D x k, at the two holders only; None elsewhere), ``gamma_``, ``bytes_``,
    ``messages_``, ``fit_seconds_``. ``transform`` of new rows is not implemented.
    """

    method = "rffkpca"
    linear = False
    kernel, degree, coef0 = "rbf", 3, 1.0     # the kernel it approximates (for the pooled reference)

    def __init__(self, n_components: int = 1, *, n_random_features: int = 256, gamma: float | str | None = None,
                 seed: int = 0, fed: Federation | None = None):
        self.n_components = n_components
        self.n_random_features = n_random_features
        self.gamma = gamma
        self.seed = seed
        self.fed = fed

    # ------------------------------------------------------------------ fit
    def _fit(self, X, fed, parties) -> "RandomFeatureKernelPCA":
        D, k = self.n_random_features, self.n_components
        if not isinstance(D, int) or D < 1:
            raise VFLInputError(f"n_random_features must be a positive integer, got {D!r}")
        if isinstance(k, int) and k > D:
            raise VFLInputError(f"n_components={k} but only n_random_features={D} features: ask for at most {D}")
        fed, parties, X, n = self._setup(X, fed, parties, needs_coordinator=True)
        started = time.perf_counter()
        client = fed.rank in parties
        coordinator = fed.coordinator
        self.gamma_ = self._kernel_gamma(fed, parties, X)
        if client:
            sampler = FourierSampler("rbf", 1.0 / math.sqrt(2.0 * self.gamma_), self.seed)
            me = parties.index(fed.rank)
            lo = sum(self.party_widths_[:me])
            part = partial_phase_words(X, range(lo, lo + X.shape[1]), sampler, D)
            b_words = CIRCLE.encode(phase_offsets(self.seed, D))
        self.feature_components_ = None
        if len(parties) == 1 and fed.world_size == 1:
            U, lam, scores = reference_fit(CIRCLE.add(part, b_words), k, self.seed)
            self.bytes_, self.messages_ = 0, 0
            return self._output(U, lam, scores, started)
        if len(parties) < 2:
            raise VFLInputError("rffkpca needs at least two data parties (the two share holders) and a coordinator")
        if 2.0 * n * n * 2.0 ** (2 * FACTOR_BITS) >= 2.0 ** 61:
            raise VFLInputError(f"rffkpca: n = {n} rows overflow the 64-bit ring of the centred products "
                                f"(at most about 90 000 rows)")
        if n * 2 * math.sqrt(2 * D) * 2.0 ** (FACTOR_BITS + V_BITS) >= 2.0 ** 62:
            raise VFLInputError(f"rffkpca: n = {n}, D = {D} overflow the 64-bit ring of the opened scores")
        if fed.rank not in parties and fed.rank != coordinator:
            return self._empty()
        A, K = parties[0], parties[1]
        holders = (A, K)
        holder = fed.rank in holders
        index = holders.index(fed.rank) if holder else None
        e_bits = math.ceil(math.log2(2.0 * n * n * D))
        frac_in = 2 * FACTOR_BITS + e_bits
        frac_out = min(OPEN_BITS, frac_in - 1)
        with fed.phase(f"pca/{self.method}"):
            # 1. Phases: a masked sum at A whose kept mask (K's) is beta + b.
            S = beta = None
            if client:
                if fed.rank == K:
                    beta = MaskStream.private().draw(CIRCLE, (n, D))
                    stream = KeptPhases(CIRCLE.add(beta, b_words.expand(n, D)))
                else:
                    stream = MaskStream.private()
                with fed.phase(f"pca/{self.method}/phases"):
                    S = masked_sum(fed, part, keep=K, out=A, stream=stream, group=CIRCLE, parties=parties)
            P = rotation_seed(fed, list(holders)) if holder else None
            P = haar_rotation(D, P) if holder else None
            # 2. Features in shares: Phi = sqrt2 (cos S cos beta + sin S sin beta), 14 fractional bits.
            Z = None
            with fed.phase(f"pca/{self.method}/features"):
                if holder or fed.rank == coordinator:
                    x = y = None
                    if fed.rank == A:
                        s = CIRCLE.decode(S).to(torch.float64)
                        x = _encode(SQRT2 * torch.stack([torch.cos(s), torch.sin(s)], dim=-1))
                    elif fed.rank == K:
                        t = CIRCLE.decode(beta).to(torch.float64)
                        y = _encode(torch.stack([torch.cos(t), torch.sin(t)], dim=-1))
                    z = sharing.mul_private(fed, x, y, holders=holders, dealer=coordinator, kind="rowdot",
                                            shape_x=(n, D, 2), shape_y=(n, D, 2))
                    if holder:
                        Z = sharing.truncate(z, index, FACTOR_BITS)
                    del x, y, z
            # 3. n Phi_c^T Phi_c = n Phi^T Phi - s s^T in shares, 28 fractional bits.
            M = None
            with fed.phase(f"pca/{self.method}/products"):
                if holder or fed.rank == coordinator:
                    pair = sharing.cross_products(fed, Z, parties=list(holders), dealer=coordinator, widths=[D, D],
                                                  rows=n)
                    s_col = Z.sum(0) if holder else None
                    ss = sharing.mul_shared(fed, s_col[:, None] if holder else None,
                                            s_col[None, :] if holder else None, holders=holders, dealer=coordinator,
                                            kind="matmul", shape_x=(D, 1), shape_y=(1, D))
                    if holder:
                        z = pair[holders]
                        M = n * (sharing.ring_matmul(Z.T, Z) + z + z.T) - ss
                        del pair, z, ss
            # 4. Rotation by P in Z_2^128: shares of P M P^T / 2**(e + 28), frac_out bits.
            with fed.phase(f"pca/{self.method}/rotate"):
                if holder or fed.rank == coordinator:
                    M = sharing.rotate_shares(fed, M, P, holders=holders, dealer=coordinator, frac_in=frac_in,
                                              frac_out=frac_out, shape=(D, D))
            # 5. Opened at the coordinator only; its eigensolve; (W, theta) to every party.
            block = None
            if holder or fed.rank == coordinator:
                mine = M if holder else torch.zeros(D, D, dtype=torch.int64)
                total = masked_sum(fed, mine, keep=A, out=coordinator, stream=MaskStream.private(),
                                   group=RingGroup(), reveal=True, parties=[*holders, coordinator])
                if fed.rank == coordinator:
                    R = FixedPoint(frac_out).decode(total)
                    if not bool(torch.isfinite(R).all()) or float(torch.linalg.matrix_norm(R)) > 1.01:
                        block = torch.full((D + 1, k), float("nan"), dtype=torch.float64)
                    else:
                        theta, W = torch.linalg.eigh((R + R.T) / 2)
                        block = torch.cat([W.flip(1)[:, :k], theta.flip(0)[None, :k]])
                    del R, total
            block = broadcast(fed, block, star([coordinator, *parties], center=coordinator), shape=(D + 1, k),
                              dtype=torch.float64)
            if not bool(torch.isfinite(block).all()):
                raise TruncationFailure("rffkpca: a share truncation failed (probability about 2**-35 per feature "
                                        "entry); the opened matrix was out of range. Fit again (fresh masks).")
            theta = block[D].clamp_min(0) * 2.0 ** e_bits / n            # eigenvalues of Phi_c^T Phi_c
            if fed.rank == coordinator:
                self.eigenvalues_ = theta / D
                self.sample_components_ = self.scores_ = None
                self.fit_seconds_ = time.perf_counter() - started
                self._count_bytes(fed)
                return self
            # 6. n Phi_c V opened to every data party.
            T_share = None
            if holder:
                V = P.T @ block[:D]
                self.feature_components_ = V
                Venc = torch.round(V * 2.0 ** V_BITS).to(torch.int64)
                T_share = sharing.ring_matmul(n * Z - Z.sum(0, keepdim=True), Venc)
                del Z, P
            with fed.phase(f"pca/{self.method}/scores"):
                T = sharing.open_shares(fed, T_share, holders=list(holders), to=list(parties), shape=(n, k))
        T = T.to(torch.float64) / (n * 2.0 ** (FACTOR_BITS + V_BITS))   # Phi_c V
        U = align_signs(T / torch.where(theta > 0, theta, torch.ones_like(theta)).sqrt(),
                        shared_start(n, k, self.seed, 1, device="cpu"))
        lam = theta / D
        self._count_bytes(fed)
        return self._output(U, lam, U * lam.sqrt(), started)

    def _output(self, U, lam, scores, started):
        dev = getattr(self, "_device", "cpu")
        self.sample_components_ = self.eigenvectors_ = U.to(dev)
        self.eigenvalues_ = lam.to(dev)
        self.scores_ = scores.to(dev)
        self.components_ = self.loadings_ = None
        self.rounds_, self.history_ = 1, [self.sample_components_]
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def _empty(self) -> "RandomFeatureKernelPCA":
        self.sample_components_ = self.scores_ = self.eigenvalues_ = None
        self.bytes_, self.messages_, self.rounds_ = 0, 0, 0
        return self

    def _transform(self, X=None, fed=None) -> torch.Tensor:
        if X is not None:
            raise VFLInputError("RandomFeatureKernelPCA: transforming new rows is not implemented (only the "
                                "training samples' scores, transform())")
        if self.scores_ is None:
            raise VFLInputError("only a data party holds the scores")
        return self.scores_


def _encode(v: torch.Tensor) -> torch.Tensor:
    return torch.round(v * 2.0 ** FACTOR_BITS).to(torch.int64)
