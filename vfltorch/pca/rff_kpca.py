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

New rows (``transform(X_new)``, collective): steps 1, 2 and 6 again on the m new
rows, with a fresh beta' of K's, each holder's share of s^T V kept from the fit
and V (with the output's signs): n (Phi' - mean) V opened to every data party.

The fit and the transform announce their ring products (``fed.expect_work``,
public sizes), so the parties that only wait follow the holders' work instead
of timing out.

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

import numpy as np
import torch

from ..comm import FixedPoint, Federation, MaskStream, RingGroup, broadcast, masked_sum, sharing, star
from ..data import VFLInputError
from ..data.estimator_input import check_fitted, resolve_fed
from ..devices import to_host, to_numpy
from ..kernels.circle import Circle, KeptPhases
from ..kernels.random_features import FourierSampler, counter_uniform, derive_key
from .base import FederatedPCABase, as_tensor
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
    return to_host(CIRCLE.encode(X_l.to(torch.float64) @ W))     # (the masked sum's words: host arithmetic)


def reference_fit(theta_words: torch.Tensor, n_components: int, seed: int = 0):
    """Centralised random-feature kernel PCA on the grid phases (int16 words, n x D), in float64.

    Returns (U, eigenvalues, scores): sample vectors (n x k), eigenvalues of the centred K~ = Phi Phi^T / D,
    scores Phi_c V / sqrt(D) = U sqrt(eigenvalues) (scikit-learn KernelPCA's ``transform()``).
    """
    return reference_model(theta_words, n_components, seed)[:3]


def reference_model(theta_words: torch.Tensor, n_components: int, seed: int = 0):
    """``reference_fit`` plus what transforming new rows needs: V (D x k, with the output's signs) and the
    training features' column means (D)."""
    Phi = SQRT2 * torch.cos(CIRCLE.decode(theta_words).to(torch.float64))
    n, D = Phi.shape
    mean = Phi.mean(0)
    Phic = Phi - mean
    theta, V = torch.linalg.eigh(Phic.T @ Phic)
    theta, V = theta.flip(0)[:n_components], V.flip(1)[:, :n_components]
    T = Phic @ V
    U_raw = T / theta.clamp_min(1e-300).sqrt()
    U = align_signs(U_raw, shared_start(n, n_components, seed, 1, device="cpu"))
    lam = theta / D
    return U, lam, U * lam.clamp_min(0).sqrt(), V * _signs(U, U_raw), mean


def reference_transform(theta_words_new: torch.Tensor, mean: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Scores of new rows (their grid phases, m x D) on the fitted components: (Phi_new - mean) V / sqrt(D),
    scikit-learn KernelPCA's ``transform(X_new)`` for the random-feature kernel (centred with the training
    kernel's means)."""
    Phi = SQRT2 * torch.cos(CIRCLE.decode(theta_words_new).to(torch.float64))
    return (Phi - mean) @ V / math.sqrt(V.shape[0])


def _signs(U: torch.Tensor, U_raw: torch.Tensor) -> torch.Tensor:
    """The column signs (+-1.0) that ``align_signs`` applied to U_raw to give U."""
    s = torch.sign((U * U_raw).sum(0))
    return torch.where(s == 0, torch.ones_like(s), s)


def _hidden_phases(fed: Federation, part, b_words, A: int, K: int, parties, rows: int, D: int):
    """Step 1: every party's partial phase words into one masked sum at A whose kept mask (K's) is beta + b.

    Returns (S, beta): S = theta + beta at A (uniform), K's fresh beta (OS entropy); None elsewhere."""
    beta = None
    if fed.rank == K:
        beta = MaskStream.private().draw(CIRCLE, (rows, D))
        stream = KeptPhases(CIRCLE.add(beta, b_words.expand(rows, D)))
    else:
        stream = MaskStream.private()
    S = masked_sum(fed, part, keep=K, out=A, stream=stream, group=CIRCLE, parties=parties)
    return S, beta


def _feature_shares(fed: Federation, S, beta, holders, dealer: int, rows: int, D: int):
    """Step 2: shares of Phi = sqrt2 (cos S cos beta + sin S sin beta) at 14 fractional bits (the holders;
    None at the dealer): one ``mul_private`` of kind rowdot, truncated by each holder."""
    A, K = holders
    x = y = None
    if fed.rank == A:
        s = CIRCLE.decode(S).to(torch.float64)
        x = _encode(SQRT2 * torch.stack([torch.cos(s), torch.sin(s)], dim=-1))
    elif fed.rank == K:
        t = CIRCLE.decode(beta).to(torch.float64)
        y = _encode(torch.stack([torch.cos(t), torch.sin(t)], dim=-1))
    z = sharing.mul_private(fed, x, y, holders=holders, dealer=dealer, kind="rowdot",
                            shape_x=(rows, D, 2), shape_y=(rows, D, 2))
    if fed.rank not in holders:
        return None
    return sharing.truncate(z, holders.index(fed.rank), FACTOR_BITS)


class TruncationFailure(RuntimeError):
    """A two-holder share truncation went wrong (probability ~2**-35 per feature entry): run the fit again."""


class RandomFeatureKernelPCA(FederatedPCABase):
    """Private random-feature RBF kernel PCA (see the module docstring and docs/pca.md).

    Parameters: ``n_components`` (k); ``n_random_features`` (D, default 256); ``gamma`` of the RBF kernel
    (number, None: 1 / total features, 'scale': scikit-learn's); ``seed`` (public: W, b and the sign
    reference); ``fed``.

    Attributes (arrays: numpy, on the host): ``sample_components_`` (U, n x k; also ``eigenvectors_``),
    ``eigenvalues_`` (of the centred random-feature kernel Phi Phi^T / D), ``scores_`` (U sqrt(eigenvalues),
    = ``transform()``), ``feature_components_`` (V, D x k, at the two holders only; None elsewhere), ``gamma_``,
    ``bytes_``, ``messages_``, ``fit_seconds_``. ``transform(X_new)`` scores new rows in shares (``_transform_rows``);
    ``save`` / ``load`` keep what that needs.
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
        self._feature_components_ = self._holder_state = self._central_mean = None
        if len(parties) == 1 and fed.world_size == 1:
            U, lam, scores, V, mean = reference_model(CIRCLE.add(part, b_words), k, self.seed)
            self._feature_components_, self._central_mean = V, mean
            self._columns_ = (0, X.shape[1])
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
        e_bits = math.ceil(math.log2(2.0 * n * n * D))
        frac_in = 2 * FACTOR_BITS + e_bits
        frac_out = min(OPEN_BITS, frac_in - 1)
        # The holders' ring products cost about n D^2 + D^3 operations while the others wait: announce them.
        with fed.phase(f"pca/{self.method}"), fed.expect_work(n * D * D + D ** 3, "rffkpca's ring products"):
            # 1. Phases: a masked sum at A whose kept mask (K's) is beta + b.
            S = beta = None
            if client:
                with fed.phase(f"pca/{self.method}/phases"):
                    S, beta = _hidden_phases(fed, part, b_words, A, K, parties, n, D)
            P = rotation_seed(fed, list(holders)) if holder else None
            P = haar_rotation(D, P) if holder else None
            # 2. Features in shares: Phi = sqrt2 (cos S cos beta + sin S sin beta), 14 fractional bits.
            Z = None
            with fed.phase(f"pca/{self.method}/features"):
                if holder or fed.rank == coordinator:
                    Z = _feature_shares(fed, S, beta, holders, coordinator, n, D)
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
                              dtype=torch.float64, device="cpu")         # (host-side ring arithmetic follows)
            if not bool(torch.isfinite(block).all()):
                raise TruncationFailure("rffkpca: a share truncation failed (probability about 2**-35 per feature "
                                        "entry); the opened matrix was out of range. Fit again (fresh masks).")
            theta = block[D].clamp_min(0) * 2.0 ** e_bits / n            # eigenvalues of Phi_c^T Phi_c
            if fed.rank == coordinator:
                self._eigenvalues_ = theta / D
                self._sample_components_ = self._scores_ = None
                self.fit_seconds_ = time.perf_counter() - started
                self._count_bytes(fed)
                return self
            # 6. n Phi_c V opened to every data party.
            T_share = None
            if holder:
                V = P.T @ block[:D]
                Venc = torch.round(V * 2.0 ** V_BITS).to(torch.int64)
                c_share = sharing.ring_matmul(Z.sum(0, keepdim=True), Venc)      # shares of s^T V (1 x k)
                T_share = n * sharing.ring_matmul(Z, Venc) - c_share
                del Z, P
            with fed.phase(f"pca/{self.method}/scores"):
                T = sharing.open_shares(fed, T_share, holders=list(holders), to=list(parties), shape=(n, k))
        T = T.to(torch.float64) / (n * 2.0 ** (FACTOR_BITS + V_BITS))   # Phi_c V
        U_raw = T / torch.where(theta > 0, theta, torch.ones_like(theta)).sqrt()
        U = align_signs(U_raw, shared_start(n, k, self.seed, 1, device="cpu"))
        signs = _signs(U, U_raw)
        if holder:
            # Kept for transforming new rows: V with the output's signs (a D x k output), and this holder's
            # share of s^T V (uniform on its own; the two shares open the training features' mean projection).
            self._feature_components_ = V * signs
            self._holder_state = (Venc * signs.to(torch.int64), c_share * signs.to(torch.int64))
        self._columns_ = (lo, lo + X.shape[1])
        lam = theta / D
        self._count_bytes(fed)
        return self._output(U, lam, U * lam.sqrt(), started)

    def _output(self, U, lam, scores, started):
        dev = getattr(self, "_device", "cpu")
        self._sample_components_ = self._eigenvectors_ = U.to(dev)
        self._eigenvalues_ = lam.to(dev)
        self._scores_ = scores.to(dev)
        self._components_ = self._loadings_ = None
        self.rounds_, self._history_ = 1, [self._sample_components_]
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def _empty(self) -> "RandomFeatureKernelPCA":
        self._sample_components_ = self._scores_ = self._eigenvalues_ = None
        self.bytes_, self.messages_, self.rounds_ = 0, 0, 0
        return self

    # ------------------------------------------------------------ transform
    def transform(self, X=None, fed=None):
        """Scores: ``transform()`` at a data party, the training rows' (no message); ``transform(X_new)`` at
        every data party (its columns of the same m new rows) together with ``transform()`` at the
        coordinator (the dealer; it returns None): the new rows' scores at every data party, through the
        private protocol of ``_transform_rows`` (collective)."""
        check_fitted(self, "sample_components_")
        fed = resolve_fed(self, fed, "transform") if fed is not None else (getattr(self, "_fed_in_fit", None)
                                                                          or self.fed)
        self._fed_in_fit = fed
        if fed is not None and fed.world_size > 1 and fed.rank == fed.coordinator:
            if X is not None:
                raise VFLInputError("the coordinator holds no columns: call transform() there (it deals)")
            self._transform_rows(None, fed)
            return None
        return super().transform(X, fed)

    def _transform(self, X=None, fed=None) -> torch.Tensor:
        if X is None:
            if self._scores_ is None:
                raise VFLInputError("only a data party holds the training scores (a loaded model keeps none: "
                                    "pass the rows to transform)")
            return self._scores_
        if not hasattr(self, "_columns_"):
            raise VFLInputError("only a data party can transform its columns of new samples")
        X = as_tensor(X)
        width = self._columns_[1] - self._columns_[0]
        if X.dim() != 2 or X.shape[1] != width:
            raise VFLInputError(f"expected this party's {width} columns of the new samples (m x {width}), "
                                f"got shape {tuple(X.shape)}")
        if not torch.isfinite(X).all():
            raise VFLInputError("the new rows contain NaN or inf: impute them first")
        dev = X.device
        return self._transform_rows(X.to(torch.float64), fed).to(dev)

    def _transform_rows(self, X, fed) -> torch.Tensor | None:
        """New rows' scores (m x k) at every data party; ``X`` None at the coordinator.

        The fit's steps 1, 2 and 6 on the new rows: their phases in one masked sum at A whose kept mask is
        a fresh beta' of K's (A gets S' = theta' + beta', uniform), features in shares (one rowdot
        ``mul_private`` dealt by the coordinator), then n (Phi' - mean) V = n Z'_h V - s_h^T V at each holder
        (its share of s^T V kept from the fit), opened to every data party only. Nobody but the output's
        recipients learns anything beyond uniform words; the coordinator only deals (it receives the size m).
        """
        D, k, n = self.n_random_features, self.n_components, self.n_samples_
        b_words = CIRCLE.encode(phase_offsets(self.seed, D))
        sampler = None if X is None else FourierSampler("rbf", 1.0 / math.sqrt(2.0 * self.gamma_), self.seed)
        part = None if X is None else partial_phase_words(X, range(*self._columns_), sampler, D)
        if fed is None or fed.world_size == 1:
            V, mean = self._feature_components_, self._central_mean
            return reference_transform(CIRCLE.add(part, b_words), mean.to(V.device), V)
        parties, coordinator = self.parties_, fed.coordinator
        A, K = parties[0], parties[1]
        holders = (A, K)
        client = fed.rank in parties
        with fed.phase(f"pca/{self.method}/transform"):
            info = [int(X.shape[0])] if client else None
            gathered = fed.gather_json(info, A, ranks=parties) if client else None
            plan = None
            if fed.rank == A:
                rows = {p: g[0] for p, g in zip(parties, gathered)}
                plan = {"m": rows[A], "error": None if len(set(rows.values())) == 1 else
                        "the parties pass different numbers of new rows (" +
                        ", ".join(f"party {p}: {r}" for p, r in rows.items()) +
                        "): every party must pass its columns of the same rows in the same order"}
            plan = fed.broadcast_json(plan, A, ranks=[*parties, coordinator])
            if plan["error"]:
                raise VFLInputError(plan["error"])
        m = plan["m"]
        with fed.phase(f"pca/{self.method}/transform"), fed.expect_work(m * D * (k + 2), "rffkpca's new-row products"):
            if n * 2 * math.sqrt(2 * D) * 2.0 ** (FACTOR_BITS + V_BITS) >= 2.0 ** 62:
                raise VFLInputError(f"rffkpca: n = {n}, D = {D} overflow the 64-bit ring of the scores")
            S = beta = None
            if client:
                S, beta = _hidden_phases(fed, part, b_words, A, K, parties, m, D)
            Z = None
            if fed.rank in holders or fed.rank == coordinator:
                Z = _feature_shares(fed, S, beta, holders, coordinator, m, D)
            if fed.rank == coordinator:
                return None
            T_share = None
            if fed.rank in holders:
                Venc, c_share = self._holder_state
                T_share = n * sharing.ring_matmul(Z, Venc) - c_share
                del Z
            T = sharing.open_shares(fed, T_share, holders=list(holders), to=list(parties), shape=(m, k))
        scores = T.to(torch.float64) / (n * 2.0 ** (FACTOR_BITS + V_BITS) * math.sqrt(D))
        # |(phi' - mean) V| / sqrt(D) <= 2 sqrt(2): a failed truncation (an entry off by 2**36) shows as far more.
        if not bool((scores.abs() <= 4.0).all()):
            raise TruncationFailure("rffkpca transform: a share truncation failed (probability about 2**-35 per "
                                    "feature entry); the opened scores are out of range. Transform again.")
        return scores if X is None else scores.to(X.device)     # (opened on the host: back to the rows' device)

    # -------------------------------------------------- save / load: what transforming new rows needs
    def _shard_state(self):
        """Every rank: the layout, gamma, D (hyperparameter) and the eigenvalues; a data party its columns'
        position; the two holders V (D x k, the output) and their own share of s^T V (k ring words, uniform
        on its own: only both holders' shards together give the training features' mean projection)."""
        if not hasattr(self, "_sample_components_"):
            raise VFLInputError(f"{type(self).__name__} is not fitted yet: call fit first")
        state = {**self._layout_state(), "gamma": float(self.gamma_) if self.gamma_ == self.gamma_ else None}
        arrays = {}
        if self._eigenvalues_ is not None:
            arrays["eigenvalues"] = to_numpy(self._eigenvalues_, np.float64)
        if hasattr(self, "_columns_"):
            state["columns"] = list(self._columns_)
        if getattr(self, "_holder_state", None) is not None:
            arrays["V_encoded"] = to_numpy(self._holder_state[0])
            arrays["mean_projection_share"] = to_numpy(self._holder_state[1])
        if getattr(self, "_central_mean", None) is not None:
            arrays["V"] = to_numpy(self._feature_components_)
            arrays["mean"] = to_numpy(self._central_mean)
        return state, arrays

    def _restore_fitted(self, manifest, arrays, fed):
        state = manifest["state"]
        self._restore_layout(state)
        self._sample_components_ = self._scores_ = self._components_ = self._loadings_ = None
        self._feature_components_ = self._holder_state = self._central_mean = None
        self.gamma_ = state["gamma"] if state["gamma"] is not None else float("nan")
        ev = arrays.get("eigenvalues")
        self._eigenvalues_ = None if ev is None else torch.as_tensor(ev, dtype=torch.float64)
        if "columns" in state:
            self._columns_ = tuple(state["columns"])
            self.n_features_in_ = self._columns_[1] - self._columns_[0]
        if "V_encoded" in arrays:
            Venc = torch.as_tensor(arrays["V_encoded"], dtype=torch.int64)
            self._holder_state = (Venc, torch.as_tensor(arrays["mean_projection_share"], dtype=torch.int64))
            self._feature_components_ = Venc.to(torch.float64) / 2.0 ** V_BITS
        if "V" in arrays:
            self._feature_components_ = torch.as_tensor(arrays["V"], dtype=torch.float64)
            self._central_mean = torch.as_tensor(arrays["mean"], dtype=torch.float64)


def _encode(v: torch.Tensor) -> torch.Tensor:
    return torch.round(v * 2.0 ** FACTOR_BITS).to(torch.int64)
