"""Vertical DP-SCD's update of a passive party's block with a dealer instead of Paillier (protocol ``shared``).

The goal is the encrypted protocol's (``vertical.EncryptedUpdates``): passive party l ends every step holding
v_l += X_{l,B}^T zeta_B + noise, and nothing less noisy; the active party A holds zeta_B and learns nothing about
X_l. A third process, the dealer D (the run's coordinator: it holds no data), hands out correlated randomness,
as in FDSKL's and hetero-LR's default protocols. Everything lives on Z_2^64 in fixed point: x with ``FRAC_X``
and zeta with ``FRAC_Z`` fractional bits, their products and the noise with FRAC_X + FRAC_Z.

The ring. Every word that travels is taken mod 2^32 (the arithmetic is int64, i.e. mod 2^64, and so also mod
2^32): half the bytes of 64-bit words. zeta enters as zeta / C (public C: |zeta / C| <= 1), x as itself (a
unit-norm row: |x| <= 1), each with 10 fractional bits; a coordinate of X_B^T zeta / C is then at most |B| and
the noise / C is N(0, 2 sigma^2): ``check_range`` (once, and for every batch) keeps |B| + 12 noise standard
deviations below 2^11, the signed range left above the 20 fractional bits, so the sum never wraps. Rounding
x and zeta / C to 2^-11 moves a coordinate of the update by about sqrt(|B|) 2^-11 C, a few thousandths of the
noise's standard deviation sqrt(2) sigma C.

Once, at the start: D sends l a 128-bit seed s_l and A a seed r_l (OS entropy). From s_l, l and D expand a
uniform n x d_l matrix U_l; l sends A the opened M_l = X_l - U_l (uniform to A: it never learns s_l). A run
resumed from a checkpoint (``--checkpoint``) starts here again with fresh seeds: A is opened a second
M'_l = X_l - U'_l, and M_l - M'_l = U'_l - U_l is uniform, so the two together say nothing about X_l either; the
dealer keeps nothing between starts and deals from the resumed step on (the active party tells it the step).

Step t, batch B (public to the parties and to D):

1. A and D draw b from r_l (|B| uniform words); A sends l  e = zeta_B - b  (uniform to l: it never learns r_l),
   in one message with h of step 3 (h needs nothing from l);
2. D draws c_l from s_l and sends A  c = U_{l,B}^T b - c_l  (d_l words; uniform to A, which never learns s_l).
   D needs nothing from anyone to compute c (the schedule, U_l and b are its own), so it sends them ahead, for
   ``WINDOW`` steps in one message: A never waits for the dealer within a window;
3. A sends l  h = M_{l,B}^T b + c + noise_l  (its noise for block l, drawn as under the encrypted protocol);
4. l draws c_l from s_l and adds:  X_{l,B}^T e + c_l + h = X_{l,B}^T zeta_B + noise_l  (mod 2^64: exact).

What each role receives. l: e (a one-time pad on zeta_B) and h; given e, h is X_{l,B}^T zeta_B + noise_l minus
a value l computes itself, so l's view is a function of (e, X_{l,B}^T zeta_B + noise_l) with e independent of
zeta: the noisy update and nothing else, as under Paillier. A: M_l (one-time padded by U_l) and every c (padded by
c_l): nothing about X_l. D: seeds it drew, the batch schedule and the sizes; no value of any party. Semi-honest,
no collusion of D with a party (the same trust as the other methods' dealers).

Cost per step and passive party: |B| + 2 d_l words of 4 bytes, against the paper protocol's |B| floats of
zeta_B (8 bytes each), and n d_l words once; no Paillier operation at all.
"""

from __future__ import annotations

import numpy as np
import torch

from ..comm import Federation
from ..comm.masking import FixedPoint, RingGroup
from ..comm.sharing import _stream_from, fresh_seed, from_ring, recv_words, send_words
from ..data.validation import VFLInputError

BITS = 32                   # the ring of every word that travels (module docstring)
FRAC_X = 10
FRAC_Z = 10
RING = RingGroup()
FX, FZ, FXZ = FixedPoint(FRAC_X), FixedPoint(FRAC_Z), FixedPoint(FRAC_X + FRAC_Z)
RANGE = 2.0 ** (BITS - 1 - FRAC_X - FRAC_Z)
PHASE = "dpscd/shared-updates"
WINDOW = 64                 # steps of the dealer's c per message (step 2)


def check_range(rows: float, C: float, noise_std: float) -> None:
    """|X_B^T zeta / C| <= |B| plus 12 noise standard deviations must stay in the ring (module docstring)."""
    bound = float(rows) + 12.0 * float(noise_std) / float(C)
    if not bound < RANGE:
        raise VFLInputError(f"--vertical-protocol shared keeps the updates (in units of C) below {RANGE:g}; a batch "
                            f"of {rows:.0f} rows with noise std {noise_std / C:.3g} C may reach {bound:.4g}: lower "
                            f"--L or raise --epsilon, or use --vertical-protocol encrypted")


def _dot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A^T v for int64 words: exact mod 2^64, hence mod 2^32 (a B x d_l matrix by a vector: no BLAS needed)."""
    return v @ A


def _recv(fed, src, shape) -> torch.Tensor:
    return recv_words(fed, src, shape, BITS).to(torch.int64)


class SharedUpdates:
    """Steps 1-4 of the module docstring at the active party and the passive parties (the dealer: ``deal``)."""

    def __init__(self, fed: Federation, X: torch.Tensor, *, sampler_facts: dict, noise_streams=None):
        if fed.coordinator is None:
            raise VFLInputError("vertical protocol 'shared' (the default) needs a dealer: start the federation with "
                                "a coordinator (vfltorch.comm.launch(..., coordinator=True); `vfl dpscd` does this "
                                "on one machine; across organisations list a dealer in the federation file), or "
                                "pass protocol='encrypted' / --vertical-protocol encrypted (Paillier, no dealer)")
        self.fed = fed
        self.dealer = fed.coordinator
        self.passive = [p for p in fed.parties if p != fed.active]
        self.noise_streams = noise_streams or {}
        self.window = {}
        with fed.phase(PHASE):
            if fed.is_active:
                self.steps = int(sampler_facts["steps"])
                # the step about to be served; a run resumed from a checkpoint starts after its steps (``start``)
                self.start = self.t = int(sampler_facts.get("start", 0))
                # The dealer follows the public schedule: the rows, the batch size, the schedule's seed.
                fed.send_json(sampler_facts, self.dealer)
                self.pads = {p: _stream_from(fed.recv_tensor(self.dealer, device="cpu")) for p in self.passive}
                self.opened = {}
                for p in self.passive:
                    d = int(fed.recv_json(p))
                    self.opened[p] = _recv(fed, p, (X.shape[0], d))
            else:
                fed.send_json(int(X.shape[1]), self.dealer)
                fed.send_json(int(X.shape[1]), fed.active)
                self.stream = _stream_from(fed.recv_tensor(self.dealer, device="cpu"))
                U = RING.random((X.shape[0], X.shape[1]), self.stream, "cpu")
                self.Xq = FX.encode(X.detach().to("cpu", torch.float64))
                send_words(fed, self.Xq - U, fed.active, BITS)

    def update(self, XB: torch.Tensor, zeta: torch.Tensor | None, C: float, noise_std: float,
               rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """At a passive party: its noisy block update. At the active party: steps 1 and 3; returns None."""
        if self.fed.is_active:
            self._serve(zeta, C, noise_std, rows)
            return None
        return self._receive(XB, rows, C)

    def _serve(self, zeta: torch.Tensor, C: float, noise_std: float, rows: torch.Tensor) -> None:
        fed, b = self.fed, int(zeta.numel())
        check_range(b, C, noise_std)            # (every party would compute garbage past the ring's range)
        zq = FZ.encode(zeta.detach().to("cpu", torch.float64) / C)
        idx = rows.to("cpu")
        with fed.phase(PHASE):
            if (self.t - self.start) % WINDOW == 0:
                k = min(WINDOW, self.steps - self.t)
                self.window = {p: _recv(fed, self.dealer, (k, self.opened[p].shape[1])) for p in self.passive}
            for p in self.passive:
                # e and h in one message (h needs nothing from l): steps 1 and 3 of the module docstring.
                M = self.opened[p]
                d = M.shape[1]
                pad = RING.random((b,), self.pads[p], "cpu")
                h = self.window[p][(self.t - self.start) % WINDOW] + (_dot(M[idx], pad) if b else 0)
                stream = self.noise_streams.get(p)
                if stream is not None and noise_std > 0:
                    h = h + FXZ.encode(stream.normal(d, noise_std) / C)
                send_words(fed, torch.cat([zq - pad, h]), p, BITS)
        self.t += 1

    def _receive(self, XB: torch.Tensor, rows: torch.Tensor, C: float) -> torch.Tensor:
        fed = self.fed
        b, d = int(rows.numel()), self.Xq.shape[1]
        with fed.phase(PHASE):
            got = _recv(fed, fed.active, (b + d,))
        e, h = got[:b], got[b:]
        mine = RING.random((d,), self.stream, "cpu") + h
        if b:
            mine = mine + _dot(self.Xq[rows.to("cpu")], e)
        return (FXZ.decode(from_ring(mine, BITS)) * C).to(device=XB.device, dtype=XB.dtype)


def deal(fed: Federation) -> int:
    """The dealer's side of a run: seeds, then each step's c for every passive party. Returns the steps dealt."""
    from .randomness import numpy_from_seed128
    from .sampling import BatchSampler

    passive = [p for p in fed.parties if p != fed.active]
    with fed.phase(PHASE):
        facts = fed.recv_json(fed.active)
        widths = {p: int(fed.recv_json(p)) for p in passive}
        n = int(facts["n"])
        pads, own = {}, {}
        for p in passive:
            seed = fresh_seed()
            fed.send_tensor(seed, fed.active)
            pads[p] = _stream_from(seed)
        masks = {}
        for p in passive:
            seed = fresh_seed()
            fed.send_tensor(seed, p)
            own[p] = _stream_from(seed)
            masks[p] = RING.random((n, widths[p]), own[p], "cpu")
    seed = int(facts["seed"], 16)
    start = int(facts.get("start", 0))
    sampler = BatchSampler(n, int(facts["L"]), float(facts["epochs"]), kind=str(facts["kind"]),
                           rng=numpy_from_seed128(seed))
    if start:
        # A run resumed after ``start`` steps (``fit_glm``'s checkpoints): the dealer keeps nothing between starts
        # (its seeds above are fresh, and so are the passive parties' masks U_l); the active party sends the
        # schedule's generator state of its checkpoint (the seed of this start is a new one), and the dealer deals
        # from the next step on.
        try:
            sampler.resume(start, facts["schedule"], np.zeros(n, dtype=np.int64))
        except (KeyError, TypeError, ValueError) as exc:
            raise VFLInputError(f"the active party's resumed schedule cannot be followed ({exc})") from None
    steps, window = 0, {p: [] for p in passive}
    for batch in sampler:
        idx = batch.to("cpu")
        b = int(idx.numel())
        for p in passive:
            pad = RING.random((b,), pads[p], "cpu")
            c_l = RING.random((widths[p],), own[p], "cpu")
            c = _dot(masks[p][idx], pad) if b else torch.zeros(widths[p], dtype=torch.int64)
            window[p].append(c - c_l)
        steps += 1
        if steps % WINDOW == 0 or start + steps == sampler.steps:
            with fed.phase(PHASE):
                for p in passive:
                    send_words(fed, torch.stack(window[p]), fed.active, BITS)
                    window[p] = []
    return steps


__all__ = ["FRAC_X", "FRAC_Z", "SharedUpdates", "check_range", "deal"]
