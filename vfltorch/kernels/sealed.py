"""FDSKL's sealed protocol (issue 35): the label holder is opened f on its batch rows, and nothing per feature.

Why. Under ``protocol='shared'`` the active party A is opened the D gradient sums
g_j = sum_i L'_i phi_j(x_i) of every step. W and b are public, so one step's sums are D equations in the batch's
B d_P passive values, and solving them gives A the passive columns (tests/test_fdskl_gradient_attack.py). Here the
coefficients alpha, the gradient sums and the optimiser's state stay in additive shares on Z_2^64 between the
first passive party H (the *holder*) and the dealer D (``vfl fdskl``'s coordinator; no data), and only f on the
batch rows is opened, to A, as the loss needs it.

How it is cheap. A row's features do not change during training; only alpha does. So each row's D features are put
once, at the start, into a form the three roles can multiply by alpha with O(B + D) words per iteration instead of
O(B D) (the paper's protocol sends B D phases per iteration):

    phi_i = Qd_i + M1_i - M2_i          (fixed point, Z_2^64; phi_ij = cos theta_ij x 2^12, theta the phase)

Qd (n x D) is known to H and D and stored there; M1 are masks only A and H can draw, M2 masks only A and D can draw
(``RowMasks``: row i's masks are drawn again at every visit, never stored). So H knows phi + M2 and D knows
phi - M1: uniform to each. A knows M1 and M2 and nothing of Qd.

Setup, once per row (training rows, then the monitor rows; chunks of ``setup_rows``):

1. Phases with dealt masks (``shared.star_local`` and ``star_send``, the star of ``star_phases``, keeper H): A receives S = theta + beta (uniform); H and D
   know beta, so cos theta = cos S cos beta + sin S sin beta.
2. A sends H  U = [cos S, sin S] + [mu, nu]  (2D words per row; mu, nu from A and D's row stream).
   H: V = U . [cos beta, sin beta] = phi + k per feature, where D knows k = [mu, nu] . [cos beta, sin beta].
3. H sends D  V - M1  and D sends H  k - M2  (D words per row each); both form Qd = (V - M1) - (k - M2).

Iteration t (batch I_t of B rows, public seed; alpha = a_H + a_D):

4. f. H sends A  a_H + R_H  and  f_H = Qd a_H - M1 R + z;  D sends A  a_D + R_D  and  f_D = Qd a_D + M2 R - z
   (R_H, R_D, z fresh from H and D's stream, R = R_H + R_D); A adds f_A = (M1 - M2)(alpha + R), the sum of the two
   vectors being alpha + R: f_A + f_H + f_D = phi alpha on I_t, exactly in the ring. M1 R and M2 R do not depend on
   alpha: H and D make them with the batch's rows while they wait, so one product per role waits for alpha (two
   at A and at H before: A's products per iteration fell from 3 to 2, its mat-vec time in a profile of
   credit_default at Q = 2 from 0.44 to 0.27 s).
5. The gradient sums g = phi^T L'. A sends H  L' + P  and  (M1 - M2)^T L' + Z  (P, Z fresh from A and D's
   stream). H: g_H = Qd^T (L' + P) + that; D: g_D = -Qd^T P - Z, with no message: g_H + g_D = g.
6. Momentum SGD on H's and D's shares (linear in the gradient: local, with SecureML's local truncation for the
   fixed-point products by public constants): m <- mu m + g + lambda B alpha, alpha <- alpha - (gamma / B) m,
   mu = 29/32 and gamma = 16 / D by default (a step of fixed size in function space: f moves by gamma D k(x_i, x)
   per unit L'). From
   the middle of training the shares of alpha are summed (the averaged iterate). Adam's per-coefficient division
   is not linear; benchmarks/fdskl_linear_optimizer.py measured momentum SGD within 0.3 point of it
   (docs/design/2026-11-28-fdskl-gradient-leak.md). The weight decay lambda B alpha (lambda B with DECAY_SHIFT
   fractional bits) matters under 5,000 rows, where lambda = D / (30 n) (small_data.py); from there on lambda = 1e-5
   shrinks alpha by gamma lambda = 1e-7 of itself per step (left out until issue 40).

At the end H and D open the averaged alpha to A (prediction then runs ``shared``'s protocol with A's coefficients).
That is D numbers, alpha = sum_i C_i phi(x_i) with weights C_i that A knows, functions of the n d_P passive
values: training refuses to start where n d_P < ``UNKNOWNS_PER_OPENED`` D (``check_sealed``), and says what to
change. The steps x B values of f are what the loss needs (every protocol opens them); A is warned where they
reach n d_P.

What each role receives (``ROLES``, the same table in docs/fdskl.md): A, once per row, the passive parties' masked
phases (S: uniform), per iteration a_H + R_H, a_D + R_D (uniform) and f_H, f_D (uniform apart; their sum with f_A is f
on I_t), at each epoch end with monitor rows the same for f on them (``SealedMonitor``), and once the averaged
alpha; H, once per row, U (uniform: mu, nu) and k - M2 (uniform: M2), per iteration L' + P and (M1 - M2)^T L' + Z
(uniform: P, Z); D, once per row, V - M1 (uniform: M1), and nothing per iteration. The other passive parties send
their masked phases once per row and receive seeds. Any two roles together can remove the masks (as every dealer
design): the dealer must not collude. The width selection (``selection.select_width_sealed``, n >= 5000) runs one
such protocol per candidate on a sample of rows, opening A f of the candidate's averaged model on held-out rows
where a run opens alpha (``train_sealed(held_out=...)``), and tells every rank the chosen index.

Fixed point: the cosines with 6 fractional bits (phi_int = cos theta x 2^12), L' with 8, alpha with 20: f has 32
fractional bits and g 20, both exact in Z_2^64; a truncation in step 6 fails with probability below about 2^-29
per coefficient and step at B = 64 even where every |L'| is 1 (SecureML: about |x| / 2^63 for a value x; a larger
batch raises it in proportion), which A sees as an impossible |f| and stops with an error. The weight decay's
truncation (x = alpha_int (lambda B / sqrt 2) 2^DECAY_SHIFT) stays below that for |alpha| < 1 and lambda B / sqrt 2
below 16 (sonar's 156 rows: 7.4, about 2^-30; lambda's cap of 1 at B = 32 gives 22.6, about 2^-28.5).

Memory: H and D each store Qd, n x D words of 8 bytes (400 MB for a9a's 32,561 rows at D = 1536); ``check_memory``
refuses a run that would not fit.
"""

from __future__ import annotations

import math
import time

import torch

from ..comm import Federation, pairwise_tree
from ..comm.masking import MaskStream, RowMasks, derived_key
from ..comm.sharing import RING, fresh_seed, truncate
from ..data.validation import VFLInputError
from .shared import REAL_PAIRS, cos_sin, narrow_table, star_local, star_send
from .traffic import announce, iteration_bytes, sealed_once_bytes, sealed_setup_bytes
from .trainer import MONITOR_PHASE, TRAIN_PHASE, BatchSampler, TrainingLoop, _stop, log_interval, step_marks

SQRT2 = math.sqrt(2.0)
COS_BITS = 6            # cosines (A's cos S, H's and D's cos beta): each side rounds them once
LPRIME_BITS = 8         # L'
ALPHA_BITS = 20         # alpha's shares
PHI_BITS = 2 * COS_BITS                        # phi = cos S cos beta + sin S sin beta
F_BITS = ALPHA_BITS + PHI_BITS                 # f's fractional bits (|f| < 2^31 fits Z_2^64)
G_BITS = LPRIME_BITS + PHI_BITS                # the gradient sums' (and m's) fractional bits
MU_NUM, MU_SHIFT = 29, 5                      # momentum 29 / 32
LR_SHIFT = 16                                 # (gamma / B) as an integer over 2**16
DECAY_SHIFT = 10                              # lambda B as an integer over 2**10 (the weight decay, step 6)
F_LIMIT = 2.0 ** 9                            # |f| beyond this: a failed truncation (or a diverged step)
LPRIME_LIMIT = 2.0 ** 6
UNKNOWNS_PER_OPENED = 2                       # n d_P >= 2 D before the averaged alpha may be opened
DEFAULT_RATE = 16.0                           # momentum SGD's constant step gamma = DEFAULT_RATE / D (benchmarks/
                                              # fdskl_linear_optimizer.py: alpha ~ sum L' phi moves f by gamma D k)

# Who receives what (docs/fdskl.md, *What each role learns*, is this table): (role, when, what, why it is uniform).
ROLES = (
    ("A", "once per row", "S = theta + beta (the passive parties' masked phases)", "beta: H and D's"),
    ("H", "once per row", "U = [cos S, sin S] + [mu, nu]", "mu, nu: A and D's row stream"),
    ("D", "once per row", "V - M1", "M1: A and H's row stream"),
    ("H", "once per row", "k - M2", "M2: A and D's row stream"),
    ("A", "per iteration", "a_H + R_H, a_D + R_D", "R_H, R_D: H and D's stream"),
    ("A", "per iteration", "f_H, f_D (their sum with A's part: f on the batch)", "z: H and D's stream"),
    ("H", "per iteration", "L' + P, (M1 - M2)^T L' + Z", "P, Z: A and D's stream"),
    ("A", "each epoch end", "the same as per iteration, for f on the monitor rows", "as per iteration"),
    ("A", "once", "the averaged alpha (D numbers)", "opened: counted by check_sealed"),
    ("A, H, D", "per width-selection candidate (n >= 5000)", "the same messages as above for the candidate's run on "
     "the selection rows (D / 2 features), with f of its averaged model on the held-out rows instead of alpha",
     "as above; the f values opened, counted by check_sealed's warning"),
    ("H, other passive parties, D", "once, after the selection", "the index of the chosen width (2 bits)",
     "a function of the labels: sigma_grid=(1.0,) removes it"),
)


def steps_of(n: int, batch: int, epochs: float) -> int:
    """The iterations of a run (``BatchSampler``'s batches of min(batch, n) rows, ``epochs`` passes)."""
    return max(1, math.ceil(epochs * (n / min(batch, n)) - 1e-9))


def check_sealed(n: int, passive_columns: int, D: int, batch: int, epochs: float | None, *,
                 selection_f: int = 0) -> str | None:
    """Refuse a run whose opened model could determine the passive values; return a warning about the f values.

    Beyond what the loss needs, the label holder is opened the trained coefficients once: D numbers
    alpha_j = sum_i C_i phi_j(x_i) with weights C_i it knows, functions of the n d_P passive values (W and b are
    public). The run needs at least ``UNKNOWNS_PER_OPENED`` passive values per coefficient.

    f on the batch rows (steps x B numbers, one per row per epoch) is what the loss needs: every FDSKL protocol
    opens it to the label holder (the paper's too). Where they reach the n d_P passive values (fewer passive
    columns than epochs) the returned text says so; the pooled attack (tests/test_fdskl_gradient_attack.py) is
    what they give on real runs. ``selection_f``: the f values the width selection opens before training
    (``selection.selection_openings``), counted with them."""
    if not passive_columns:
        return None
    unknowns = n * passive_columns
    if unknowns < UNKNOWNS_PER_OPENED * D:
        room = unknowns // UNKNOWNS_PER_OPENED
        raise VFLInputError(
            f"protocol='sealed' opens the label holder the {D} trained coefficients once, functions of the "
            f"{unknowns} passive values ({n} rows x {passive_columns} passive columns); they may be at most "
            f"1/{UNKNOWNS_PER_OPENED} of them: pass n_components <= {room}")
    if epochs is None:                  # (a time budget alone: the steps are not known in advance)
        return None
    f_values = steps_of(n, batch, epochs) * min(batch, n) + int(selection_f)
    if f_values >= unknowns:
        chosen = (f" (the width selection's {int(selection_f)} among them; sigma_grid=(1.0,) skips it)"
                  if selection_f else "")
        return (f"protocol='sealed': the label holder is opened f on its batch rows {f_values} times{chosen} (what "
                f"its loss needs, under every protocol), as many as the {unknowns} passive values ({passive_columns} "
                f"passive columns): fewer epochs open fewer (docs/fdskl.md, *What each role learns*)")
    return None


# A's [cos S, sin S] rounded to COS_BITS, as a table over the 16-bit angle words: the same integers as rounding the
# float cosines (round(cos x 2^6)), from one gather of 1-byte pairs (a 128 KB table that stays in a core's cache).
ACTIVE_PAIRS = torch.round(REAL_PAIRS * 2.0 ** COS_BITS).to(torch.int8).contiguous()


def _fixed(x: torch.Tensor, bits: int) -> torch.Tensor:
    return torch.round(x * 2.0 ** bits).to(torch.int64)


def setup_rows(D: int, max_elements: int) -> int:
    """Rows per setup chunk: A's message U (rows x 2D words) holds a quarter of ``max_elements`` (8 MB at the
    default). Chunks this small stay below glibc's largest mmap threshold (32 MB), so their memory is reused from
    chunk to chunk instead of being mapped afresh: credit_default's setup took 3.6 s with chunks of 32 MB, 3.1 s
    with these (``vfl fdskl --dataset credit_default --parties 2 --epochs 0.01``)."""
    return max(1, int(max_elements) // (8 * D))


def available_memory() -> int | None:
    """Bytes of memory the system can still give (Linux's MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(rows: int, D: int, available: int | None) -> None:
    """Refuse, before the setup, a run whose masked features (Qd, rows x D words of 8 bytes at the holder and the
    dealer) would not fit this machine's available memory: a clear error instead of the operating system killing
    the process halfway through the setup."""
    need = int(rows) * int(D) * 8
    if available is not None and need > 0.8 * available:
        raise VFLInputError(
            f"protocol='sealed' keeps the masked features of every training and monitor row at the holder and the "
            f"dealer: {rows} rows x {D} features x 8 bytes = {need / 1e9:.2f} GB, more than 80% of the "
            f"{available / 1e9:.2f} GB available here: lower n_components, pass fewer rows (or monitor rows), or run "
            f"this role on a machine with more memory")


def _pairs_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per feature, a_2j b_2j + a_2j+1 b_2j+1 of (m x 2D) operands (int64 wraps mod 2^64): m x D. ``a`` (int64)
    is overwritten with the products (the callers' own fresh tensor; no m x 2D temporary)."""
    p = a.mul_(b)
    return p.view(p.shape[0], -1, 2).sum(-1, dtype=torch.int64)


def _rowdot(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x v mod 2^64 (int64 wraps): torch's integer mv, no B x D temporary (25% faster than a product and a sum)."""
    return torch.mv(x, v)


def _coldot(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x^T v mod 2^64."""
    return torch.mv(x.t(), v)


def _pair_stream(seed, label: bytes) -> MaskStream | None:
    """The per-iteration mask stream of a pair that holds ``seed`` (None where this rank does not)."""
    return None if seed is None else MaskStream.from_entropy(int.from_bytes(derived_key(seed, label), "little"))


class Roles:
    """Who is who (A, H, D, the other passive parties) and this rank's secrets: the three pair seeds (A-H drawn by
    A, A-D and H-D drawn by D, each from OS entropy and sent to its other holder only) and what they key."""

    def __init__(self, fed: Federation, dealer: int, D: int):
        passive = [p for p in fed.parties if p != fed.active]
        self.A, self.H, self.D, self.passive = fed.active, passive[0], dealer, passive
        self.rank = fed.rank
        A, H = self.A, self.H
        ah = ad = hd = None
        if self.rank == A:
            ah = fresh_seed()
            fed.send(ah, H)
            ad = fed.recv(dealer, (2,), torch.int64, device="cpu")
        elif self.rank == H:
            ah = fed.recv(A, (2,), torch.int64, device="cpu")
            hd = fed.recv(dealer, (2,), torch.int64, device="cpu")
        elif self.rank == dealer:
            ad, hd = fresh_seed(), fresh_seed()
            fed.send(ad, A)
            fed.send(hd, H)
        # Row streams (the same words at every visit of a row) and per-iteration streams, one label each.
        self.M1 = RowMasks(derived_key(ah, b"sealed/M1"), D) if ah is not None else None
        self.M2 = RowMasks(derived_key(ad, b"sealed/M2"), D) if ad is not None else None
        self.MU = RowMasks(derived_key(ad, b"sealed/mu-nu"), 2 * D) if ad is not None else None
        self.ad, self.hd = _pair_stream(ad, b"sealed/A-D"), _pair_stream(hd, b"sealed/H-D")

    @property
    def holds(self) -> bool:
        """H and D hold the shares of alpha (H's index 0, D's 1 in the truncations)."""
        return self.rank in (self.H, self.D)

    @property
    def index(self) -> int:
        return 0 if self.rank == self.H else 1


class SealedRows:
    """Steps 1-3 for a set of rows (module docstring): afterwards H and D hold Qd for them. ``first``: the rows'
    number in the row streams (training rows 0..n-1, the monitor rows after them)."""

    def __init__(self, fed: Federation, roles: Roles, fmap, X: torch.Tensor, *, first: int, table,
                 max_elements: int):
        self.roles, self.first, self.m = roles, int(first), X.shape[0]
        D = fmap.n_features
        self.Qd = torch.empty(self.m, D, dtype=torch.int64) if roles.holds else None
        narrow = narrow_table(table, COS_BITS) if table is not None else None
        r = roles
        step = setup_rows(D, max_elements)
        chunks = [(at, min(self.m, at + step)) for at in range(0, self.m, step)]
        blocks = range(fmap.n_blocks)

        def local(c):
            # chunk c's star before its phase messages (shared.star_local): the dealer's seeds, each party's phases
            return star_local(fmap, X[chunks[c][0]:chunks[c][1]], blocks, r.D, r.H) if c < len(chunks) else None

        # One chunk ahead, with blocking sends only: A's U of chunk c overlaps H's phases of chunk c + 1, and H's
        # V of chunk c A's phases of chunk c + 1. Every link carries its messages in the order of a chunk at a time
        # but for one swap that every role makes alike: the dealer sends H chunk c + 1's seeds before chunk c's
        # k - M2, and H receives them in that order.
        ahead = local(0)
        for c, (at, end) in enumerate(chunks):
            ids = list(range(self.first + at, self.first + end))
            shape = (end - at, D)
            if r.rank == r.D:
                ph, ahead = ahead, local(c + 1)
            else:
                ph = star_send(ahead)
                if r.rank != r.A:
                    ahead = local(c + 1)
            if r.rank == r.A:
                # U = [cos S, sin S] x 2^6 + [mu, nu], m x 2D
                fed.send(r.MU.rows(ids).add_(cos_sin(ACTIVE_PAIRS, ph.S.cpu())), r.H)
                ahead = local(c + 1)
            elif r.rank == r.H:
                U = fed.recv(r.A, (shape[0], 2 * D), torch.int64, device="cpu")
                q1 = _pairs_dot(U, cos_sin(narrow, ph.groups[0][2].cpu())).sub_(r.M1.rows(ids))     # V - M1
                fed.send(q1, r.D)
                torch.sub(q1, fed.recv(r.D, shape, torch.int64, device="cpu"), out=self.Qd[at:end])
            elif r.rank == r.D:
                q2 = _pairs_dot(r.MU.rows(ids), cos_sin(narrow, ph.beta.cpu())).sub_(r.M2.rows(ids))  # k - M2
                q1 = fed.recv(r.H, shape, torch.int64, device="cpu")
                fed.send(q2, r.H)
                torch.sub(q1, q2, out=self.Qd[at:end])

    def prepare(self, rows: torch.Tensor):
        """What this role can make for ``rows`` (positions in this set) before alpha is known. A: Md = M1 - M2 (its
        row masks). H and D: their gathered rows of Qd, this round's masks of alpha from their stream (R_H, R_D, and
        z for f) and their product with the rows' masks (H: M1 R, D: M2 R, R = R_H + R_D), so that only one product
        waits for alpha. Training makes the next batch's while it waits for a message (off the critical path); H and
        D prepare the same batches in the same order, so they draw the same masks."""
        r = self.roles
        ids = (rows + self.first).tolist()
        if r.rank == r.A:
            return rows, r.M1.rows(ids).sub_(r.M2.rows(ids))
        if r.holds:
            D = self.Qd.shape[1]
            R_H, R_D, z = (RING.random((k,), r.hd, "cpu") for k in (D, D, rows.numel()))
            masks = r.M1.rows(ids) if r.rank == r.H else r.M2.rows(ids)
            return rows, self.Qd.index_select(0, rows), R_H, R_D, _rowdot(masks, R_H + R_D), z
        return rows,

    def f(self, fed: Federation, prep, share: torch.Tensor | None, *, training: bool = False
          ) -> torch.Tensor | None:
        """Step 4: f on ``prep``'s rows of alpha = a_H + a_D (``share``: this holder's), as ring integers with
        F_BITS fractional bits at A (None elsewhere). ``training``: A's L' follows (step 5), and H posts its
        receive at once, so that A's send need not wait for H."""
        r = self.roles
        B = prep[0].numel()
        if r.holds:
            _, Qd, R_H, R_D, mask_product, z = prep
            if r.rank == r.H:       # a_H + R_H and Qd a_H - M1 R + z
                fed.send(torch.cat([share + R_H, _rowdot(Qd, share).sub_(mask_product).add_(z)]), r.A)
                if training:
                    fed.post_recv(r.A, (B + Qd.shape[1],), torch.int64)
            else:                   # a_D + R_D and Qd a_D + M2 R - z
                fed.send(torch.cat([share + R_D, _rowdot(Qd, share).add_(mask_product).sub_(z)]), r.A)
        elif r.rank == r.A:
            _, Md = prep
            D = Md.shape[1]
            from_h = fed.recv(r.H, (D + B,), torch.int64, device="cpu")
            from_d = fed.recv(r.D, (D + B,), torch.int64, device="cpu")
            # Md (alpha + R): with H's and D's parts, phi alpha on the rows, exactly in the ring
            return _rowdot(Md, from_h[:D] + from_d[:D]) + from_h[D:] + from_d[D:]
        return None

    def gradient(self, fed: Federation, prep, lprime: torch.Tensor | None, *, post_next: bool = False
                 ) -> torch.Tensor | None:
        """Step 5: this holder's share of g = phi^T L' on ``prep``'s rows (``lprime``: A's fixed-point L'); None
        at A. ``post_next`` (A): the next messages from H and D are the next iteration's f (no monitor round, no
        stop flag between): their receives are posted now, so that their sends need not wait for A."""
        r = self.roles
        B = prep[0].numel()
        if r.rank == r.A:
            _, Md = prep
            D = Md.shape[1]
            P, Z = RING.random((B,), r.ad, "cpu"), RING.random((D,), r.ad, "cpu")
            fed.send(torch.cat([lprime + P, _coldot(Md, lprime) + Z]), r.H)
            if post_next:
                fed.post_recv(r.H, (D + B,), torch.int64)
                fed.post_recv(r.D, (D + B,), torch.int64)
        elif r.rank == r.H:
            Qd = prep[1]
            msg = fed.recv(r.A, (B + Qd.shape[1],), torch.int64, device="cpu")
            return _coldot(Qd, msg[:B]) + msg[B:]
        elif r.rank == r.D:
            Qd = prep[1]
            P, Z = RING.random((B,), r.ad, "cpu"), RING.random((Qd.shape[1],), r.ad, "cpu")
            return -_coldot(Qd, P) - Z
        return None


class SealedMonitor:
    """Held-out f of the current iterate, opened to the active party at epoch ends (as ``shared`` opens its
    monitor rows): steps 1-3 once for the monitor rows (after the training rows in the row streams), then step 4
    on chunks of them. ``X``: this party's monitor columns (the dealer's: m x 0); ``y`` at the active party."""

    def __init__(self, monitor, max_elements: int):
        self.X = monitor[0]
        self.y = None if monitor[1] is None else monitor[1].to(torch.float64).cpu()
        self.max_elements = max_elements
        self.rows = None

    def prepare(self, fed: Federation, roles: Roles, fmap, *, first: int, table) -> None:
        self.rows = SealedRows(fed, roles, fmap, self.X, first=first, table=table, max_elements=self.max_elements)

    def values(self, fed: Federation, share: torch.Tensor | None, D: int, *, count: int = 1,
               where: str = "on the monitor rows") -> torch.Tensor | None:
        """f on every row of the set, of the alpha whose shares are ``share`` divided by ``count`` (the running
        total of ``count`` iterates: their average's f, exactly, since f is linear in alpha and |f| count stays
        far inside the ring)."""
        m = self.rows.m
        chunk = max(1, self.max_elements // D)
        out = []
        for start in range(0, m, chunk):
            f_int = self.rows.f(fed, self.rows.prepare(torch.arange(start, min(m, start + chunk))), share)
            if f_int is not None:
                out.append(_opened_f(f_int, where, count))
        return torch.cat(out) if out else None


def _opened_f(f_int: torch.Tensor, where: str, count: int = 1) -> torch.Tensor:
    """f from its opened ring value (of ``count`` summed iterates), with the check that a failed truncation or a
    diverged step trips."""
    f = f_int.to(torch.float64) * (SQRT2 / 2.0 ** F_BITS / count)
    peak = float(f.abs().max()) if f.numel() else 0.0
    if not math.isfinite(peak) or peak >= F_LIMIT:
        raise RuntimeError(f"FDSKL sealed protocol: |f| reached {peak:.3g} {where} (a failed share truncation, "
                           f"probability about 2^-29 per coefficient and step, or a diverging step): rerun, or "
                           f"lower gamma")
    return f



def _restore(resume, loop: TrainingLoop, sampler: BatchSampler, arrays: dict) -> int:
    """Put this rank back after a checkpoint's iteration t: its shares (H and D: alpha, m and the running total),
    the curve and clock, the public batches; returns t."""
    from ..checkpoint import CheckpointError

    state, saved = resume
    try:
        t = int(state["t"])
        for k, mine in arrays.items():
            value = torch.from_numpy(saved[k].copy())
            if tuple(value.shape) != tuple(mine.shape) or value.dtype != mine.dtype:
                raise ValueError(f"{k} has {tuple(value.shape)} {value.dtype} values, this run {tuple(mine.shape)}")
            mine.copy_(value)
        loop.restore(state["loop"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the FDSKL checkpoint cannot be resumed ({exc}): delete the --checkpoint folder "
                              f"and start again") from None
    for _ in range(t):
        sampler.next()                       # (the batches of the iterations done: public, drawn and dropped)
    return t


def train_sealed(fed: Federation, fmap, X: torch.Tensor, y: torch.Tensor | None, cfg, *, n_blocks: int,
                 dealer: int, table, monitor=None, log=None, progress: bool = False, checkpoint=None,
                 resume=None, held_out: torch.Tensor | None = None, phase: str = TRAIN_PHASE):
    """Train the D = n_blocks r feature model under the sealed protocol (SPMD: every party and the dealer).
    Returns a ``TrainResult`` whose alpha (float64, the averaged iterate) is at the active party only.
    ``monitor`` ((X, y), this party's columns of the held-out rows; y at the active party): the curve's points
    carry their metrics at epoch ends, of the current iterate (the returned model is the average).
    ``held_out`` (this party's columns of other rows; the width selection's, selection.py): the averaged model is
    not opened; the active party is opened its f on these rows instead (``TrainResult.held_out_f``), and the
    shares are dropped. ``phase``: the meter's name for this run's traffic (its held-out opening: phase/held-out).
    ``checkpoint(t, state, arrays)`` is called at every rank after each epoch end and the last iteration, with
    this rank's shares (H and D: uniform on their own); ``resume`` is such a (state, arrays) to go on from. The
    setup (steps 1-3) runs again at every start, with fresh seeds: the shares of alpha do not depend on it."""
    n = X.shape[0]
    for _ in range(n_blocks - fmap.n_blocks):
        fmap.add_block()
    D = fmap.n_features
    rank = fed.rank
    sampler = BatchSampler(n, cfg.batch_size, cfg.seed)
    B = sampler.batch_size
    # epochs, a time budget (cfg.max_time: the active party's decision, one flag per iteration down the control
    # tree, as budget.py), or both; without an end known in advance the averaging starts after the first epoch
    max_iter = steps_of(n, cfg.batch_size, cfg.epochs) if cfg.epochs is not None else None
    average_from = max_iter // 2 if max_iter is not None else math.ceil(sampler.per_epoch)
    lr_int = int(round(cfg.gamma / B * SQRT2 * 2.0 ** (ALPHA_BITS - G_BITS + LR_SHIFT)))
    # The weight decay lambda alpha of the mean gradient is lambda B alpha in the sums' scale (g / B + lambda alpha);
    # alpha (ALPHA_BITS) and g (G_BITS, SQRT2 apart: phi_int is cos x 2^12 and phi = sqrt(2) cos) differ by that
    # factor: lambda B alpha_int / sqrt(2) on g's scale.
    decay_int = int(round(cfg.lam * B / SQRT2 * 2.0 ** (G_BITS - ALPHA_BITS + DECAY_SHIFT)))
    if lr_int < 1:
        raise VFLInputError(f"protocol='sealed': the step gamma / B = {cfg.gamma / B:.3g} is below the fixed point's "
                            f"resolution; raise gamma or lower batch_size")
    loop = TrainingLoop(fed, max_iter, log=log, progress=progress)
    log_every = log_interval(cfg.log_every, max_iter)
    passive = [p for p in fed.parties if p != fed.active]
    control_tree = pairwise_tree([fed.active] + passive + [dealer])
    mon = SealedMonitor(monitor, cfg.max_elements) if monitor is not None else None
    if loop.bar is not None and max_iter is not None and cfg.max_time is None:
        # A run that will move a lot says so before it starts (issue 38), from the formula the tests check.
        fixed = sealed_setup_bytes(n, fed.num_parties, D, setup_rows(D, cfg.max_elements)) + sealed_once_bytes(D)
        line = announce(iteration_bytes("sealed", fed.num_parties, B, D, D), max_iter, extras=False, fixed=fixed)
        if line is not None:
            loop.bar.write(line, file=getattr(loop.bar, "fp", None))
    zero = torch.zeros(D, dtype=torch.int64)
    alpha, m, total = zero.clone(), zero.clone(), zero.clone()

    scored = SealedMonitor((held_out, None), cfg.max_elements) if held_out is not None else None
    with fed.phase(phase):
        roles = Roles(fed, dealer, D)
    if roles.holds:
        check_memory(n + sum(s.X.shape[0] for s in (mon, scored) if s is not None), D, available_memory())

    def saved():
        """This rank's part of a checkpoint: its shares (H and D), uniform on their own."""
        return {"alpha": alpha, "m": m, "total": total} if roles.holds else {}

    t = 0
    if resume is not None:
        t = _restore(resume, loop, sampler, saved())      # (into these tensors, before the loop rebinds them)
    started = time.perf_counter()
    with fed.phase(phase):
        rows = SealedRows(fed, roles, fmap, X, first=0, table=table, max_elements=cfg.max_elements)
    loop.train_seconds += time.perf_counter() - started      # (the setup is training time: on the clock)
    if mon is not None:
        with fed.phase(MONITOR_PHASE):
            mon.prepare(fed, roles, fmap, first=n, table=table)
    if scored is not None:                      # (after the monitor rows in the row streams)
        with fed.phase(f"{phase}/held-out"):
            scored.prepare(fed, roles, fmap, first=n + (mon.X.shape[0] if mon is not None else 0), table=table)
    if rank == roles.A:
        y = y.to(torch.float64).cpu()
    ahead = None                                # the next batch's prepared rows (made while waiting)
    while max_iter is None or t < max_iter:
        started = time.perf_counter()
        more = max_iter is None or t + 1 < max_iter
        with fed.phase(phase):
            prep = ahead if ahead is not None else rows.prepare(sampler.next().cpu())
            ahead = None
            f_int = rows.f(fed, prep, alpha if roles.holds else None, training=True)
            if rank == roles.H and more:            # (H waits for A's L' next: it prepares meanwhile)
                ahead = rows.prepare(sampler.next().cpu())
            lprime = None
            if rank == roles.A:
                f = _opened_f(f_int, f"at iteration {t}")
                yb = y[prep[0]]
                d = cfg.loss.derivative(f, yb)
                loop.add_loss(float(cfg.loss.value(f, yb).mean()))
                if float(d.abs().max()) >= LPRIME_LIMIT:
                    raise RuntimeError("FDSKL sealed protocol: a loss derivative beyond 2^6; normalise the targets")
                lprime = _fixed(d, LPRIME_BITS)
            # (A posts the next f's receives where nothing else comes first: no time budget, no monitor round)
            post = more and cfg.max_time is None and not (mon is not None and step_marks(t + 1, max_iter,
                                                                                          sampler.per_epoch)[1])
            g = rows.gradient(fed, prep, lprime, post_next=post)
            if rank != roles.H and more:            # (A: while H updates; D: it waits for nobody)
                ahead = rows.prepare(sampler.next().cpu())
            if roles.holds:
                index = roles.index
                m = truncate(m * MU_NUM, index, MU_SHIFT) + g
                if decay_int:
                    m = m + truncate(alpha * decay_int, index, DECAY_SHIFT)
                alpha = alpha - truncate(m * lr_int, index, LR_SHIFT)
                if t >= average_from:
                    total = total + alpha
        loop.tick(started)
        stop = False
        if cfg.max_time is not None:
            with fed.phase(phase):
                stop = _stop(fed, control_tree, loop.train_seconds >= cfg.max_time)
        final, epoch_end = step_marks(t + 1, max_iter, sampler.per_epoch)
        final = final or stop                   # (the time budget's last step: its point carries the monitor)
        if (t + 1) % log_every == 0 or final or epoch_end:
            f_mon = None
            if mon is not None and (final or epoch_end):
                with fed.phase(MONITOR_PHASE):
                    f_mon = mon.values(fed, alpha if roles.holds else None, D)
            loop.log_point(t + 1, D, f_mon, mon if f_mon is not None else None, cfg, log, control_tree)
        if checkpoint is not None and (final or epoch_end):
            checkpoint(t + 1, {"t": t + 1, "loop": loop.state()}, saved())
        t += 1
        if stop:
            break
    # The averaged iterate over the steps from average_from on; a run stopped before them opens the last alpha.
    count = t - average_from
    coef = None
    if scored is not None:
        with fed.phase(f"{phase}/held-out"):
            f_held = scored.values(fed, (total if count > 0 else alpha) if roles.holds else None, D,
                                   count=max(count, 1), where="on the held-out rows")
        result = loop.result(None, t)
        result.held_out_f = f_held
        return result
    with fed.phase(phase):
        if roles.holds:
            fed.send(total if count > 0 else alpha, roles.A)
        elif rank == roles.A:
            opened = fed.recv(roles.H, (D,), torch.int64, device="cpu") + fed.recv(dealer, (D,), torch.int64,
                                                                                   device="cpu")
            coef = opened.to(torch.float64) / (max(count, 1) * 2.0 ** ALPHA_BITS)
    return loop.result(coef, t)
