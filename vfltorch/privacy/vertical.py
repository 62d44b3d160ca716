"""The two messages of vertical DP-SCD: partial sums up to the active party, its answer back down.

Parties hold column blocks X_l of the same rows. Anything linear in the
columns, such as x_j^T v = sum_l x_{j,l}^T v_l or ||x_j||^2, is a sum of
per-party parts. ``sum_at_active`` adds the parts up the FDSKL pairwise tree
rooted at the active party (``vfltorch.comm.reduce``), or, with
``secure=True``, through ring-masked secure aggregation
(``vfltorch.comm.secure_sum``), so that only the active party learns the
total and no party sees another's part. ``from_active`` sends the active
party's answer (the clipped coordinate steps zeta of a batch) back down the
same tree (``vfltorch.comm.broadcast``).

With one party both are the identity: the centralised algorithm is the same
code with no messages.
"""

from __future__ import annotations

import secrets

import torch

from ..comm import Federation, MaskStream, broadcast, pairwise_tree, reduce, secure_sum
from ..devices import to_host


class ActiveLink:
    def __init__(self, fed: Federation, *, secure: bool = False):
        self.fed = fed
        self.secure = secure
        order = [fed.active] + [p for p in fed.parties if p != fed.active]
        self.tree = pairwise_tree(order)
        # Masks only hide parts in transit; the sums are exact whatever the masks, so fresh entropy is right.
        self.stream = MaskStream(secrets.randbits(62), fed.rank) if secure else None

    @property
    def single(self) -> bool:
        return self.fed.num_parties == 1

    def sum_at_active(self, part: torch.Tensor) -> torch.Tensor | None:
        """The sum of every party's ``part`` at the active party; ``None`` elsewhere."""
        if self.single:
            return part
        if self.secure:
            return secure_sum(self.fed, part, out=self.fed.active, stream=self.stream)
        total = reduce(self.fed, part, self.tree)
        return total if self.fed.is_active else None

    def from_active(self, value: torch.Tensor | None, shape, dtype) -> torch.Tensor:
        """The active party's ``value`` at every party (others pass ``None`` and the expected shape and dtype)."""
        if self.single:
            return value
        return broadcast(self.fed, value if self.fed.is_active else None, self.tree, shape=tuple(shape),
                         dtype=dtype)


# ----------------------------------------------------------------------------------------------------------------
# The label-safe update of v_l (the default vertical protocol, "encrypted").
from .config import PROTOCOLS  # noqa: E402,F401  (the library's)
PAPER_LEAK = ("vertical protocol 'paper' (the paper's own): the active party sends the noise-free clipped steps "
              "zeta_B to every passive party; on a row's first visit alpha_j = 0, so sign(zeta_j) = y_j and the "
              "passive parties learn the labels (measured: 100% of phishing labels, logistic). The DP guarantee "
              "does not cover these messages. Use the default protocol 'encrypted'.")


def _signed64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


class EncryptedUpdates:
    """v_l += X_{l,B}^T zeta_B + noise, without any passive party seeing zeta_B.

    Per step (the active party A holds a Paillier key pair made for this run):

    1. A encrypts the clipped steps, [[zeta_B]], and sends them to every passive party l;
    2. l computes [[X_{l,B}^T zeta_B + m_l]] homomorphically, with a fresh private mask m_l
       (uniform integers 40 bits wider than the fixed-point bound of the product, so that
       A's view is within statistical distance 2^-40 of uniform), re-randomised, and sends it to A;
    3. A decrypts, adds the calibrated noise N(0, sigma^2 S^2 I_{d_l}) in fixed point, and
       returns the sum modulo 2^128 (|update + noise| < 2^39 in real units fits);
    4. l subtracts m_l: it holds X_{l,B}^T zeta_B + noise, and nothing less noisy, ever.

    What each party learns: a passive party, ciphertexts (semantically secure) and noisy updates
    of its own block, i.e. a Gaussian mechanism on the labels - but it knows the batch schedule,
    so it gets no amplification by subsampling (``solver.observer_epsilons``). The active party,
    masked values only; it knows the noise it drew, so the DP guarantee is not towards it (it
    holds the labels; the features of the passive parties were never covered by DP in the paper
    either). Fixed point: zeta with 48 fractional bits, X with 40; the update is exact up to that
    rounding (~1e-12), so a federated run still equals the centralised one.
    """

    ZETA_FRAC_BITS = 48
    X_FRAC_BITS = 40
    MASK_SLACK_BITS = 40
    WIRE_BITS = 128

    def __init__(self, fed: Federation, *, key_bits: int, insecure_key: bool, noise_streams=None):
        from ..crypto import generate_keypair, recv_public_key, send_public_key

        self.fed = fed
        self.passive = [p for p in fed.parties if p != fed.active]
        self.noise_streams = noise_streams or {}        # active party: passive rank -> NoiseStream
        self.private_key = None
        with fed.phase("dpscd/key"):
            if fed.is_active:
                self.public_key, self.private_key = generate_keypair(int(key_bits), insecure=bool(insecure_key))
                for p in self.passive:
                    send_public_key(fed, self.public_key, p)
            else:
                self.public_key = recv_public_key(fed, fed.active, insecure=bool(insecure_key))

    @property
    def frac_bits(self) -> int:
        return self.ZETA_FRAC_BITS + self.X_FRAC_BITS

    def update(self, XB: torch.Tensor, zeta: torch.Tensor | None, C: float, noise_std: float,
               rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """At a passive party: its noisy block update. At the active party: runs steps 1 and 3, returns None."""
        if self.fed.is_active:
            self._serve(zeta, C, noise_std)
            return None
        return self._ask(XB)

    # ------------------------------------------------------------------ active party
    def _serve(self, zeta: torch.Tensor, C: float, noise_std: float) -> None:
        from ..crypto import EncryptedTensor, recv_encrypted, send_encrypted

        fed, b = self.fed, int(zeta.numel())
        if b:
            with fed.phase("dpscd/enc-steps"):
                enc = EncryptedTensor.encrypt(self.public_key, to_host(zeta, torch.float64),
                                              frac_bits=self.ZETA_FRAC_BITS, max_abs=float(C))
                for p in self.passive:
                    send_encrypted(fed, enc, p)
        for p in self.passive:
            stream = self.noise_streams.get(p)
            if not b:
                # An empty batch carries no data: the update is the noise alone.
                with fed.phase("dpscd/noisy-updates"):
                    d = int(fed.recv_tensor(p, device="cpu")[0])
                    noise = stream.normal(d, noise_std) if (stream is not None and noise_std > 0) else \
                        torch.zeros(d, dtype=torch.float64)
                    fed.send_tensor(noise, p)
                continue
            with fed.phase("dpscd/masked-updates"):
                masked = recv_encrypted(fed, p, self.public_key)
            values = masked.decrypt_fixed(self.private_key)
            if stream is not None and noise_std > 0:
                scale = float(1 << self.frac_bits)
                noise = stream.normal(len(values), noise_std).tolist()
                values = [v + int(round(z * scale)) for v, z in zip(values, noise)]
            modulus = 1 << self.WIRE_BITS
            low, high = [], []
            for v in values:
                r = v % modulus
                low.append(_signed64(r & ((1 << 64) - 1)))
                high.append(_signed64(r >> 64))
            with fed.phase("dpscd/noisy-updates"):
                fed.send_tensor(torch.tensor([low, high], dtype=torch.int64), p)

    # ----------------------------------------------------------------- passive party
    def _ask(self, XB: torch.Tensor) -> torch.Tensor:
        from ..crypto import recv_encrypted, send_encrypted

        fed = self.fed
        b, d = XB.shape
        if not b:
            with fed.phase("dpscd/noisy-updates"):
                fed.send_tensor(torch.tensor([d], dtype=torch.int64), fed.active)
                return fed.recv_tensor(fed.active, device="cpu").to(device=XB.device, dtype=XB.dtype)
        with fed.phase("dpscd/enc-steps"):
            enc = recv_encrypted(fed, fed.active, self.public_key)
        product = enc.rmatmul(to_host(XB, torch.float64).T, frac_bits=self.X_FRAC_BITS)
        if product.frac_bits != self.frac_bits:
            product = product.lift(self.frac_bits)
        if int(product.bound).bit_length() > self.WIRE_BITS - 8:
            raise ValueError("the update X_B^T zeta_B is too large for the 128-bit fixed-point wire format")
        # The masks may be wider than the wire: only (value + mask) mod 2^128 travels back.
        width = int(product.bound).bit_length() + self.MASK_SLACK_BITS
        masks = [secrets.randbits(width) for _ in range(d)]
        with fed.phase("dpscd/masked-updates"):
            send_encrypted(fed, product.add_fixed(masks), fed.active)
        with fed.phase("dpscd/noisy-updates"):
            wire = fed.recv_tensor(fed.active, device="cpu").tolist()
        modulus, half, scale = 1 << self.WIRE_BITS, 1 << (self.WIRE_BITS - 1), 1 << self.frac_bits
        out = []
        for lo, hi, m in zip(wire[0], wire[1], masks):
            r = ((hi % (1 << 64)) << 64) | (lo % (1 << 64))
            v = (r - m) % modulus
            out.append((v - modulus if v >= half else v) / scale)
        return torch.tensor(out, dtype=torch.float64).to(device=XB.device, dtype=XB.dtype)
