"""FDSKL's ``shared`` protocol: the label holder learns f on its batch rows and gradient sums, no phases.

(Issue 35: the gradient sums, with the public W and b, let the label holder solve for the passive columns of its
batch rows; ``sealed.py``, the default since then, keeps them in shares and reuses this module's phases and
prediction. tests/test_fdskl_gradient_attack.py, docs/fdskl.md *Known leak*.)

The paper's protocol (``protocol='paper'``, ``protocol.py``) hands the
active party the phases theta_ij = w_j^T x_i + b_j (mod 2 pi) of every row it
evaluates. With W public, those are wrapped linear equations in the other
parties' columns: differences between rows cancel b_j, and least squares with
phase unwrapping rebuilds the passive columns (tests/test_fdskl_attack.py).
Here the active party receives only what the model needs.

Roles: the active party A (labels), passive parties, and a dealer D (the
coordinator process that ``vfl fdskl`` starts; it holds no data and receives
nothing but control messages). Per block t of r features a passive *keeper*
K_t is drawn from the public seed.

1. Phases with a dealt mask. D draws a fresh uniform angle beta_ij for every
   (row, feature) of the block and gives K_t its seed. In Algorithm 3's masked
   sum K_t adds delta_ij = beta_ij + b_j (b_j now comes from the public seed)
   and never removes it, so A receives S_ij = theta_ij + beta_ij: exactly
   uniform on the angle grid and independent of the data, since beta is
   fresh, uniform and unknown to A.
2. Features as products. cos(theta) = cos(S - beta), so

       phi_j(x_i) = sqrt(2) (cos S_ij cos beta_ij + sin S_ij sin beta_ij),

   a sum of products of an A-held number and a number known to K_t and D.
   ``vfltorch.comm.sharing.mul_dealt`` gives A and K_t additive shares on
   Z_2^64 of row-wise sums of such products with one message, A -> K_t, of
   e = x - a (uniform); D sends A a seed and the correction c_0. The cosines
   of beta come from a fixed-point table (16 fractional bits) that D sends
   once, so D's and K_t's operands are the same integers bit for bit.
3. Decision values as shares. Old coefficients only shrink, so with
   c = 1 - gamma lambda, f after iteration t is c^t F_t with
   F_t = sum_{s <= t} c^{-s} h_s and h_s(x_i) = sum_{j in block s} alpha_j phi_j(x_i).
   A folds c^{-s} alpha_j into its operand; every iteration adds the shares
   of h_t for all n training rows to the holders' shares of F. Products are
   not truncated (16 + 16 fractional bits, exact in the ring), so the shares
   of F open to the exact fixed-point value: the model does not depend on the
   masks at all, and the same public seed gives the same model bit for bit.
4. Iteration t: the parties open F on the B batch rows to A only (A learns
   f(x_i), i in I_t), A computes L'(f(x_i), y_i), the gradient sums
   g_k = sum_i L'_i phi_k(x_i) are computed as shares (A's operand
   sqrt2 L'_i cos S_ik ...) and opened to A, A sets alpha_k = -gamma g_k /(B r),
   and h_t is added to the shares of F.

What each role learns (semi-honest parties, a dealer that colludes with no
party): A learns f(x_i) on its batch rows, the r sums g_k per iteration, f on
the rows it asks to predict and on the monitor rows at most once per epoch,
and uniform values (S, c_0). A passive party learns the batch indices (public
seed) and uniform values (its shares, e, the masked partial sums of
Algorithm 3): no label, alpha or f. D learns nothing (it receives only the
row counts and the stop flag). A colluding with D (or with K_t) recovers the
phases of block t, i.e. falls back to the paper's leak.

This module trains the growing model (``n_components=None``). The bounded default
(``budget.py``) and prediction use a leaner form of steps 1-2 (issue 11): one keeper per
iteration (or per chunk of rows) for all D features, drawn from the public seed; the phases
travel as a star into A (``star_phases``: one message per passive party, masked by dealt
masks, instead of the masked sum's two trees); and both products (f on the batch, then the
gradient sums) run in a narrow ring (``StarProducts``: training's f in Z_2^20 and gradient sums
in Z_2^16, prediction's f in Z_2^24 (``predict_bits``: 20, 24 or 32), packed on the wire; A's
operand scaled per row so that the opened value cannot wrap, the keeper's cosines with the
fractional bits that balance the two roundings). What each role learns is unchanged; A colluding with that
iteration's keeper (who knows every passive party's mask) recovers each passive party's partial
phases, as before the phases of the iteration's features.

Bytes per iteration, on top of the paper's cached schedule (2Q - 2 messages of
n r angles): A -> K_t n x 2r ring words (16 n r bytes), D -> A n words, the
batch shares (Q - 1) B words, and 2B r + 2r words for the gradient.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import torch

from ..comm import Federation, MaskStream, broadcast, masked_sum, pairwise_tree
from ..comm.sharing import (_UINT16, _as_ring_operand, _from_ring_np, _mul_into, _pack_np, _pair_column_sums,
                             _row_sums, _stream_from, _uniform, deal_dealt, dealt_share,
                             dot_scales, fresh_seed, mul_dealt, open_shares, pack_words, post_words,
                             ring_words_from_bytes,
                             send_words, split_bytes, wire_bytes, word_bytes, words_from_bytes)
from ..devices import to_host
from .circle import Circle, KeptPhases
from .trainer import MONITOR_PHASE, TRAIN_PHASE, BatchSampler, TrainingLoop, log_interval, step_marks

SQRT2 = math.sqrt(2.0)
ANGLE_BITS = 16                  # the grid of the dealt masks: the cosine table has one entry per grid angle
FRAC_BITS = 16                   # fractional bits of each factor; products carry 2 * FRAC_BITS
PRODUCT_SCALE = 2.0 ** (2 * FRAC_BITS)
MAX_GROWTH_BITS = 20             # c^{-t} <= 2**20: |f| up to 2**10 then fits 2**63 with 32 fractional bits
CIRCLE = Circle(ANGLE_BITS)
SETUP_PHASE = "fdskl/setup"


# ------------------------------------------------------------------------------------------- cosines
def cosine_table() -> torch.Tensor:
    """round(cos(2 pi k / 2**16) * 2**16) for k = 0 .. 2**16 - 1, as int32 (the dealer's; sent once)."""
    k = torch.arange(2 ** ANGLE_BITS, dtype=torch.float64)
    return torch.round(torch.cos(k * (2 * math.pi / 2 ** ANGLE_BITS)) * 2 ** FRAC_BITS).to(torch.int32)


def pair_table(cosines: torch.Tensor) -> torch.Tensor:
    """(2**16, 2) rows [cos k, sin k] from a table of cosines (sin x = cos(x - pi/2)): one gather per angle."""
    k = torch.arange(2 ** ANGLE_BITS)
    return torch.stack([cosines, cosines[(k - 2 ** (ANGLE_BITS - 2)) % 2 ** ANGLE_BITS]], dim=1).contiguous()


REAL_PAIRS = pair_table(torch.cos(torch.arange(2 ** ANGLE_BITS, dtype=torch.float64) * (2 * math.pi / 2 ** ANGLE_BITS)))


def share_table(fed: Federation, dealer: int) -> torch.Tensor | None:
    """The dealer's fixed-point [cos, sin] table at every passive party and the dealer (None at the active)."""
    with fed.phase(SETUP_PHASE):
        if fed.rank == dealer:
            table = cosine_table()
            for p in fed.parties:
                if p != fed.active:
                    fed.send(table, p)
            return pair_table(table.to(torch.int64))
        if fed.rank in fed.parties and not fed.is_active:
            return pair_table(fed.recv(dealer, (2 ** ANGLE_BITS,), torch.int32, device="cpu").to(torch.int64))
    return None


def _index(words: torch.Tensor) -> torch.Tensor:
    if words.device.type != "cpu":
        words = words.cpu()
    if words.dtype == torch.int16 and _UINT16 is not None:
        return words.view(_UINT16).to(torch.int32)                # one pass: the word read unsigned
    return words.to(torch.int32) & 0xFFFF                         # the angle's grid index in [0, 2**16)



def cos_sin(pairs: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """[cos, sin] of 16-bit angle words, interleaved along the last dimension (... x 2k) from a pair table."""
    index = _index(words).reshape(-1)
    if pairs.element_size() in _WORD_OF and pairs.is_contiguous():
        # A pair of 4-byte entries is one 8-byte word (of 1-byte entries one 2-byte word: the narrow tables): one
        # gather of words (2x faster than of rows), then the words read back as their two entries. The same values.
        out = _pair_words(pairs).index_select(0, index).view(pairs.dtype)
    else:
        out = pairs.index_select(0, index)                       # 3x faster than pairs[index] here
    return out.reshape(*words.shape[:-1], 2 * words.shape[-1])


def _pair_words(pairs: torch.Tensor) -> torch.Tensor:
    """The table's [cos, sin] pairs as one 8-byte word each (a view), kept per table (asked for every iteration)."""
    cached = _PAIR_WORDS.get(id(pairs))
    if cached is not None and cached[0] is pairs:
        return cached[1]
    words = pairs.view(_WORD_OF[pairs.element_size()]).reshape(-1)
    if len(_PAIR_WORDS) >= 8:
        _PAIR_WORDS.clear()
    _PAIR_WORDS[id(pairs)] = (pairs, words)        # the table itself is kept: its id cannot be reused meanwhile
    return words


_PAIR_WORDS: dict = {}
_WORD_OF = {1: torch.int16, 2: torch.int32, 4: torch.int64}     # a pair of entries of this size as one word


def encode_factor(x: torch.Tensor) -> torch.Tensor:
    """Real factors (bounded by construction: |x| <= sqrt2 |coefficient|) -> fixed point with FRAC_BITS."""
    return torch.round(x * 2.0 ** FRAC_BITS).to(torch.int64)


def _coef_check(coef: torch.Tensor) -> None:
    peak = float(coef.abs().max()) if coef.numel() else 0.0
    if not math.isfinite(peak) or peak >= 2.0 ** 30:
        raise OverflowError(f"FDSKL shared protocol: a coefficient reached {peak:.4g}; the fixed-point factors "
                            f"need |value| < 2**30 (lower gamma or normalise the targets)")


# -------------------------------------------------------------------------------------------- phases
class DealtPhases:
    """What one evaluation of the feature map leaves at each role.

    ``S`` (active party): the masked phases, rows x (features of ``blocks``).
    ``groups``: for each keeper, the positions (in ``blocks``) of its blocks
    and, at that keeper and at the dealer, its masks beta for those features.
    """

    def __init__(self, S, groups):
        self.S = S
        self.groups = groups            # list of (keeper, feature columns (LongTensor), beta or None)
        self.product_seed = None
        self.carry = None


def dealt_phases(fmap, X: torch.Tensor, blocks, dealer: int) -> DealtPhases:
    """Algorithm 3 with the kept mask dealt by ``dealer`` (module docstring, step 1); SPMD incl. the dealer.

    The dealer passes an (m x 0) ``X`` (it knows the row count only).
    """
    fed = fmap.fed
    blocks = list(blocks)
    r = fmap.block_size
    m = X.shape[0]
    by_keeper: dict[int, list[int]] = {}
    for pos, t in enumerate(blocks):
        by_keeper.setdefault(fmap.keepers[t], []).append(pos)
    S = torch.empty(m, len(blocks) * r, dtype=CIRCLE.dtype) if fed.is_active else None
    groups = []
    for keeper in sorted(by_keeper):
        positions = by_keeper[keeper]
        cols = torch.cat([torch.arange(p * r, (p + 1) * r) for p in positions])
        shape = (m, len(cols))
        beta = None
        with fed.phase(f"{fed.current_phase}/deal"):
            if fed.rank == dealer:
                seed = fresh_seed()
                fed.send(seed, keeper)
                beta = _masks(seed, shape)
            elif fed.rank == keeper:
                beta = _masks(fed.recv(dealer, (2,), torch.int64, device="cpu"), shape)
        if fed.rank in fed.parties:
            part = CIRCLE.encode(X @ fmap.omega[:, _feature_index(fmap, [blocks[p] for p in positions])])
            if fed.rank == keeper:
                b = torch.cat([fmap.phase_words[blocks[p]] for p in positions]).cpu()
                stream = KeptPhases((beta + b).to(part.device))
            else:
                stream = fmap.masks
            total = masked_sum(fed, part, keep=keeper, out=fed.active, stream=stream, group=CIRCLE)
            if fed.is_active:
                S[:, cols] = total.cpu()
        groups.append((keeper, cols, beta))
    return DealtPhases(S, groups)


def _masks(seed: torch.Tensor, shape) -> torch.Tensor:
    words = [int(w) % (2 ** 64) for w in seed.tolist()]
    return MaskStream.from_entropy(words[0] << 64 | words[1]).draw(CIRCLE, shape)


def _feature_index(fmap, blocks) -> torch.Tensor:
    return torch.cat([fmap.block_features(t) for t in blocks]).to(fmap.omega.device)


# ------------------------------------------------------------------------------------------ products
def shared_decision(fed: Federation, ph: DealtPhases, coef: torch.Tensor | None, table, dealer: int,
                    m: int) -> torch.Tensor | None:
    """Shares of sum_j coef_j phi_j(x_i) over the features of ``ph`` (this party's share, (m,) int64).

    ``coef`` (active party only) has one real coefficient per feature column of
    ``ph``; shares carry 2 * FRAC_BITS fractional bits. Returns a zero share at
    parties that keep none of these blocks, None at the dealer.
    """
    mine = torch.zeros(m, dtype=torch.int64) if fed.rank in fed.parties else None
    for keeper, cols, beta in ph.groups:
        holders = (fed.active, keeper)
        x = y = None
        if fed.is_active:
            # [coef cos S, coef sin S] interleaved, laid out like the keeper's [cos beta, sin beta]
            c = SQRT2 * coef[cols].cpu().to(torch.float64)
            _coef_check(c)
            x = encode_factor(cos_sin(REAL_PAIRS, ph.S[:, cols]) * c.repeat_interleave(2))
        if fed.rank in (keeper, dealer):
            y = cos_sin(table, beta)
        z = mul_dealt(fed, x, y, holders=holders, dealer=dealer, kind="rowdot", shape_x=(m, 2 * len(cols)))
        if z is not None:
            mine += z
    return mine


def open_to_active(fed: Federation, share: torch.Tensor | None, m: int) -> torch.Tensor | None:
    """Sum the data parties' shares at the active party: real values (float64) there, None elsewhere."""
    if fed.rank not in fed.parties:
        return None
    total = open_shares(fed, share, holders=fed.parties, to=fed.active, shape=(m,))
    return None if total is None else total.to(torch.float64) / PRODUCT_SCALE


def _beta_for_round(fed: Federation, ph: DealtPhases, m: int, width: int) -> torch.Tensor | None:
    """The masks of a round's features as one (m x width) tensor at the keepers (their blocks) and the dealer."""
    out = None
    for _, cols, beta in ph.groups:
        if beta is not None:
            if out is None:
                out = torch.zeros(m, width, dtype=CIRCLE.dtype)
            out[:, cols] = beta
    return out


# ------------------------------------------------------------------------ one keeper, a star, Z_2^32
PRODUCT_BITS = 32                # products and openings in Z_2^32 (sharing.py): --product-bits 32, the distillation
PREDICT_BITS = 24                # prediction's f (predict_bits): Z_2^24, 3 bytes per word on the wire
PREDICT_RINGS = (20, 24, 32)
# Training's two products (issue 11, cost at Q = 2): f on the batch in Z_2^20 (a row dot of 2D terms), the
# gradient sums in Z_2^16 (row dots of 2B terms, B <= 256 at the defaults), packed on the wire. At Q = 2
# that is 2 + 2.5 x 2 + 2 x 2 = 11 bytes per (row, feature) against the paper's 4 (two 16-bit angles).
TRAIN_BITS = (20, 16)


def y_frac_bits(k: int, bits: int = PRODUCT_BITS) -> int:
    """Fractional bits of the keeper's [cos beta, sin beta] in a row dot of k products in Z_2^bits.

    A's operand gets the rest of the bits - 1 (``dot_scales``). The rounding error of A's
    factors grows like 2**(F - bits + 1) k**1.5, that of the keeper's like 2**-F k**0.5: they are
    equal at F = (bits - 0.5 - log2 k) / 2 (in Z_2^32: 10 for the forward pass at D = 1024, 12 to 13
    for a gradient over B = 256 to 32 rows; in Z_2^20 and Z_2^16: 4, and 3 to 5).
    """
    return int(min(FRAC_BITS, max(2, round((bits - 0.5 - math.log2(max(1, k))) / 2))))


def narrow_table(table: torch.Tensor | None, bits: int) -> torch.Tensor | None:
    """The dealer's [cos, sin] table (FRAC_BITS) rounded to ``bits``: the same integers at keeper and dealer, in the
    narrowest type that holds them (int8 up to 6 bits, as training's 3-5: a 128 KB table, which stays in a core's
    cache where the 512 KB of int32 pairs did not; int16 up to 14, else int32).

    Computed once per table and width (training asks for it every iteration); the result is read-only."""
    if table is None:
        return None
    cached = _NARROW.get((id(table), bits))
    if cached is not None and cached[0] is table:
        return cached[1]
    shift = FRAC_BITS - bits
    out = table if shift == 0 else (table + (1 << (shift - 1))) >> shift
    out = out.to(torch.int8 if bits <= 6 else torch.int16 if bits <= 14 else torch.int32)     # |cos| <= 2**bits
    if len(_NARROW) >= 8:
        _NARROW.clear()
    _NARROW[(id(table), bits)] = (table, out)       # the table itself is kept: its id cannot be reused meanwhile
    return out


_NARROW: dict = {}


def two_width_table(table: torch.Tensor, bits: int) -> torch.Tensor:
    """The [cos, sin] table at ``bits`` and ``bits`` - 1 fractional bits in one int8 per entry: v = 2 y + b, where
    y is the entry at ``bits`` (``narrow_table``) and y' = (y >> 1) + b the entry at ``bits`` - 1 (``two_widths``).

    One bit b in {0, 1} carries the narrower rounding: with u the entry times 2**bits, y = floor(u + 1/2) and
    y' = floor(u / 2 + 1/2); for even y = 2k, u / 2 lies in [k - 1/4, k + 1/4), so y' = k = y >> 1; for odd
    y = 2k + 1 it lies in [k + 1/4, k + 3/4), so y' is k or k + 1. |v| <= 2**(bits + 1) + 1 fits int8 up to
    ``_TWO_WIDTHS_MAX`` bits. The keeper and the dealer gather it once where a round's two products want
    neighbouring widths (f at 4 bits, a gradient over B = 256 rows at 3), and read both widths exactly as the two
    ``narrow_table`` gathers would (tests/test_fdskl_products_cpu.py). Cached and read-only like ``narrow_table``."""
    cached = _NARROW.get((id(table), bits, "two"))
    if cached is not None and cached[0] is table:
        return cached[1]
    if bits > _TWO_WIDTHS_MAX:
        raise ValueError(f"two_width_table: {bits} fractional bits do not fit int8 (at most {_TWO_WIDTHS_MAX})")
    y = narrow_table(table, bits).to(torch.int16)
    b = narrow_table(table, bits - 1).to(torch.int16) - (y >> 1)
    if not bool(((b == 0) | (b == 1)).all()):
        raise AssertionError("two_width_table: the narrower rounding is not (y >> 1) + b with b in {0, 1}")
    out = (2 * y + b).to(torch.int8)
    if len(_NARROW) >= 8:
        _NARROW.clear()
    _NARROW[(id(table), bits, "two")] = (table, out)
    return out


def two_widths(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two roundings of gathered ``two_width_table`` entries: (y, y') = (v >> 1, (v >> 2) + (v & 1)), int8
    (v >> 2 = y >> 1: b adds at most 1 / 4 to y / 2)."""
    return v >> 1, (v >> 2).add_(v & 1)


_TWO_WIDTHS_MAX = 5


REAL_PAIRS32 = REAL_PAIRS.to(torch.float32)      # A's [cos S, sin S]: 24 bits, beyond the keeper's 10


def keeper_operands(table, beta: torch.Tensor, fbits, bits, grad_cols, all_cols: bool) -> list:
    """The keeper's (and dealer's) known operands of a ``StarProducts`` round: [cos beta, sin beta] rounded to each
    product's F fractional bits (|y| <= 2**F), gathered from the narrow tables; one per product (f, then the
    gradient sums over ``grad_cols``, all D features where ``all_cols``). Elementwise in beta's rows, so the rows of
    several rounds may come in one call (``deal_rounds``)."""
    if all_cols and abs(fbits[0] - fbits[1]) == 1 and max(fbits) <= _TWO_WIDTHS_MAX:
        # F and F - 1 (f at D = 1024-1536 and a gradient over B = 256 rows, or over 32): both roundings
        # from one gather (``two_width_table``) instead of two.
        hi, lo = two_widths(cos_sin(two_width_table(table, max(fbits)), beta))
        y, y_grad = (hi, lo) if fbits[0] > fbits[1] else (lo, hi)
    else:
        y = y_grad = cos_sin(narrow_table(table, fbits[0]), beta)
        if grad_cols is not None and not (fbits[1] == fbits[0] and all_cols):      # else: f's pairs
            picked = beta if all_cols else beta[:, grad_cols]
            y_grad = cos_sin(narrow_table(table, fbits[1]), picked.contiguous())
    # Kept in the gather's narrow type (int8 at training's widths): the products widen them inside the
    # multiplication (``sharing._over_first``), which saves a full-size cast per product at both roles.
    ys = [_as_ring_operand(y, bits[0])]
    if grad_cols is not None:
        ys.append(_as_ring_operand(y_grad, bits[1]))
    return ys


def star_phases(fmap, X: torch.Tensor, blocks, dealer: int, keeper: int, dealer_io=None, carry=None,
                carry_bytes: dict | None = None, nowait: bool = False, *,
                features: torch.Tensor | None = None) -> DealtPhases:
    """Algorithm 3 with a dealt mask and one keeper K for all features of ``blocks``: a star into A.

    The dealer draws 128-bit seeds from the OS: one for beta (a fresh uniform
    angle per row and feature), sent to K only, and one for each other passive
    party p's mask m_p, sent to p and to K. p sends A its partial phases
    Z_p + m_p, K sends Z_K + b + beta - sum_p m_p, and A adds its own Z_A:
    S = theta + beta. Each message is uniform and the set of them is jointly
    uniform (beta and the m_p are fresh, independent and unknown to A); the
    passive parties and the dealer receive seeds only. One message per passive
    party (Q - 1 in all) instead of the masked sum's 2Q - 2: the dealer's beta
    already hides the total, so no second tree is needed.
    SPMD over the parties and the dealer (which passes an (m x 0) ``X``). ``dealer_io``: what
    carries the dealer's seeds (default the federation; training passes a ``DealerWindow``).
    ``carry`` (at a passive party): bytes (uint8) it appends to its message, or a callable that returns
    them, called once its phases are ready (what it appends may wait on a message it receives first);
    ``carry_bytes`` (at A): {passive party: the length of what it appends}; A finds the bytes in
    ``ph.carry`` ({party: uint8}). Training uses it for product shares that ride on a phase message
    (one message fewer each: ``budget.py``). ``nowait`` (a passive party): its message leaves without
    waiting for A (``Federation.send_nowait``); the handle is ``ph.sent``, to be waited by the caller.
    ``features``: an explicit (public) list of feature indices instead
    of the features of ``blocks`` (a compressed model's kept features, ``compress.py``).
    """
    extra = 0 if carry is None or callable(carry) else carry.numel() * carry.element_size()
    local = star_local(fmap, X, blocks, dealer, keeper, dealer_io, reserve=extra, features=features)
    return star_send(local, carry, carry_bytes, nowait)


class StarLocal:
    """What one party (or the dealer) does for a star of phases before any party's message: its local part.

    ``star_local`` makes it: the dealer's seeds (drawn and sent at the dealer, received at the passive parties),
    the masks they expand to, this party's own partial phases, and at a passive party those phases already masked
    (written into the message buffer when ``reserve`` bytes follow them). ``star_send`` then sends (a passive
    party) or receives and adds (the active party) the phase messages. Training makes round t + 1's local part
    while it waits for round t's messages (``budget.train_budget``: off the critical path); the values and the
    messages are those of ``star_phases``, which is the two in a row.
    """

    def __init__(self, fed, keeper, D, shape, beta, product_seed, part, message=None, reserve=0):
        self.fed, self.keeper, self.D, self.shape = fed, keeper, D, shape
        self.beta, self.product_seed = beta, product_seed
        self.part = part                # A: Z_A (encoded, int16); a passive party: its masked phases; None: the dealer
        self.message = message          # a passive party with ``reserve``: the uint8 message, phases first
        self.reserve = reserve


def star_local(fmap, X: torch.Tensor, blocks, dealer: int, keeper: int, dealer_io=None, *, reserve: int = 0,
               features: torch.Tensor | None = None) -> StarLocal:
    """The local part of ``star_phases`` (``StarLocal``): everything before the phase messages. SPMD over the
    parties and the dealer; the only messages are the dealer's seeds (``dealer_io``). ``reserve`` (a passive
    party): bytes it will append to its message (``star_send``'s ``carry``), written after the phases without a
    copy; 0 sends the phases alone, as their int16 words."""
    fed = fmap.fed
    io = fed if dealer_io is None else dealer_io
    blocks = list(blocks) if features is None else []
    m = X.shape[0]
    feats, W = _star_columns(fmap, blocks, features)
    shape = (m, len(feats))
    passive = [p for p in fed.parties if p != fed.active]
    others = [p for p in passive if p != keeper]
    beta = own_mask = None
    product_seed = None
    with fed.phase(f"{fed.current_phase}/deal"):
        if fed.rank == dealer:
            seeds = [fresh_seed() for _ in range(2 + len(others))]
            for p, seed in zip(others, seeds[1:]):
                io.send(seed, p)
            io.send(torch.cat(seeds), keeper)
            beta, product_seed = _masks(seeds[0], shape), seeds[-1]
        elif fed.rank == keeper:
            msg = io.recv(dealer, (2 * (2 + len(others)),), torch.int64, device="cpu")
            beta, product_seed = _masks(msg[:2], shape), msg[-2:]
            own_mask = beta + _star_words(fmap, blocks, features)
            for k in range(len(others)):
                own_mask = own_mask - _masks(msg[2 + 2 * k:4 + 2 * k], shape)
        elif fed.rank in others:
            own_mask = _masks(io.recv(dealer, (2,), torch.int64, device="cpu"), shape)
    part = message = None
    if fed.rank in fed.parties:
        part = CIRCLE.encode(X @ W)
        if part.device.type != "cpu":
            part = part.cpu()
        if not fed.is_active:
            if reserve:
                # The phases written straight into the message, the carried bytes to follow them (no cat).
                nbytes = part.numel() * part.element_size()
                message = torch.empty(nbytes + reserve, dtype=torch.uint8)
                part = torch.add(part, own_mask, out=message[:nbytes].view(part.dtype).view(part.shape))
            else:
                part.add_(own_mask)                                               # part is ours
    return StarLocal(fed, keeper, len(feats), shape, beta, product_seed, part, message, reserve)


def star_send(local: StarLocal, carry=None, carry_bytes: dict | None = None, nowait: bool = False) -> DealtPhases:
    """The phase messages of a star whose local part is ``local`` (``star_local``; the arguments as in
    ``star_phases``): a passive party sends its masked phases (and ``carry``), A receives them into S."""
    fed, shape = local.fed, local.shape
    passive = [p for p in fed.parties if p != fed.active]
    S = got = sent = None
    if fed.rank in fed.parties:
        part = local.part
        with fed.phase(f"{fed.current_phase}/star-sum"):
            if fed.is_active:
                S, got = part, {}
                words = shape[0] * shape[1]
                for p in passive:
                    extra = int((carry_bytes or {}).get(p, 0))
                    if extra:
                        msg = fed.recv(p, (words * part.element_size() + extra,), torch.uint8, device="cpu")
                        phases, got[p] = split_bytes(msg, [words * part.element_size(), extra])
                        S.add_(phases.view(CIRCLE.dtype).reshape(shape))          # S is ours (encode's)
                    else:
                        S.add_(fed.recv(p, shape, CIRCLE.dtype, device="cpu"))
            else:
                extra = None if callable(carry) else carry
                size = 0 if extra is None else extra.numel() * extra.element_size()
                if size != local.reserve:
                    raise ValueError(f"star_send: {size} carried bytes, but the local part reserved {local.reserve}")
                if size:
                    masked = local.message
                    masked[masked.numel() - size:] = extra.reshape(-1).view(torch.uint8)
                else:
                    masked = part
                    extra = carry() if callable(carry) else None
                    if extra is not None and extra.numel():
                        masked = torch.cat([masked.reshape(-1).view(torch.uint8), extra.reshape(-1)])
                if nowait:
                    sent = fed.send_nowait(masked, fed.active)
                else:
                    fed.send(masked, fed.active)
    ph = DealtPhases(S, [(local.keeper, all_columns(local.D), local.beta)])
    ph.carry = got
    ph.sent = sent
    ph.product_seed = local.product_seed    # keeper and dealer: the seed of the keeper's product shares (StarProducts)
    return ph


def post_star_recvs(fed: Federation, m: int, D: int, carry_bytes: dict | None = None) -> None:
    """At A: post the receives of the next star's phase messages (``star_send`` takes them: m rows, D features,
    ``carry_bytes`` as there), for a caller that knows no other message of those parties comes first."""
    for p in fed.parties:
        if p == fed.active:
            continue
        extra = int((carry_bytes or {}).get(p, 0))
        if extra:
            fed.post_recv(p, (m * D * CIRCLE.dtype.itemsize + extra,), torch.uint8)
        else:
            fed.post_recv(p, (m, D), CIRCLE.dtype)


def post_operand_recvs(fed: Federation, m: int, D: int, G: int, bits) -> None:
    """At a keeper: post the receives of A's two masked operands of a ``StarProducts`` round (e of f, m x 2D
    words, then e of the gradient sums over G features, m x 2G), in the order A sends them."""
    post_words(fed, fed.active, (m, 2 * D), bits[0])
    post_words(fed, fed.active, (m, 2 * G), bits[1])


def deal_rounds(io, table, rounds, m: int, D: int, bits, workspace: dict | None = None) -> None:
    """At the dealer: its part of several training rounds (``rounds``: (t, keeper) each; ``budget._shared_round``
    with all D features in both products, the gradient over all of them, ``bits`` below 32 in at least one
    product). The same draws in the same order, and the same messages, as one ``star_local`` and one
    ``StarProducts`` per round; the gathers and both products of all the rounds in one pass each (issue 11: at
    B = 64 the dealer's per-round calls cost more CPU than its arithmetic, on the two cores all processes share).
    ``io``: the ``DealerWindow``, each round's messages tagged with its t. ``workspace``: a dict that keeps the
    masks' buffers from one call to the next (the caller's, one per training run): multi-MB buffers allocated
    afresh cost a page fault per 4 kB at every call.
    """
    k = len(rounds)
    bits = [int(b) for b in bits]
    if min(bits) >= 32:
        raise ValueError("deal_rounds: the packed corrections of rings below 32 bits only (deal_dealt's other format)")
    fbits = [y_frac_bits(2 * D, bits[0]), y_frac_bits(2 * m, bits[1])]
    ring = [np.dtype(np.int16 if b == 16 else np.int32) for b in bits]
    pad = 15                                                    # (MaskStream.fill's room after the last round)
    n_beta, n_op = 2 * m * D, [2 * m * D * r.itemsize for r in ring]
    space = {} if workspace is None else workspace

    def buffer(name, size):
        buf = space.get(name)
        if buf is None or buf.size < size:
            buf = space[name] = np.empty(size, dtype=np.uint8)
        return buf
    beta_buf = buffer("beta", k * n_beta + pad)
    op_bufs = [buffer(f"a{j}", k * n + pad) for j, n in enumerate(n_op)]
    active = io.active
    passive = [p for p in io.parties if p != active]
    heads, c1s = [], []
    for i, (t, keeper) in enumerate(rounds):
        # star_local's seeds (the keeper's mask, those of the other passive parties, the keeper's product seed),
        # then deal_dealt's seed of A's masks: fresh_seed in star_local's and deal_dealt's order.
        others = [p for p in passive if p != keeper]
        seeds = [fresh_seed() for _ in range(2 + len(others))]
        io.round = t
        for p, seed in zip(others, seeds[1:]):
            io.send(seed, p)
        io.send(torch.cat(seeds), keeper)
        _stream_from(seeds[0]).fill(beta_buf[i * n_beta:], n_beta)           # beta (``_masks``: the same bytes)
        s0 = fresh_seed()
        g0, g1 = _stream_from(s0), _stream_from(seeds[-1])
        for buf, n in zip(op_bufs, n_op):                                      # a of f, then of the gradient
            g0.fill(buf[i * n:], n)
        c1s.append([_uniform(g1, (m,), bits[0]).numpy(), _uniform(g1, (D,), bits[1]).numpy()])
        heads.append(s0.numpy().view(np.uint8))
    beta = torch.from_numpy(beta_buf[:k * n_beta].view(CIRCLE.NUMPY[CIRCLE.bits]).reshape(k * m, D))
    y_f, y_g = keeper_operands(table, beta, fbits, bits, all_columns(D), True)
    a_f = torch.from_numpy(op_bufs[0][:k * n_op[0]].view(ring[0]).reshape(k * m, 2 * D))
    a_g = torch.from_numpy(op_bufs[1][:k * n_op[1]].view(ring[1]).reshape(k, m, 2 * D))
    if not (_mul_into(a_f, y_f) and _mul_into(a_g, y_g.view(k, m, 2 * D))):
        raise AssertionError("deal_rounds: the products' operands do not multiply in place")
    rows = _row_sums(a_f).numpy().reshape(k, m)                        # f: a row dot per row (``_rowdot``)
    cols = _pair_column_sums(a_g).numpy()                              # the gradient: ``_coldot`` per round
    for i, (t, _) in enumerate(rounds):
        c0s = []
        for z, c1, w in ((rows[i], c1s[i][0], bits[0]), (cols[i], c1s[i][1], bits[1])):
            c = z - c1                                                                  # (the ring wraps)
            c0s.append(_pack_np(c, w) if w < 32 else c.view(np.uint8))
        io.round = t
        io.send(torch.from_numpy(np.concatenate([heads[i], *c0s])), active)


def all_columns(D: int) -> torch.Tensor:
    """torch.arange(D), one shared (read-only) tensor per D: training asks for it several times per iteration,
    and ``StarProducts`` recognises it without comparing D indices."""
    cols = _ALL.get(D)
    if cols is None:
        if len(_ALL) >= 8:
            _ALL.clear()
        cols = _ALL[D] = torch.arange(D)
    return cols


_ALL: dict = {}


def _star_key(fmap, blocks, features):
    return None if features is not None else (tuple(blocks), fmap.n_features)


def _star_columns(fmap, blocks, features):
    """(feature indices, this party's columns of W for them): built once per set of blocks (training asks for
    all D features every iteration: 0.5 ms at each party saved per iteration), the explicit ``features``
    (a compressed model's) each time."""
    key = _star_key(fmap, blocks, features)
    cached = getattr(fmap, "_star_cache", None)
    if key is not None and cached is not None and cached[0] == key:
        return cached[1], cached[2]
    feats = _feature_index(fmap, blocks) if features is None else features.to(fmap.omega.device)
    W = fmap.omega[:, feats]
    if key is not None:
        fmap._star_cache = (key, feats, W, None)
    return feats, W


def _star_words(fmap, blocks, features) -> torch.Tensor:
    """b_j of the star's features (``_phase_words``), kept with the columns of ``_star_columns``."""
    key = _star_key(fmap, blocks, features)
    cached = getattr(fmap, "_star_cache", None)
    if key is None or cached is None or cached[0] != key:
        return _phase_words(fmap, blocks, features)
    if cached[3] is None:
        fmap._star_cache = cached[:3] + (_phase_words(fmap, blocks, features),)
    return fmap._star_cache[3]


def _phase_words(fmap, blocks, features) -> torch.Tensor:
    """b_j (public under shared) of the features of ``blocks``, or of the explicit ``features``."""
    if features is None:
        return torch.cat([fmap.phase_words[t] for t in blocks]).cpu()
    every = torch.cat([fmap.phase_words[t] for t in range(fmap.n_blocks)]).cpu()
    return every[features.cpu()]


_SQRT2_32 = np.float32(SQRT2)
# 1.5 * 2**23 as a float32 scalar tensor: v + it, for |v| < 2**22, is 0x4B400000 + round(v) bit for bit
# (``StarProducts._masked_operand``).
_ROUND_BIAS = torch.tensor(1.5 * 2.0 ** 23, dtype=torch.float32)


def _factors32(v: torch.Tensor) -> np.ndarray:
    """sqrt2 v in float32, checked finite, as a numpy vector: ``SQRT2 * v.to(torch.float32)`` (checked) with the
    same values (the float64 -> float32 cast and the float32 product round alike; torch multiplies a float32
    tensor by a Python scalar in float32) in numpy calls (~1 us) instead of torch calls (~3.5 us)."""
    if v.requires_grad:
        v = v.detach()
    with np.errstate(over="ignore", invalid="ignore"):         # (torch casts and multiplies without a warning)
        w = (v if v.device.type == "cpu" else v.cpu()).numpy().astype(np.float32) * _SQRT2_32
    if not np.isfinite(w).all():
        raise OverflowError("FDSKL shared protocol: a non-finite coefficient or loss derivative")
    return w


class StarProducts:
    """Row-wise products of A's operands with the keeper's [cos beta, sin beta], opened to A, in Z_2^w.

    ``bits``: (w of ``forward``, w of ``gradient``), each in ``sharing.WIRE_BITS`` (default both 32; training
    passes ``TRAIN_BITS``, prediction its ``predict_bits``).

    ``forward``: f_i = sum_j c_j phi_j(x_i) for A's coefficients c (D, or D x classes).
    ``gradient``: g_j = sum_i w_i phi_j(x_i) for A's row weights w, over the features ``grad_cols``.
    The dealer's material for both travels in one message to A before any data message
    (``deal_dealt``; K's seed came with its phase seeds, ``star_phases``); each product is then one message
    A -> K (e, w-bit words) and one K -> A (K's share, w-bit words). ``operand`` / ``share`` / ``open`` are
    the same products in split form, for a caller that carries e and the share inside messages of its own
    (the pipelined training iteration, ``budget._Pipeline``: the same values and bytes, fewer messages).
    """

    def __init__(self, fed: Federation, ph: DealtPhases, table, dealer: int, m: int, *, classes: int | None = None,
                 grad_cols: torch.Tensor | None = None, bits=(PRODUCT_BITS, PRODUCT_BITS), dealer_io=None):
        self.fed, self.dealer = fed, dealer
        (self.keeper, cols, beta), = ph.groups
        self.holders = (fed.active, self.keeper)
        self.m, self.D = m, len(cols)
        self.classes = classes
        self.grad_cols = grad_cols
        self.S = ph.S
        self.pairs = None
        self.pending = None             # a deferred gradient opening: (this holder's share, A's row scales)
        self.scales = {}                # A's row scales of the products whose operand went out (operand / open)
        lead = () if classes is None else (classes,)
        # Both products' operands are laid out like S: rows x [cos, sin] pairs of the features. f is a row dot
        # ("rowdot"); the gradient sums are column dots of pairs down the rows ("coldot", sharing._coldot), so no
        # role makes a transposed copy of its operand.
        shapes = [lead + (m, 2 * self.D)]
        self.kinds = ["rowdot"]
        self.bits = [int(bits[0])] + ([int(bits[1])] if grad_cols is not None else [])
        self.fbits = [y_frac_bits(2 * self.D, self.bits[0])]
        if grad_cols is not None:
            shapes.append((m, 2 * len(grad_cols)))
            self.kinds.append("coldot")
            self.fbits.append(y_frac_bits(2 * m, self.bits[1]))
        ys = None
        if beta is not None:                                    # keeper and dealer
            ys = keeper_operands(table, beta, self.fbits, self.bits, grad_cols,
                                 grad_cols is not None and self._all(grad_cols))
        self.ys = ys
        self.shapes = shapes
        with fed.phase(f"{fed.current_phase}/deal"):
            dealt = deal_dealt(fed if dealer_io is None else dealer_io, ys, holders=self.holders, dealer=dealer,
                               kind=self.kinds, shapes_x=shapes,
                               shapes_y=[(m, 2 * self.D)] + ([(m, 2 * len(grad_cols))] if grad_cols is not None
                                                             else []), bits=self.bits, h1_seed=ph.product_seed)
        self.dealt = dealt if fed.rank in self.holders else None

    def _all(self, cols: torch.Tensor) -> bool:
        if cols is _ALL.get(self.D):
            return True
        return len(cols) == self.D and bool((cols == torch.arange(self.D)).all())

    def _cos_sin_S(self) -> torch.Tensor:
        if self.pairs is None:
            self.pairs = cos_sin(REAL_PAIRS32, self.S)          # (m x 2D) real [cos S, sin S]
        return self.pairs

    def _multiply(self, k: int, value: torch.Tensor | None):
        """This holder's share of product k (mod 2**bits) and, at A, its row scales; (None, None) elsewhere. A passes
        the product's coefficients or row weights (``value``): its part of ``mul_dealt`` with the dealt material is
        to send e (``_masked_operand``) and keep its correction c_0 as its share."""
        fed = self.fed
        if fed.rank not in self.holders:
            return None, None
        with fed.phase(f"{fed.current_phase}/{'forward' if k == 0 else 'gradient'}"):
            if fed.is_active:
                e, scales = self._masked_operand(k, value)
                send_words(fed, e, self.keeper, self.bits[k])
                return self.dealt[k][1], scales
            z = mul_dealt(fed, None, self.ys[k], holders=self.holders, dealer=self.dealer, kind=self.kinds[k],
                          shape_x=self.shapes[k], dealt=self.dealt[k], bits=self.bits[k])
        return z, None

    def _masked_operand(self, k: int, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """At A: e = x_enc - a of product k (``dealt_operand``, ring words) for coefficients (k = 0) or row weights
        (k = 1) ``value``, and the scales that divide the opened values.

        f's operand in Z_2^20 in two passes instead of five (scale, round, cast, subtract): ``addcmul`` adds
        1.5 * 2**23 to each float32 product c_j [cos S, sin S]_ij, which leaves round(x) (half to even, as
        ``torch.round``) in the low 22 bits of the float's bit pattern 0x4B400000 + round(x) while |x| < 2**22
        (here |x| < 2**(w - 1 - F): ``_encode``); 0x4B400000 is a multiple of 2**22, so those bits read as int32,
        minus a, are e mod 2**20 (the wire keeps only those bits). Other widths: ``_encode``, then the subtraction
        in place.
        """
        a = self.dealt[k][0]
        if k == 0 and self.bits[0] == 20:
            cs, factors, scales = self._forward_parts(value)
            y = torch.addcmul(_ROUND_BIAS, cs, factors)
            return y.view(torch.int32).sub_(a), scales
        x, scales = self._forward_x(value) if k == 0 else self._gradient_x(value)
        if k == 1 and self.bits[1] == 16:
            # The gradient's operand in Z_2^16: the same bias (after the product, so round(x) of the float32 product
            # exactly as ``_encode``'s round), then the int32 bits' low 16 bits (the narrowing cast wraps):
            # one pass fewer than round, cast.
            e = x.add_(_ROUND_BIAS).view(torch.int32).to(torch.int16)
            return e.sub_(a), scales
        xe = self._encode(k, x)
        return (xe.sub_(a) if xe.dtype == a.dtype else xe - a), scales         # (64-bit words: int64 a)

    def _encode(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """A's operand of product k in fixed point: x, already scaled (``_forward_x`` / ``_gradient_x``), rounded to
        int32 words (int16 in Z_2^16, the ring's own type, ``sharing._ring_dtype``).

        No wrap (the opened value is exact): with w = self.bits[k], F = self.fbits[k], |y| <= 2**F (rounded
        cosines) and the operand's scales from a bound of each product's sum of |x| (``_scales``, ``dot_scales``),
        every opened integer |sum x_enc y| <= 2**F (s sum |x| (1 + 2**-23) + k / 2) < 2**(w - 1), so the shares'
        sum mod 2**w, read signed (from_ring), is that integer; in Z_2^16 every |x_enc| < 2**(15 - F), so the
        cast to int16 is exact. tests/test_fdskl_products_cpu.py checks the bound with |y| = 2**F and signs chosen
        against A's rounding.
        """
        return x.round_().to(torch.int16 if self.bits[k] == 16 else torch.int32)         # x is ours: in place

    def _scales(self, k: int, factors: np.ndarray) -> np.ndarray:
        """A's scales for product k from its float32 ``factors`` (sqrt2 times the coefficients, or the row
        weights; one column per class or candidate), one per column: each output's operand is factors_j [cos S, sin S] over its
        pairs, and |cos S| + |sin S| <= sqrt2 (float32 table: (1 + 2**-23)), so sum |x| <= sqrt2 sum_j |factor_j|
        without a pass over x; at most 11% (0.15 bit) above the exact sum on average (E |cos| + |sin| = 4 / pi)."""
        f = self.fbits[k]
        count = factors.shape[0]
        bound = np.abs(factors).astype(np.float64).sum(0) * (SQRT2 * (1 + 2.0 ** -20))
        return dot_scales(bound, 2 * count, self.bits[k], f).numpy()

    def _decode(self, k: int, v, scales: torch.Tensor) -> torch.Tensor:
        """v / (s 2**F) in float64 (numpy: the same IEEE operations on these small vectors, fewer calls)."""
        v = v if isinstance(v, np.ndarray) else v.numpy()
        return torch.from_numpy(v.astype(np.float64) / (scales.numpy() * 2.0 ** self.fbits[k]))

    def _product(self, k: int, value: torch.Tensor | None, out_shape) -> torch.Tensor | None:
        z, scales = self._multiply(k, value)
        if z is None:
            return None
        fed = self.fed
        with fed.phase(f"{fed.current_phase}/{'forward' if k == 0 else 'gradient'}"):
            v = open_shares(fed, z, holders=self.holders, to=fed.active, shape=out_shape, bits=self.bits[k])
        return None if v is None else self._decode(k, v, scales)

    def _forward_parts(self, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A's operand of f as its two factors: [cos S, sin S] (m x 2D) and the scaled coefficients s c_j, each
        repeated for its pair (2D, or classes x 1 x 2D), broadcasting to the operand; and the scales s (one per
        class: ``_scales``' bound holds for every row), as they divide f."""
        c = _factors32(coef)                                            # sqrt2 c, float32, checked finite
        cs = self._cos_sin_S()
        s = self._scales(0, c)                                          # a scalar, or (classes,)
        cscaled = (c * s).astype(np.float32)        # (in float64: s may exceed float32's range; |c s| < 2**15)
        if self.classes is None:
            return cs, torch.from_numpy(np.repeat(cscaled, 2)), torch.from_numpy(s)
        scaled = torch.from_numpy(np.ascontiguousarray(np.repeat(cscaled.T, 2, axis=1)))     # classes x 2D
        return cs.unsqueeze(0), scaled.unsqueeze(1), torch.from_numpy(s[:, None])

    def _forward_x(self, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A's operand of f, scaled: s [c_j cos S_ij, c_j sin S_ij] interleaved per row (m x 2D, or classes x m x 2D),
        and its scales s."""
        cs, factors, scales = self._forward_parts(coef)
        return cs * factors, scales

    def _gradient_x(self, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A's operand of the gradient sums, scaled, laid out like S: x[i] = s w_i [cos S_ij, sin S_ij] over the
        columns ``grad_cols`` (m x 2G), and the scales s (G,) of the column sums."""
        w = _factors32(weights)
        s = self._scales(1, w)                                          # one scale: every column has these weights
        ws = torch.from_numpy((w * s).astype(np.float32))                 # (in float64, as in _forward_x)
        cs = self._cos_sin_S()
        G = len(self.grad_cols)
        if not self._all(self.grad_cols):
            cs = cs.view(self.m, self.D, 2)[:, self.grad_cols].reshape(self.m, 2 * G)
        return cs * ws.unsqueeze(1), torch.from_numpy(np.repeat(s, G))

    def forward(self, coef: torch.Tensor | None) -> torch.Tensor | None:
        """f at A: (m,) for coefficients (D,), (m x classes) for (D x classes); None elsewhere."""
        out_shape = (self.m,) if self.classes is None else (self.classes, self.m)
        f = self._product(0, coef, out_shape)
        return f if f is None or self.classes is None else f.T

    # ``forward`` in two halves around the wait for the keeper's share, so that A can do other local work in it
    # (budget.py: round t + 1's local part). The same messages, values and sub-phases as ``forward``.
    def forward_begin(self, coef: torch.Tensor | None) -> None:
        """A: starts sending e of f (``forward_end`` receives the keeper's share); the keeper: its whole part of ``forward``
        (receives e, sends its share without waiting for A to take it: ``forward_end`` waits); elsewhere nothing."""
        fed = self.fed
        if fed.is_active:
            # e of f leaves with ``send_nowait`` (the bytes of mul_dealt's send_words): A goes on with round t + 1's
            # local part while the transfer runs (a blocking send held A 0.45 ms per iteration on phishing).
            e, scales = self._masked_operand(0, coef)
            with fed.phase(f"{fed.current_phase}/forward"):
                # The keeper's share is what it sends A next (``forward_end`` takes it): posted before e leaves, so
                # the share leaves the keeper at once (``Federation.post_recv``).
                post_words(fed, self.keeper, self._share_shape(), self.bits[0])
                sent = fed.send_nowait(pack_words(e, self.bits[0]), self.keeper)
            self._begun = (self.dealt[0][1], scales, sent)          # A's share of f is its correction c_0
        elif fed.rank == self.keeper:
            # Its share (mul_dealt) goes to A as open_shares sends it (``send_words``' packing), but with
            # ``send_nowait``: the keeper goes on with its own local work while A finishes its own.
            z, _ = self._multiply(0, None)
            with fed.phase(f"{fed.current_phase}/forward"):
                self._begun = fed.send_nowait(pack_words(z, self.bits[0]), fed.active)

    def forward_end(self) -> torch.Tensor | None:
        """A: f from its share and the keeper's (as ``forward`` returns it); None elsewhere (the keeper: once A
        has its share; a dead A raises ``PartyFailure`` here)."""
        fed = self.fed
        if not fed.is_active:
            sent, self._begun = getattr(self, "_begun", None), None
            if sent is not None:
                sent.wait()
            return None
        (z, scales, sent), self._begun = self._begun, None
        with fed.phase(f"{fed.current_phase}/forward"):
            v = open_shares(fed, z, holders=self.holders, to=fed.active, shape=self._share_shape(), bits=self.bits[0])
        sent.wait()                     # (done: the keeper's share needed all of e)
        f = self._decode(0, v, scales)
        return f if self.classes is None else f.T

    def _share_shape(self) -> tuple:
        """The shape of f's shares (and of f opened, before the transpose for classes)."""
        return (self.m,) if self.classes is None else (self.classes, self.m)

    # Split form of the two products, for a caller that carries e and the keeper's share inside messages of its
    # own (budget.py's pipelined iteration): the same values as forward / gradient, the same bytes.
    def operand_bytes(self, k: int) -> int:
        """Length of A's masked operand e of product k (0: f, 1: the gradient sums) on the wire."""
        return wire_bytes(int(math.prod(self.shapes[k])), self.bits[k])

    def share_bytes(self, k: int) -> int:
        """Length of the keeper's share of product k on the wire."""
        count = (self.m * (self.classes or 1)) if k == 0 else len(self.grad_cols)
        return wire_bytes(count, self.bits[k])

    def operand(self, k: int, value: torch.Tensor) -> torch.Tensor:
        """At A: e = x - a of product k as bytes, for coefficients (k = 0) or row weights (k = 1) ``value``."""
        e, self.scales[k] = self._masked_operand(k, value)
        return word_bytes(e, self.bits[k])

    def share(self, k: int, e: torch.Tensor) -> torch.Tensor:
        """At the keeper: its share of product k, as bytes, from A's e (bytes)."""
        e = ring_words_from_bytes(e, self.shapes[k], self.bits[k])
        z = dealt_share(self.kinds[k], e, self.ys[k], self.dealt[k], self.bits[k])
        return word_bytes(z, self.bits[k])

    def open(self, k: int, share: torch.Tensor) -> torch.Tensor:
        """At A: product k's values (f: (m,) or (m x classes); the gradient sums) from the keeper's share."""
        shape = self.dealt[k][1].shape
        total = self.dealt[k][1].numpy().astype(np.int64) + words_from_bytes(share, shape, self.bits[k]).numpy()
        v = self._decode(k, _from_ring_np(total, self.bits[k]), self.scales.pop(k))
        return v if k == 1 or self.classes is None else v.T

    def gradient(self, weights: torch.Tensor | None, defer: bool = False) -> torch.Tensor | None:
        """g_j = sum_i weights_i phi_j(x_i) for j in ``grad_cols``, at A; None elsewhere.

        ``defer`` (16-bit gradient words only): the keeper keeps its share (``carry``, int16 words for
        its next phase message, ``star_phases(carry=...)``) and A keeps its own; A then gets the sums
        from ``finish_gradient(words)``, or both call ``flush_gradient()`` (one message, as without defer).
        """
        if not defer:
            return self._product(1, weights, (len(self.grad_cols),))
        if self.bits[1] != 16:
            raise ValueError("a deferred gradient opening travels as int16 words: it needs a 16-bit ring")
        self.pending = self._multiply(1, weights)
        return None

    @property
    def carry(self) -> torch.Tensor | None:
        """At the keeper: its deferred share of the gradient sums as int16 words (the low 16 bits)."""
        z, _ = self.pending
        return z if z.dtype == torch.int16 else z.to(torch.int16)

    def finish_gradient(self, words: torch.Tensor) -> torch.Tensor:
        """At A: the gradient sums from its own share and the keeper's deferred int16 words."""
        z, scales = self.pending
        self.pending = None
        total = z.numpy().astype(np.int64) + (words.numpy().astype(np.int64) & 0xFFFF)
        return self._decode(1, _from_ring_np(total, 16), scales)

    def flush_gradient(self) -> torch.Tensor | None:
        """The deferred opening in a message of its own (the keeper to A); the sums at A, None elsewhere."""
        fed = self.fed
        if fed.rank not in self.holders:
            return None
        z, scales = self.pending
        self.pending = None
        with fed.phase(f"{fed.current_phase}/gradient"):
            v = open_shares(fed, z, holders=self.holders, to=fed.active, shape=(len(self.grad_cols),), bits=16)
        return None if v is None else self._decode(1, v, scales)


class DealerWindow:
    """The dealer's messages of several training iterations, one message per recipient (issue 11: time at Q = 2).

    Every send is a rendezvous of two processes (gloo's ``send`` returns when the receiver has posted its
    ``recv``), and on a loaded machine each one waits for a process to be scheduled. The dealer needs
    nothing from anyone during training, so it runs ahead: its seeds and corrections for up to ``size``
    iterations are buffered (``send``) and travel as one message per recipient (``flush``: its length,
    then the bytes), and each recipient takes its part of a window message by message (``recv``), in the
    order sent, so every message carries exactly what it carried alone. The dealer flushes before anything
    it must do in step with the others (the epoch-end monitor, the time budget, the end). Everything
    else is the federation's (attribute access is delegated), so a window stands in for the federation
    in ``star_phases`` and ``deal_dealt``. Bytes: the same, plus 8 per window and recipient.

    The dealer's window messages do not wait for their recipients (``Federation.send_nowait``): it goes on
    computing the next window while a recipient is still busy, and waits for a window's sends only when it
    flushes the next one (at most one window in flight per recipient) or at ``drain`` (the end of training).
    The recipients read the same messages in the same order.
    """

    def __init__(self, fed: Federation, dealer: int):
        self._fed, self._dealer = fed, dealer
        self._out: dict[int, list] = {}          # at the dealer: recipient -> byte tensors, in order
        self._inbox, self._at = None, 0          # at a recipient: the current window and the read position
        self._pending: list = []                 # at the dealer: the last flush's sends still under way
        self._tags: dict[int, list] = {}         # at the dealer: recipient -> the ``round`` of each buffered message
        self.round = None                        # the training iteration whose material is being buffered (a tag)

    def __getattr__(self, name):
        return getattr(self._fed, name)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        if self._fed.rank != self._dealer:
            self._fed.send(tensor, dst)
            return
        t = tensor.reshape(-1)                      # (a copy where it is not contiguous)
        if t.device.type != "cpu":
            t = t.cpu()
        self._out.setdefault(dst, []).append(t.view(torch.uint8).clone())
        self._tags.setdefault(dst, []).append(self.round)

    def queued_before(self, t: int) -> int:
        """At the dealer: the bytes buffered for iterations before ``t`` (tagged by ``round``; untagged ones
        count), with the 8-byte length of each window they will travel in: what it has committed to those
        iterations but not yet sent (a curve point's bytes, ``TrainingLoop.log_point``). 0 elsewhere."""
        total = 0
        for dst, parts in self._out.items():
            mine = [p.numel() for p, tag in zip(parts, self._tags[dst]) if tag is None or tag < t]
            if mine:
                total += sum(mine) + 8
        return total

    def recv(self, src: int, shape, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        fed = self._fed
        if src != self._dealer:
            return fed.recv(src, shape, dtype, device=device)
        shape = tuple(int(s) for s in shape)
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
        if self._inbox is None or self._at >= self._inbox.numel():
            size = int(fed.recv(src, (1,), torch.int64, device="cpu").item())
            if not 0 < size <= fed.max_message_bytes:
                raise OverflowError(f"the dealer announced a window of {size} bytes; refused")
            self._inbox, self._at = fed.recv(src, (size,), torch.uint8, device="cpu"), 0
        if self._at + nbytes > self._inbox.numel():
            raise ValueError("a dealer window ended inside a message: the parties disagree on the protocol")
        piece = self._inbox[self._at:self._at + nbytes]
        if self._at % dtype.itemsize:
            piece = piece.clone()                   # (viewed as wider words, a piece must start at their alignment)
        self._at += nbytes
        # A view of the window (each message its own bytes, so writing a piece changes no other; the window stays
        # alive while a piece does): no copy per message.
        piece = piece.view(dtype).reshape(shape)
        dev = fed.device if device is None else torch.device(device)
        return piece if dev.type == "cpu" else piece.to(dev)

    def flush(self) -> None:
        """At the dealer: send each recipient its buffered messages (recipients in the order first sent to)."""
        if self._fed.rank != self._dealer:
            return
        self.drain()
        for dst, parts in self._out.items():
            payload = torch.cat(parts)
            self._pending.append(self._fed.send_nowait(torch.tensor([payload.numel()], dtype=torch.int64), dst))
            self._pending.append(self._fed.send_nowait(payload, dst))
        self._out, self._tags = {}, {}

    def drain(self) -> None:
        """At the dealer: wait until every recipient has the windows sent so far (a dead one raises)."""
        pending, self._pending = self._pending, []
        for p in pending:
            p.wait()


# ------------------------------------------------------------------------------------------- training
def growth_limit(shrink: float) -> int | None:
    """Iterations before c^{-t} exceeds 2**MAX_GROWTH_BITS (None: no shrinkage, no limit)."""
    if shrink >= 1.0:
        return None
    return int(MAX_GROWTH_BITS / -math.log2(shrink))


def train_shared(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, dealer: int, table,
                 monitor=None, log=None, progress: bool = False):
    """Algorithm 1 (batched, cached schedule) under the ``shared`` protocol; SPMD over the parties and the dealer.

    ``X`` is this party's columns ((n x 0) at the dealer), ``y`` the labels at
    the active party. ``monitor`` is ``(X_monitor, y_monitor)`` or None (the
    same at every rank; (m x 0) at the dealer). Returns a ``TrainResult``.
    """
    n = X.shape[0]
    r = fmap.block_size
    active = fed.is_active
    is_party = fed.rank in fed.parties
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed)
    max_iter = max(1, math.ceil(cfg.epochs * sampler.per_epoch - 1e-9)) if cfg.epochs is not None else None
    log_every = log_interval(cfg.log_every, max_iter)
    shrink = 1.0 - cfg.gamma * cfg.lam
    limit = growth_limit(shrink)
    everyone = [fed.active] + [p for p in fed.parties if p != fed.active] + [dealer]
    control_tree = pairwise_tree(everyone)
    prefetch = max(1, int(cfg.prefetch))
    dtype = X.dtype
    F = torch.zeros(n, dtype=torch.int64) if is_party else None
    alpha = torch.zeros(0, dtype=torch.float64) if active else None        # current coefficients
    created = torch.zeros(0, dtype=torch.float64) if active else None      # alpha_s at creation (for monitoring)
    if active:
        y = y.to(torch.float64).cpu()
    mon = _SharedMonitor(fed, fmap, monitor, dealer, table) if monitor is not None else None
    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    fetched_until, round_start, ph, S_round, beta_round = 0, 0, None, None, None
    t = 0
    stopped_by_growth = False
    while True:
        started = time.perf_counter()
        with fed.phase(TRAIN_PHASE):
            if max_iter is not None and t >= max_iter:
                break
            if limit is not None and t >= limit:
                stopped_by_growth = True
                break
            if t == fetched_until:
                if cfg.max_time is not None and _stop_all(fed, control_tree, loop.train_seconds >= cfg.max_time):
                    break
                k = prefetch if max_iter is None else min(prefetch, max_iter - t)
                for _ in range(k):
                    fmap.add_block()
                ph = dealt_phases(fmap, X, range(t, t + k), dealer)            # step 1 for k blocks, all rows
                S_round = ph.S
                beta_round = _beta_for_round(fed, ph, n, k * r)
                round_start, fetched_until = t, t + k
            batch = sampler.next()
            B = len(batch)
            cols = slice((t - round_start) * r, (t - round_start + 1) * r)
            keeper = fmap.keepers[t]
            holders = (fed.active, keeper)
            knows_beta = fed.rank in (keeper, dealer)
            y_grad = y_step = None
            if knows_beta:
                y_grad = cos_sin(table, beta_round[batch, cols].T)          # (r, 2B): [cos, sin] beta_ik
                y_step = cos_sin(table, beta_round[:, cols])                # (n, 2r)
            # Both products' dealer material in one message per holder, ahead of the data messages.
            dealt = deal_dealt(fed, [y_grad, y_step] if knows_beta else None, holders=holders, dealer=dealer,
                               kind="rowdot", shapes_x=[(r, 2 * B), (n, 2 * r)],
                               shapes_y=[(r, 2 * B), (n, 2 * r)])
            mine = dealt if fed.rank in holders else [True, True]      # elsewhere: nothing left to do
            # Line 6: f on the batch rows, opened to the active party only.
            f_open = open_to_active(fed, F[batch] if is_party else None, B)
            x = None
            if active:
                f_batch = f_open * shrink ** (t - 1) if t > 0 else torch.zeros(B, dtype=torch.float64)
                y_batch = y[batch]
                d_loss = cfg.loss.derivative(f_batch, y_batch)                     # L'(f(x_i), y_i)
                loop.add_loss(float(cfg.loss.value(f_batch, y_batch).mean()))
                # [L'_i cos S_ik, L'_i sin S_ik] over the batch rows i, one row per new feature k
                lp = SQRT2 * d_loss.to(torch.float64)
                _coef_check(lp)
                x = encode_factor(cos_sin(REAL_PAIRS, S_round[batch, cols].T) * lp.repeat_interleave(2))
            # Line 8: the r gradient sums g_k as shares, opened to the active party.
            z = mul_dealt(fed, x, y_grad, holders=holders, dealer=dealer, kind="rowdot", shape_x=(r, 2 * B),
                          dealt=mine[0])
            g = open_shares(fed, z, holders=holders, to=fed.active, shape=(r,)) if fed.rank in holders else None
            x = None
            if active:
                a_new = (-cfg.gamma / (B * r)) * (g.to(torch.float64) / PRODUCT_SCALE)
                alpha = torch.cat([alpha * shrink, a_new])                          # line 9
                created = torch.cat([created, a_new])
                c = SQRT2 * a_new * shrink ** (-t)
                _coef_check(c)
                x = encode_factor(cos_sin(REAL_PAIRS, S_round[:, cols]) * c.repeat_interleave(2))
            # F += c^{-t} h_t on every training row, as shares.
            z = mul_dealt(fed, x, y_step, holders=holders, dealer=dealer, kind="rowdot", shape_x=(n, 2 * r),
                          dealt=mine[1])
            if z is not None:
                F += z
        loop.tick(started)
        t += 1
        final, epoch_end = step_marks(t, max_iter, sampler.per_epoch)
        if t % log_every == 0 or final or epoch_end:
            use_mon = mon if (final or epoch_end) else None      # held-out values opened at epoch ends only
            with fed.phase(MONITOR_PHASE):
                f_mon = use_mon.update(created, shrink, t) if use_mon is not None else None
            loop.log_point(t, t * fmap.block_size, f_mon, use_mon, cfg, log, control_tree)
    loop.close()
    if stopped_by_growth and active:
        warnings.warn(f"FDSKL (shared protocol) stopped after {t} iterations: the coefficients' shrink factor "
                      f"(1 - gamma lambda)^-t reached 2**{MAX_GROWTH_BITS}, the fixed-point headroom. Lower lambda "
                      f"or gamma, or train fewer iterations.", RuntimeWarning, stacklevel=2)
    return loop.result(alpha.to(dtype) if active else None, t)


def _stop_all(fed: Federation, tree, mine: bool) -> bool:
    """The active party's stop decision for every party and the dealer: one flag down a tree."""
    flag = torch.tensor([1 if mine else 0], dtype=torch.int64) if fed.is_active else None
    flag = broadcast(fed, flag, tree, shape=(1,), dtype=torch.int64)
    return bool(int(flag[0]))


class _SharedMonitor:
    """Shares of f on held-out rows, brought up to date and opened to the active party at epoch ends only.

    Opening f on the same rows at every log step would let the active party
    difference consecutive values into per-block sums h_s(x_i); once per epoch
    it learns what it learns about each training row (one f value per epoch).
    """

    def __init__(self, fed, fmap, monitor, dealer, table):
        self.fed, self.fmap, self.dealer, self.table = fed, fmap, dealer, table
        self.X = monitor[0]
        self.y = None if monitor[1] is None else monitor[1].to(torch.float64).cpu()
        self.m = self.X.shape[0]
        self.F = torch.zeros(self.m, dtype=torch.int64) if fed.rank in fed.parties else None
        self.blocks_done = 0

    def update(self, created, shrink: float, t: int):
        fed, r = self.fed, self.fmap.block_size
        blocks = range(self.blocks_done, t)
        if len(blocks):
            ph = dealt_phases(self.fmap, self.X, blocks, self.dealer)
            coef = None
            if fed.is_active:
                s = torch.arange(self.blocks_done, t, dtype=torch.float64).repeat_interleave(r)
                coef = created[self.blocks_done * r:t * r] * shrink ** (-s)
            z = shared_decision(fed, ph, coef, self.table, self.dealer, self.m)
            if z is not None:
                self.F += z
        self.blocks_done = t
        f = open_to_active(fed, self.F, self.m)
        return None if f is None else f * shrink ** (t - 1)


# ----------------------------------------------------------------------------------------- prediction
def shared_decision_values(fed: Federation, fmap, X: torch.Tensor, alpha, *, dealer: int, table,
                           max_elements: int, classes: int | None = None,
                           support: torch.Tensor | None = None, bits: int = PRODUCT_BITS) -> torch.Tensor | None:
    """Algorithm 2 under the shared protocol: f on the rows of X, opened to the active party only.

    Per chunk of rows: the phases in one star (``star_phases``, one keeper drawn from the public seed per
    chunk) and one product of ``bits``-bit words (``PREDICT_RINGS``; A's per-row scale keeps the opened
    value from wrapping, ``StarProducts``): 2 (Q - 1) + 2 bits / 8 bytes per row and feature, 11, 12 or 14
    at Q = 4. The estimator's ``decision_function`` passes its ``predict_bits`` (default ``PREDICT_BITS``);
    the training-side openings (monitor rows, width selection) keep the default, Z_2^32.
    ``classes`` (known to every rank): ``alpha`` is D x classes
    (one-vs-rest) and the phases serve every class at once; f is rows x classes. ``support`` (public,
    every rank): evaluate only these features (a compressed model, ``compress.py``; the others have
    coefficient 0), so the bytes are those of D = len(support).
    """
    if bits not in PREDICT_RINGS:
        raise ValueError(f"prediction ring width must be one of {PREDICT_RINGS}, got {bits!r}")
    m = X.shape[0]
    f = None
    if fed.is_active:
        f = torch.zeros(m, dtype=torch.float64) if classes is None else torch.zeros(m, classes, dtype=torch.float64)
    if not fmap.n_blocks:
        return f
    width = fmap.n_features if support is None else len(support)
    # (the products are host arithmetic: the coefficients go to the host once, wherever the estimator keeps them)
    coef = None if alpha is None else to_host(alpha[:fmap.n_features] if support is None
                                              else alpha[support.to(alpha.device)])
    step = max(1, max_elements // max(1, width * (classes or 1)))
    for chunk, start in enumerate(range(0, m, step)):
        rows = slice(start, min(m, start + step))
        if support is None:
            ph = star_phases(fmap, X[rows], range(fmap.n_blocks), dealer, fmap.keeper_of(chunk))
        else:
            ph = star_phases(fmap, X[rows], None, dealer, fmap.keeper_of(chunk), features=support)
        prod = StarProducts(fed, ph, table, dealer, rows.stop - rows.start, classes=classes, bits=(bits, bits))
        part = prod.forward(coef)
        if fed.is_active:
            f[rows] = part
    return f
