"""FDSKL's Algorithm 3, batched: the phases w_j^T x_i + b_j of many rows and features, at the active party.

Every party l holds its columns (x)_l and the matching rows (w_j)_l of the
random directions (``FourierSampler``: the same seed everywhere, each party
generating only its own slice). For a set of rows and a set of features:

1. each party computes its partial projections Z_l = X_l W_l (rows x features)
   and reduces them mod 2*pi into wrap-around angles (``Circle.encode``);
2. every party except the feature's kept party l' adds a fresh uniform mask
   from its private stream; l' adds the feature's fixed phase b_j (its "mask"
   that is never removed, Algorithm 3's b^{l'});
3. the masked parts are summed over tree T1 and the fresh masks over tree T2,
   and T1, T2 are totally different (Definition 2); the active party gets
   sum(masked parts) - sum(fresh masks) = w_j^T x_i + b_j (mod 2*pi).

That is ``vfltorch.comm.masked_sum`` with the kept party's "stream" replaced by
its fixed phases (``KeptPhases``): one call per kept party, since the trees
depend on l'. Features come in blocks of r (one block per iteration of
Algorithm 1); the kept party of block t is drawn from the shared seed among
the passive parties (never the active party, which would then know b_j and
so the unmasked projection), and is the same whenever the block is evaluated,
at training and at prediction time, so b_j is too.

With one party (Q = 1) the same code runs with no masks and no messages: the
phases are X W + b, the centralised random features.
"""

from __future__ import annotations

import math

import torch

from ..comm import Federation, MaskStream, masked_sum
from ..comm.sharing import fresh_seed
from ..devices import to_host
from .circle import Circle, KeptPhases
from .random_features import FourierSampler, counter_words, derive_key, splitmix64_int

SQRT2 = math.sqrt(2.0)


class FederatedFeatureMap:
    """This party's share of FDSKL's growing random feature map (blocks of ``block_size`` features).

    Public state (the same at every party): the number of blocks and the kept
    party of each block (``keepers``). Private state: this party's rows of W
    (``omega``, its columns only) and, for the blocks it keeps, the phase
    words b_j (``phase_words``; derived from ``phase_key``, which only it
    should know under the paper's protocol). With ``public_phases`` (the
    ``shared`` protocol, whose security does not rest on b_j) every party
    derives every b_j from ``phase_key``, a public key.
    """

    def __init__(self, fed: Federation, sampler: FourierSampler, columns, block_size: int, *, seed: int,
                 phase_key: int, masks: MaskStream, circle: Circle | None = None,
                 dtype: torch.dtype = torch.float64, device="cpu", max_elements: int = 2 ** 22,
                 public_phases: bool = False):
        self.fed = fed
        self.sampler = sampler
        self.columns = torch.as_tensor(columns, dtype=torch.int64).reshape(-1)
        self.block_size = int(block_size)
        self.circle = circle or Circle(32)
        self.masks = masks
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_elements = int(max_elements)
        self._keeper_key = derive_key(seed, 0x4EE9)
        self._phase_key = int(phase_key)
        self.public_phases = bool(public_phases)
        self.keepers: list[int] = []
        self._omega = torch.empty(len(self.columns), 0, dtype=dtype, device=self.device)
        self.phase_words: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------- features
    @property
    def omega(self) -> torch.Tensor:
        """This party's rows of W: (its columns) x (features so far)."""
        return self._omega[:, : self.n_features]

    @property
    def n_blocks(self) -> int:
        return len(self.keepers)

    @property
    def n_features(self) -> int:
        return self.n_blocks * self.block_size

    def block_features(self, t: int) -> torch.Tensor:
        return torch.arange(t * self.block_size, (t + 1) * self.block_size, dtype=torch.int64)

    def _block_columns(self, blocks):
        """The features of ``blocks`` (in order) as a slice of the feature axis when they are consecutive
        (arithmetic: no index tensor), else as an int64 index on this party's device."""
        r = self.block_size
        first = blocks[0]
        if (isinstance(blocks, range) and blocks.step == 1) or all(t == first + i for i, t in enumerate(blocks)):
            return slice(first * r, (first + len(blocks)) * r)
        index = torch.tensor(blocks, dtype=torch.int64).mul_(r).unsqueeze(1) + torch.arange(r, dtype=torch.int64)
        return index.reshape(-1).to(self.device)

    def _kept_word_vector(self) -> torch.Tensor:
        """b_j for the features this party keeps, 0 elsewhere: one word per feature so far (rebuilt as blocks come)."""
        if getattr(self, "_kept_words", None) is None or len(self._kept_words) != self.n_features:
            mine = self.fed.rank
            self._kept_words = torch.cat([self.phase_words[t] if self.keepers[t] == mine else
                                          torch.zeros(self.block_size, dtype=self.circle.dtype, device=self.device)
                                          for t in range(self.n_blocks)])
        return self._kept_words

    def keeper_of(self, t: int) -> int:
        """The party l' whose phase stays in block t: a passive party drawn from the shared seed."""
        passive = [p for p in self.fed.parties if p != self.fed.active]
        if not passive:
            return self.fed.active                     # Q = 1: the centralised feature map
        if len(passive) == 1:
            return passive[0]                          # Q = 2: (h % 1 == 0 for every draw)
        # splitmix64 of t in Python integers: the same word as the tensor version, read unsigned (2**62 divides
        # 2**64, so the residue mod 2**62 is that of the signed word); no torch call per iteration.
        h = splitmix64_int(t, self._keeper_key) % (2 ** 62)
        return passive[h % len(passive)]

    def add_block(self) -> int:
        """Algorithm 1 line 4 for a block: draw (w_j)_l for this party's columns; the kept party draws b_j."""
        t = self.n_blocks
        features = self.block_features(t)
        w = self.sampler.omega(self.columns, features, dtype=self.dtype, device=self.device)
        start = t * self.block_size
        if self._omega.shape[1] < start + self.block_size:   # grow by doubling: amortised O(1) per block
            grown = torch.empty(len(self.columns), max(2 * self._omega.shape[1], start + self.block_size),
                                dtype=self.dtype, device=self.device)
            grown[:, :start] = self._omega[:, :start]
            self._omega = grown
        self._omega[:, start:start + self.block_size] = w
        keeper = self.keeper_of(t)
        self.keepers.append(keeper)
        if keeper == self.fed.rank or self.public_phases:
            self.phase_words[t] = counter_words(self._phase_key, features, self.circle.bits).to(self.device)
        return t

    # --------------------------------------------------------------- phases
    def phases(self, X: torch.Tensor, blocks) -> torch.Tensor | None:
        """w_j^T x_i + b_j (mod 2*pi, as circle integers) for the rows of X and the features of ``blocks``.

        Every party calls this with its own columns of the same rows and the
        same blocks; the active party gets a (rows x features) integer tensor
        (columns in the order of ``blocks``), the others ``None``. Rows are
        processed in chunks of at most ``max_elements`` values per message.
        """
        blocks = list(blocks)
        r = self.block_size
        m = X.shape[0]
        fed = self.fed
        by_keeper: dict[int, list[int]] = {}
        for pos, t in enumerate(blocks):
            by_keeper.setdefault(self.keepers[t], []).append(pos)
        step = max(1, self.max_elements // max(1, len(blocks) * r))
        if len(by_keeper) == 1 and step >= m:
            # One kept party and one chunk (the cached schedule's every iteration): no reassembly.
            (keeper, _), = by_keeper.items()
            return self._masked_phases(X, blocks, keeper)
        out = (torch.empty(m, len(blocks) * r, dtype=self.circle.dtype, device=self.device)
               if fed.is_active else None)
        for keeper in sorted(by_keeper):
            positions = by_keeper[keeper]
            targets = (torch.tensor(positions, dtype=torch.int64).mul_(r).unsqueeze(1)
                       + torch.arange(r, dtype=torch.int64)).reshape(-1).to(self.device)
            step = max(1, self.max_elements // max(1, len(positions) * r))
            for start in range(0, m, step):
                rows = slice(start, min(m, start + step))
                total = self._masked_phases(X[rows], [blocks[p] for p in positions], keeper)
                if fed.is_active:
                    if len(positions) == len(blocks):
                        out[rows] = total                      # one kept party: already in order
                    else:
                        out[rows, targets] = total
        return out

    def _masked_phases(self, X: torch.Tensor, blocks: list[int], keeper: int) -> torch.Tensor | None:
        """Algorithm 3 for the rows of X and ``blocks``, all kept by ``keeper``: one masked sum."""
        cols = self._block_columns(blocks)
        # Line 1: the party's partial projections, reduced mod 2*pi before they leave it.
        part = self.circle.encode(X @ self._omega[:, cols])
        if keeper == self.fed.rank:
            stream = KeptPhases(self._kept_word_vector()[cols])
        else:
            stream = self.masks
        # Lines 2-4: masked sums over T1, fresh masks over T2, the result at the active party.
        return masked_sum(self.fed, part, keep=keeper, out=self.fed.active, stream=stream, group=self.circle)

    def features(self, X: torch.Tensor, blocks, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """phi_j(x_i) = sqrt(2) cos(w_j^T x_i + b_j) at the active party, computed in the map's dtype
        and returned in ``dtype`` (default: the map's; a cast of the same values).

        16-bit angles: a lookup in the 65,536-entry table of ``Circle.scaled_cos`` (the same values as
        decode + cos). Alone (Q = 1, no message) the phases are encoded straight into table indices
        (``Circle.encode_index``: the same grid as the federated run, without the word tensor or the
        masked sum), in row chunks of at most ``max_elements`` values as ``phases`` would.
        """
        if not isinstance(blocks, range):
            blocks = list(blocks)
        if self.fed.num_parties == 1 and self.fed.is_active and self.circle.has_table() and len(blocks):
            cols = self._block_columns(blocks)
            W = self._omega[:, cols]
            words = self._kept_word_vector()[cols]                 # Q = 1: this party keeps every block
            table = self.circle.cos_table(self.dtype, self.device, SQRT2, dtype)
            m = X.shape[0]
            step = max(1, self.max_elements // W.shape[1])
            if step >= m:
                return self.circle.lookup(self.circle.encode_index(X @ W, words), table)
            out = torch.empty(m, W.shape[1], dtype=table.dtype, device=self.device)
            for start in range(0, m, step):
                rows = slice(start, min(m, start + step))
                out[rows] = self.circle.lookup(self.circle.encode_index(X[rows] @ W, words), table)
            return out
        theta = self.phases(X, blocks)
        if theta is None:
            return None
        return self.circle.scaled_cos(theta, self.dtype, SQRT2, dtype)

    def star_phases(self, X: torch.Tensor, features: torch.Tensor) -> torch.Tensor | None:
        """The phases of the rows of X on ``features`` at the active party, in one star (prediction).

        The active party only needs the sums theta_ij, so the passive parties send their masked
        partial phases straight to it (Q - 1 messages of rows x features angles) instead of the
        masked sum's two trees (2Q - 2 messages). Masks: every pair (p, p') of passive parties
        shares a fresh 128-bit OS-entropy seed (p draws it and sends it to p', 16 bytes); p adds
        the pair's mask stream, p' subtracts it, so the masks cancel in the sum; each feature's
        kept party adds its phase b_j, as in Algorithm 3. The active party learns the sums, what
        the masked sum gives it; every single message is uniform once Q >= 3 (at Q = 2 the one
        passive message is Z_p + b, as in the masked sum). SPMD over the data parties.
        """
        fed = self.fed
        features = to_host(features, torch.int64)
        n = len(features)
        # Every feature so far, in order (an unpruned model): a slice, no gathered copy of W and b.
        cols = (slice(0, n) if n == self.n_features and n and int(features[0]) == 0
                and int(features[-1]) == n - 1 and bool((features.diff() == 1).all())
                else features.to(self.device))
        part = self.circle.encode(X @ self.omega[:, cols])
        passive = [p for p in fed.parties if p != fed.active]
        mine = fed.rank
        if any(k == mine for k in self.keepers):
            # b_j of the features this party keeps, 0 elsewhere (one word per feature so far, built once per size).
            part = part + self._kept_word_vector()[cols]
        if not passive:
            return part
        shape = tuple(part.shape)
        if mine in passive:
            me = passive.index(mine)
            with fed.phase(f"{fed.current_phase}/seeds"):
                # Receive from the earlier parties before sending to the later ones: an order in which
                # blocking sends cannot deadlock (party k waits only on parties before it).
                for other in passive[:me]:
                    seed = fed.recv(other, (2,), torch.int64, device="cpu")
                    part = part - _seeded_words(seed, self.circle, shape).to(part.device)
                for other in passive[me + 1:]:
                    seed = fresh_seed()
                    fed.send(seed, other)
                    part = part + _seeded_words(seed, self.circle, shape).to(part.device)
        with fed.phase(f"{fed.current_phase}/star-sum"):
            if fed.is_active:
                for p in passive:
                    part = part + fed.recv(p, shape, self.circle.dtype, device=part.device)
                return part
            fed.send(part, fed.active)
        return None

    def decision_values(self, X: torch.Tensor, alpha: torch.Tensor | None,
                        support: torch.Tensor | None = None) -> torch.Tensor | None:
        """Algorithm 2: f(x) = sum_j alpha_j phi_j(x) for the rows of X, at the active party.

        Only the active party holds coefficients (it alone can evaluate L',
        which needs the labels), so the paper's tree sum of the parties'
        partial decision values f^l(x) is its own sum, and the phases travel
        in a star into it (``star_phases``). Rows are processed in chunks so
        that no more than ``max_elements`` phases are held at once.
        ``support`` (public): evaluate only these features (a compressed
        model; the others have coefficient 0).
        """
        m = X.shape[0]
        f = torch.zeros(m, dtype=self.dtype, device=self.device) if self.fed.is_active else None
        if not self.n_blocks:
            return f
        feats = torch.arange(self.n_features) if support is None else to_host(support, torch.int64)
        coef = None
        if alpha is not None:
            # (on the phases' device, in their dtype, once for all chunks)
            coef = alpha[: self.n_features][feats.to(alpha.device)].to(device=self.device, dtype=self.dtype)
        step = max(1, self.max_elements // max(1, len(feats)))
        for start in range(0, m, step):
            rows = slice(start, min(m, start + step))
            theta = self.star_phases(X[rows], feats)
            if theta is not None:
                phi = self.circle.scaled_cos(theta, self.dtype, SQRT2)
                f[rows] = phi @ coef
        return f


def _seeded_words(seed: torch.Tensor, circle: Circle, shape) -> torch.Tensor:
    """A pairwise mask: uniform angle words from a 128-bit seed (two int64 words)."""
    words = [int(w) % (2 ** 64) for w in seed.tolist()]
    return MaskStream.from_entropy(words[0] << 64 | words[1]).draw(circle, shape)
