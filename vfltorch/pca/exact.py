"""Exact federated PCA: the pooled PCA, computed so that no party learns more than the result.

Protocols (``protocol=``; the default ``"auto"`` takes ``"covariance"`` when the
pooled matrix has no more features than samples, d <= n, else ``"rotated"``):

``"covariance"``: the d x d covariance C = X^T X under a secret Haar rotation P
(d x d), opened only as P C P^T / ||X||_F^2 at the coordinator.

1. The two holders (below) agree on a secret seed (as below) and draw P; the
   other parties never see it. Party l scales its columns, Y_l = X_l / s with s^2 = ||X||_F^2 (a masked sum), so
   that Y = [Y_1, ..., Y_Q] has unit Frobenius norm and every product below
   lies in [-1, 1].
2. ``sharing.holder_gram``: the first two parties are the holders; every
   other party secret-shares its encoded columns between them (a seed R_l
   from the coordinator, the dealer, to it and the second holder; E_l =
   enc(Y_l) - R_l to the first holder only), and the holders multiply their
   n x d0 and n x d1 share matrices with one masked opening each way
   (dealer-made correlated masks): shares of C / s^2 = Y^T Y at the two
   holders, with every party's columns opened once. 30 fractional bits,
   products kept at 60 bits.
3. ``sharing.rotate_shares`` turns the two holders' shares of C / s^2 into
   shares of P C P^T / s^2 (in Z_2^128, since a ring multiplication by P
   needs more bits than Z_2^64 has next to 60 bits of data).
4. One ring-masked sum opens P C P^T / s^2 at the coordinator, which takes
   the k leading eigenpairs (W, theta) and sends theta to every data party and
   W in Z_2^128 shares to the two holders only; they rotate the shares back,
   V = P^T W, and open to each party its own rows V_l and nothing else
   (``own_rows.open_own_rows``). U = X V / sqrt(theta s^2) comes from a masked
   sum of X_l V_l; ``components_`` from U.

The coordinator learns the normalised spectrum of C and nothing else; a data
party the output: V_l, U, theta, the variances, and what they imply (with
V^T V = I and X V = U sqrt(theta): the k x k sum of the others' V_m^T V_m and
the n x k sum of the others' X_m V_m; docs/pca.md). Before issue 39 every
party received W and knew P, hence every V_m: with the scores, the other
parties' centred columns at rank k. The coordinator (dealer and eigensolver) must not collude
with any data party: with a holder it unmasks the columns that holder
received, or, knowing P, gets C; and the two holders must not collude with
each other (together they hold both shares of every other party's columns).
Cost: n (d + sum of the non-holders' widths) ring elements (1.5x the data
at Q = 4 with equal widths; the first version, ``sharing.cross_products``,
opened each party's columns to every other party, (Q - 1) n d) plus O(d^2)
from the dealer, O(d k) for the output's rows, and a d x d eigenproblem.

``"rotated"``: one masked sum of rotated Gram matrices at the
coordinator (a rank that holds no data).

1. The data parties agree on a secret seed (the first party draws it from
   the OS and sends it to the other data parties; the coordinator never sees
   it) and each draws the same Haar-random orthogonal n x n matrix P.
2. Party i computes its rotated, centred Gram matrix P A_i P^T with
   A_i = X_i X_i^T (n x n) and the parts go into one ring-masked sum
   (``vfltorch.comm.secure_sum``) whose output is the coordinator: it gets
   P A P^T, A = sum_i A_i, and no part.
3. The coordinator takes its k leading eigenpairs (P U, theta) with a dense
   solver and sends them to every data party (a star), which rotates back:
   U = P^T (P U).

P A P^T with P Haar-distributed and unknown is a uniformly random symmetric
matrix with the spectrum of A: the coordinator learns the eigenvalues of A
(the squared singular values of the pooled centred matrix) and nothing
else. A data party receives ring elements (uniform), the seed of P, and
the output (U, theta). Cost: n^2 numbers per party and an n x n
eigenproblem at the coordinator, so this is for n up to a few thousand
(``MAX_ROTATED_SAMPLES``).

``"krylov"``: subspace iteration, one sum over the parties per round:

    Y = sum_i X_i (X_i^T Q_t)                (a masked sum + tree broadcast, or a plain all-reduce)
    Rayleigh-Ritz: eig(Q_t^T Y) -> Ritz pairs (U, theta) of A in span(Q_t)
    stop when ||A u_j - theta_j u_j|| <= tol * theta_1 for j <= k
    Q_{t+1} = orth(Y)

Every party knows every Q_t (the first from the public seed, then orth(Y))
and receives every Y_t = A Q_t: subtracting its own A_i Q_t and a Nystrom
reconstruction on span{Q_t} rebuild the *other parties' Gram matrix*
(tests/test_pca_privacy.py does it to 1e-6). It is kept, with a warning,
for data too large for the n x n rotation, and because it needs no
coordinator. The block has b = k + ``oversample`` columns; the error falls
like (theta_{b+1} / theta_k)^t; ``converged_`` says whether ``tol`` was met
and a warning is issued when ``max_rounds`` stops it.
"""

from __future__ import annotations

import secrets
import time
import warnings

import torch

from ..comm import (FixedPoint, Federation, MaskStream, RingGroup, allreduce, broadcast, masked_sum, secure_allreduce,
                    secure_sum, sharing, star)
from ..data import VFLInputError
from .base import FederatedPCABase
from .linalg import align_signs, center_columns, orthonormalize, rayleigh_ritz, shared_start, top_eigenpairs
from .own_rows import open_own_rows

SUM_TOPOLOGIES = ("tree", "star", "ring")
PROTOCOLS = ("auto", "covariance", "rotated", "krylov")
COVARIANCE_SHARING = ("holders", "pairwise")    # how C gets into shares at two holders (see _pairwise_shares)
COVARIANCE_FRAC_BITS = 30       # fixed-point bits of the normalised data; products carry 60 (see _fit_covariance)
COVARIANCE_OPEN_BITS = 40       # fractional bits of the rotated covariance the coordinator opens
MAX_ROTATED_SAMPLES = 8000      # n x n float64 matrices (P, the Gram part, the sum) must fit in memory

KRYLOV_LEAK = ("protocol='krylov': every party learns every block Q_t and every product A Q_t of the pooled "
               "Gram matrix, so it can rebuild the other parties' Gram matrix (their data up to a rotation) on "
               "the explored subspace by subtracting its own part (Nystrom). Use protocol='rotated' (with a "
               "coordinator rank) unless that leak is acceptable; see docs/pca.md")
OUTPUT_GRAM = ("{who}: the other parties hold {rest} column(s) together, at most n_components={k}: from the output "
               "(U, theta) and its own columns a party learns their Gram matrix exactly (their data up to a rotation "
               "of their columns; docs/pca.md, 'What the output implies'). Ask for fewer components, or accept it")
SIMULATION = ("mask_seed is set: masks and the secret rotation come from a seeded generator (a reproducible "
              "simulation); this run carries no privacy guarantee")


def haar_rotation(n: int, seed: int, *, device="cpu") -> torch.Tensor:
    """A Haar-distributed orthogonal n x n matrix from ``seed`` (QR of a Gaussian, signs fixed by diag(R))."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed) % (2 ** 63))
    Q, R = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    d = torch.sign(torch.diagonal(R))
    return (Q * torch.where(d == 0, torch.ones_like(d), d)).to(device)


def rotation_seed(fed: Federation, parties, mask_seed=None) -> int:
    """The data parties' common secret seed of the rotation: drawn by the first party, sent to the others only."""
    with fed.phase(f"{fed.current_phase}/seed"):
        if fed.rank == parties[0]:
            secret = secrets.randbits(62) if mask_seed is None else int(mask_seed) + 1
            for p in parties[1:]:
                fed.send(torch.tensor([secret], dtype=torch.int64), p)
            return secret
        return int(fed.recv(parties[0], (1,), torch.int64, device="cpu")[0])


def federated_sum(fed: Federation, part: torch.Tensor, parties, *, secure: bool, topology: str = "tree",
                  stream: MaskStream | None = None) -> torch.Tensor:
    """sum_i part_i at every party of ``parties``: a plain all-reduce, or a masked sum + tree broadcast."""
    if len(parties) == 1:
        return part
    if not secure:
        return allreduce(fed, part, topology, parties=parties)
    return secure_allreduce(fed, part, parties=parties, root=parties[0], stream=stream)


class ExactFederatedPCA(FederatedPCABase):
    """Exact federated PCA (see the module docstring).

    Parameters: ``n_components`` (k); ``protocol`` ('auto', default: 'covariance' if
    d <= n else 'rotated', both need a coordinator rank when there is more than one
    party; 'covariance'; 'rotated'; 'krylov': subspace
    iteration, which leaks, see above); for 'krylov': ``oversample`` (extra block
    columns, default min(10, n - k)), ``tol`` (relative residual, default 1e-10),
    ``max_rounds``, ``secure`` (masked sums, default True) or ``sum_topology``
    ('tree', 'star', 'ring') for a plain all-reduce; ``center``; ``seed`` (the
    shared start block and sign reference); ``mask_seed`` (a reproducible
    simulation: seeded masks and rotation, no privacy; default: the OS); ``whiten``
    (scores / sqrt(explained_variance_), as scikit-learn); ``covariance_sharing``
    ('holders', default: ``sharing.holder_gram``, the two holders must not collude;
    'pairwise': ``sharing.cross_products``, no coalition of data parties without the
    coordinator learns another's columns, at (Q - 1) n d ring elements).

    Warns (every protocol) when the other parties hold at most k columns together: the output (U, theta) then
    gives a party their Gram matrix exactly (docs/pca.md, 'What the output implies').

    Attributes (arrays: numpy, on the host): ``protocol_`` (the protocol 'auto' chose), ``sample_components_``
    (n x k), ``eigenvalues_`` (of X X^T), ``loadings_``, ``history_`` (the k Ritz vectors after each round),
    ``residuals_``, ``rounds_``, ``converged_``, ``bytes_``, ``fit_seconds_``, explained variance.
    """

    method = "exact"

    def __init__(self, n_components: int = 1, *, protocol: str = "auto", oversample: int | None = None,
                 tol: float = 1e-10, max_rounds: int = 1000, secure: bool = True, sum_topology: str = "tree",
                 center: bool = True, seed: int = 0, mask_seed: int | None = None, whiten: bool = False,
                 covariance_sharing: str = "holders", fed: Federation | None = None):
        self.n_components = n_components
        self.covariance_sharing = covariance_sharing
        self.fed = fed
        self.protocol = protocol
        self.oversample = oversample
        self.tol = tol
        self.max_rounds = max_rounds
        self.secure = secure
        self.sum_topology = sum_topology
        self.center = center
        self.seed = seed
        self.whiten = whiten
        self.mask_seed = mask_seed

    def _fit(self, X: torch.Tensor | None, fed: Federation | None, parties) -> "ExactFederatedPCA":
        if self.sum_topology not in SUM_TOPOLOGIES:
            raise VFLInputError(f"unknown sum topology {self.sum_topology!r}: "
                                f"choose one of {', '.join(SUM_TOPOLOGIES)}")
        if not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise VFLInputError(f"max_rounds must be a positive integer, got {self.max_rounds!r}")
        if self.covariance_sharing not in COVARIANCE_SHARING:
            raise VFLInputError(f"unknown covariance_sharing {self.covariance_sharing!r}: choose 'holders' (default: "
                                f"two holders that must not collude) or 'pairwise' (no coalition of data parties "
                                f"learns columns; (Q - 1) n d ring elements)")
        if self.protocol not in PROTOCOLS:
            raise VFLInputError(f"unknown protocol {self.protocol!r}: choose 'auto' (default), 'covariance', "
                                f"'rotated' or 'krylov'")
        fed, parties, X, n = self._setup(X, fed, parties)
        if fed.rank in parties and len(parties) > 1:
            rest = self.n_features_total_ - self.party_widths_[parties.index(fed.rank)]
            if rest <= self.n_components:
                warnings.warn(OUTPUT_GRAM.format(who=fed.name(), rest=rest, k=self.n_components), stacklevel=2)
        protocol = self.protocol
        if protocol == "auto":          # the cheaper exact protocol: d x d (covariance) or n x n (rotated)
            protocol = "covariance" if self.n_features_total_ <= n else "rotated"
        self.protocol_ = protocol
        rotated = protocol == "rotated"
        if protocol == "covariance":
            if len(parties) > 1 and not self.secure:
                raise VFLInputError("secure=False (plain sums, --no-secure-sum) applies to protocol='krylov' only; "
                                    "protocol='covariance' always uses secret sharing and masked sums")
            if len(parties) > 1 and fed.coordinator is None:
                raise VFLInputError("protocol='covariance' needs a coordinator rank (the dealer of Beaver triples and "
                                    "the eigensolver: launch(..., coordinator=True), or `vfl pca --method exact` "
                                    "which starts one)")
            if self.mask_seed is not None and len(parties) > 1:
                warnings.warn(SIMULATION, stacklevel=2)
            return self._fit_covariance(X, fed, parties, n)
        if self.mask_seed is not None and len(parties) > 1:
            warnings.warn(SIMULATION, stacklevel=2)
        if rotated and len(parties) > 1:
            if not self.secure:
                raise VFLInputError("secure=False (plain sums, --no-secure-sum) applies to protocol='krylov' only; "
                                    "protocol='rotated' always uses one masked sum")
            if fed.coordinator is None:
                raise VFLInputError("protocol='rotated' needs a coordinator rank (launch(..., coordinator=True), "
                                    "or `vfl pca --method exact` which starts one); protocol='krylov' needs none "
                                    "but leaks the other parties' Gram matrix (docs/pca.md)")
            if n > MAX_ROTATED_SAMPLES:
                raise VFLInputError(f"protocol='rotated' works with n x n matrices and n = {n} > "
                                    f"{MAX_ROTATED_SAMPLES}; subsample the rows, or choose protocol='krylov' "
                                    f"knowing that it leaks the other parties' Gram matrix (docs/pca.md)")
            return self._fit_rotated(X, fed, parties, n)
        if fed.rank not in parties:        # the coordinator, if any, has nothing to do here
            self._sample_components_, self._loadings_, self.bytes_, self.messages_, self.rounds_ = None, None, 0, 0, 0
            self.converged_, self._eigenvalues_ = None, None
            return self
        if len(parties) > 1:
            warnings.warn(KRYLOV_LEAK, stacklevel=2)
        started = time.perf_counter()
        k = self.n_components
        Xc, self._mean_ = self._center(X)
        extra = min(10, n - k) if self.oversample is None else int(self.oversample)
        b = max(k, min(n, k + max(extra, 0)))
        stream = MaskStream(secrets.randbits(62) if self.mask_seed is None else self.mask_seed, fed.rank)
        Q = orthonormalize(shared_start(n, b, self.seed, 0, device=X.device, positive=False))
        history, residuals, converged = [], [], False
        with fed.phase(f"pca/{self.method}"):
            for t in range(1, self.max_rounds + 1):
                Y = federated_sum(fed, Xc @ (Xc.T @ Q), parties, secure=self.secure, topology=self.sum_topology,
                                  stream=stream)
                U, theta, AU = rayleigh_ritz(Q, Y)
                r = torch.linalg.vector_norm(AU[:, :k] - U[:, :k] * theta[:k], dim=0)
                scale = theta[0].abs().clamp_min(torch.finfo(theta.dtype).tiny)
                residual = float((r / scale).max())
                history.append(U[:, :k])
                residuals.append(residual)
                # Agree on stopping (every party computed the same numbers; the minimum makes it certain).
                vote = torch.tensor([1.0 if residual <= self.tol else 0.0], dtype=torch.float64, device=X.device)
                if len(parties) > 1:
                    vote = allreduce(fed, vote, "tree", add=torch.minimum, parties=parties)
                if vote.item() == 1.0:
                    converged = True
                    break
                Q = orthonormalize(Y)
        if not converged:
            warnings.warn(f"{fed.name()}: exact PCA stopped at max_rounds={self.max_rounds} with relative residual "
                          f"{residuals[-1]:.3g} > tol={self.tol:g}: the components are not converged "
                          f"(converged_ is False)", stacklevel=2)
        self._eigenvalues_ = theta[:k]
        self._history_, self.residuals_, self.converged_ = history, residuals, converged
        self.rounds_ = len(history)
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        # Eigenvectors have no sign: orient them as a power iteration from the shared positive start would.
        U = align_signs(U[:, :k].contiguous(), shared_start(n, k, self.seed, 1, device=X.device))
        self._finish(fed, parties, Xc, U)
        return self

    def _center(self, X):
        if self.center:
            return center_columns(X)
        return X, torch.zeros(X.shape[1], dtype=X.dtype, device=X.device)

    def _fit_rotated(self, X, fed: Federation, parties, n: int) -> "ExactFederatedPCA":
        """protocol='rotated' (see the module docstring); every data party and the coordinator call it."""
        started = time.perf_counter()
        k, client = self.n_components, fed.rank in parties
        coordinator = fed.coordinator
        Xc = None
        if client:
            Xc, self._mean_ = self._center(X)
        block = None
        with fed.phase(f"pca/{self.method}"):
            if client:
                # 1. The rotation's seed: drawn by the first party, sent to the other data parties only.
                secret = rotation_seed(fed, parties, self.mask_seed)
                P = haar_rotation(n, secret, device=Xc.device)
                B = P @ Xc
                part = B @ B.T                                   # P A_i P^T
                del B
            else:
                part = torch.zeros(n, n, dtype=torch.float64, device=self._device)
            # 2. One masked sum; only the coordinator gets the total P A P^T.
            stream = MaskStream.private(fed.rank) if self.mask_seed is None else MaskStream(self.mask_seed,
                                                                                           fed.rank)
            total = secure_sum(fed, part, out=coordinator, stream=stream, parties=[*parties, coordinator])
            del part
            # 3. The coordinator's eigenpairs, to every data party.
            if fed.rank == coordinator:
                W, theta = top_eigenpairs(total, k)
                block = torch.cat([W, theta[None, :]])
                del total, theta, W
            block = broadcast(fed, block, star([coordinator, *parties], center=coordinator), shape=(n + 1, k),
                              dtype=torch.float64)
        self._eigenvalues_ = block[n].to(self._device).contiguous()
        self.rounds_, self.converged_, self.residuals_ = 1, True, []
        self.fit_seconds_ = time.perf_counter() - started
        self._count_bytes(fed)
        if not client:
            self._sample_components_, self._loadings_, self._history_ = None, None, []
            return self
        # Eigenvectors have no sign: orient them as a power iteration from the shared positive start would.
        U = align_signs((P.T @ block[:n].to(Xc.device)).contiguous(), shared_start(n, k, self.seed, 1,
                                                                                    device=Xc.device))
        del P
        self._history_ = [U]
        self._finish(fed, parties, Xc, U)
        return self

    def _fit_covariance(self, X, fed: Federation, parties, n: int) -> "ExactFederatedPCA":
        """protocol='covariance' (see the module docstring); every data party and the coordinator call it.

        Party l's scaled columns Y_l = X_l / s (s^2 = ||X||_F^2 from a masked sum) make ||Y||_F = 1, so every
        entry of the d x d products Y_l^T Y_m lies in [-1, 1]. Fixed point with F = 30 bits puts the products
        at 60 fractional bits, below 2**63, with no truncation in Z_2^64 (truncating two-holder shares there
        fails with probability ~ |value| 2**-4 at this size). The rotation by P happens on the two holders'
        d x d shares in Z_2^128 (``sharing.rotate_shares``: truncations there fail with probability ~2**-46 per
        entry), with P encoded at 40 bits; the coordinator opens P C P^T / s^2 at 40 bits, so the result is
        exact to the data's ~2**-30 per entry.
        """
        started = time.perf_counter()
        k, d = self.n_components, self.n_features_total_
        coordinator, client = fed.coordinator, fed.rank in parties
        Xc = None
        if client:
            Xc, self._mean_ = self._center(X)
        if len(parties) == 1:
            if not client:
                return self._empty()
            theta, V = torch.linalg.eigh(Xc.T @ Xc)
            theta, V = theta.flip(0)[:k], V.flip(1)[:, :k]
            self.bytes_, self.messages_ = 0, 0
            return self._covariance_output(fed, parties, Xc, V, theta, started)
        if fed.rank not in parties and fed.rank != coordinator:
            return self._empty()
        offsets = [0]
        for w in self.party_widths_:
            offsets.append(offsets[-1] + w)
        F = COVARIANCE_FRAC_BITS
        fp, fp_out = FixedPoint(F), FixedPoint(COVARIANCE_OPEN_BITS)
        holders = (parties[0], parties[1])
        block = None
        # n d^2 ring products at the parties, d^3 in the rotation, while others wait: announced (public sizes).
        with fed.phase(f"pca/{self.method}"), fed.expect_work(n * d * d + d ** 3, "the covariance products"):
            P = None
            if client:
                if fed.rank in holders:             # only the holders rotate (the shares, then W back)
                    secret = rotation_seed(fed, list(holders), self.mask_seed)
                    P = haar_rotation(d, secret)
                norm2 = float(secure_allreduce(fed, (Xc ** 2).sum().reshape(1), parties=parties)[0])
                scale2 = norm2 if norm2 > 0 else 1.0
                Y = (Xc / scale2 ** 0.5).cpu()                   # n x f_l, ||Y||_F <= 1 over all parties
            # 1.-2. C / s^2 = Y^T Y in shares at the two holders: every other party secret-shares its columns
            #    between them (one opening, to the first), the holders multiply with one opening each way.
            stream = MaskStream.private(fed.rank) if self.mask_seed is None else MaskStream(self.mask_seed, fed.rank)
            with fed.phase(f"pca/{self.method}/products"):
                if self.covariance_sharing == "pairwise":
                    share = self._pairwise_shares(fed, Y if client else None, parties, coordinator, n, offsets, stream)
                else:
                    share = sharing.holder_gram(fed, Y if client else None, parties=parties, dealer=coordinator,
                                                widths=self.party_widths_, rows=n, fp=fp)
            # 3. The holders rotate their shares by P in Z_2^128 (sharing.rotate_shares): P C P^T / s^2, 40 bits.
            with fed.phase(f"pca/{self.method}/rotate"):
                if fed.rank in holders or fed.rank == coordinator:
                    share = sharing.rotate_shares(fed, share, P, holders=holders, dealer=coordinator,
                                                  frac_in=2 * F, frac_out=COVARIANCE_OPEN_BITS, shape=(d, d))
            if fed.rank in parties and fed.rank not in holders or fed.rank == coordinator:
                share = torch.zeros(d, d, dtype=torch.int64)
            # 4. One ring-masked sum of the two shares: only the coordinator gets P C P^T / s^2.
            total = masked_sum(fed, share, keep=parties[0], out=coordinator, stream=stream, group=RingGroup(),
                               reveal=True, parties=[*holders, coordinator])
            del share
            W = None
            if fed.rank == coordinator:
                M = fp_out.decode(total)
                M = (M + M.T) / 2
                theta, W = torch.linalg.eigh(M)
                block, W = theta.flip(0)[:k].contiguous(), W.flip(1)[:, :k].contiguous()
                del M, theta
            # 5. The eigenvalues to every data party; W only in shares at the two holders, which rotate them back,
            #    V = P^T W, and open to each party its own rows V_l (own_rows.py; issue 39: W and P together gave
            #    every party every other party's components).
            block = broadcast(fed, block, star([coordinator, *parties], center=coordinator), shape=(k,),
                              dtype=torch.float64)
            with fed.phase(f"pca/{self.method}/output"):
                V_own = open_own_rows(fed, W, P, holders=holders, dealer=coordinator, parties=parties,
                                      offsets=offsets, k=k)
            del W, P
        if not client:
            self._eigenvalues_ = block.to(self._device).contiguous()     # of P C P^T / s^2: ratios only
            self.rounds_, self.converged_, self.residuals_, self._history_ = 1, True, [], []
            self._sample_components_, self._loadings_ = None, None
            self.fit_seconds_ = time.perf_counter() - started
            self._count_bytes(fed)
            return self
        theta = block.to(Xc.device) * scale2
        self._count_bytes(fed)
        return self._covariance_output(fed, parties, Xc, V_own.to(Xc.device), theta, started)

    def _pairwise_shares(self, fed, Y, parties, coordinator, n: int, offsets, stream):
        """``covariance_sharing='pairwise'``: C / s^2 in shares at the two holders without trusting them apart.
        ``sharing.cross_products`` opens each party's masked columns once to every other party ((Q - 1) n d ring
        elements: 3x the data at Q = 4) and every pair then holds shares of its cross block; each party adds its own
        diagonal block, and the shares go down to the two holders through one masked sum. No coalition of data
        parties without the coordinator learns another party's columns (with 'holders', the two holders together
        hold every other party's columns)."""
        fp, fp2 = FixedPoint(COVARIANCE_FRAC_BITS), FixedPoint(2 * COVARIANCE_FRAC_BITS)
        d = offsets[-1]
        holders = (parties[0], parties[1])
        pair_shares = sharing.cross_products(fed, Y, parties=parties, dealer=coordinator, widths=self.party_widths_,
                                             rows=n, fp=fp)
        if fed.rank not in parties:
            return None
        me = parties.index(fed.rank)
        share = torch.zeros(d, d, dtype=torch.int64)
        lo, hi = offsets[me], offsets[me + 1]
        share[lo:hi, lo:hi] = fp2.encode(Y.T @ Y)                 # the own diagonal block, 60 fractional bits
        for (i, j), z in pair_shares.items():
            a, b = parties.index(i), parties.index(j)
            share[offsets[a]:offsets[a + 1], offsets[b]:offsets[b + 1]] += z
            share[offsets[b]:offsets[b + 1], offsets[a]:offsets[a + 1]] += z.T
        del pair_shares
        if len(parties) == 2:
            return share
        # The first party's share is zero outside its rows and columns: re-randomised with the third party first,
        # else the masked sum at the second holder would show it, e.g., the third party's own block.
        share = sharing.rerandomise(fed, share, pair=(parties[0], parties[2]))
        if fed.rank in parties[1:]:
            total = masked_sum(fed, share, keep=parties[2], out=holders[1], stream=stream, group=RingGroup(),
                               reveal=True, parties=parties[1:])
            share = total if fed.rank == holders[1] else None
        return share

    def _empty(self) -> "ExactFederatedPCA":
        self._sample_components_, self._loadings_, self.bytes_, self.messages_, self.rounds_ = None, None, 0, 0, 0
        self.converged_, self._eigenvalues_, self._history_, self.residuals_ = None, None, [], []
        return self

    def _covariance_output(self, fed, parties, Xc, V_own, theta, started) -> "ExactFederatedPCA":
        """Sample-space vectors U = X V / sqrt(theta) from a masked sum of X_l V_l (n x k), then the usual outputs."""
        with fed.phase(f"pca/{self.method}/scores"):
            part = Xc @ V_own
            XV = secure_allreduce(fed, part, parties=parties) if len(parties) > 1 else part
        s = theta.clamp_min(0).sqrt()
        U = XV / torch.where(s > 0, s, torch.ones_like(s))
        n = Xc.shape[0]
        U = align_signs(U.contiguous(), shared_start(n, U.shape[1], self.seed, 1, device=Xc.device))
        self._eigenvalues_ = theta.contiguous()
        self.rounds_, self.converged_, self.residuals_ = 1, True, []
        self._history_ = [U]
        self.fit_seconds_ = time.perf_counter() - started
        if len(parties) > 1:
            self._count_bytes(fed)
        self._finish(fed, parties, Xc, U)
        return self
