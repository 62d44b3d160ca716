"""The paper protocol (SGD and SQN) under Paillier with the columns encrypted once, packed (``packed_features=True``).

Why. In Hardy's round every mini-batch costs 2 |S| fresh Paillier encryptions:
the host encrypts its margins [[u_A]], the guest re-randomises [[d]] for the
host. Each needs an obfuscator (an n-th residue: 128 multiplications mod n^2
with DJN), and on top come d_B + d_A bucket products [[d]]^T X with 16-bit
exponents. That is the whole cost of an encrypted epoch, and it recurs every
epoch although the columns X never change.

What changes. The gradient block of party l is linear in the residual,
G_l = X_l^T d = X_l^T (u_A / 4) + X_l^T v with v = u_B / 4 - y / 2 (the guest's
part) and u_A / 4 (the host's part). Each party encrypts its own rows ONCE,
before training, several features per plaintext (BatchCrypt-style slots of B
bits, ``PackedColumns``), and sends them to the other data party:

    [[P_i]] = [[ sum_j x_ij 2^(j B) ]]       (one ciphertext per row and chunk of s columns)

Per mini-batch the *other* party, which holds the per-row multipliers in the
clear, forms one linear combination with short exponents:

    guest:  [[X_A^T v]]       = prod_{i in S} [[P^A_i]]^(v_i)           (v_i at F_V = 24 fractional bits)
    host:   [[X_B^T u_A / 4]] = prod_{i in S} [[P^B_i]]^(u_A,i / 4)

(one bucket product per chunk, i.e. per s columns, instead of one per column),
re-randomises it and sends it to the owner of the columns. The owner adds
its own part (X_l^T times its multiplier, + |S| lambda w_l) as a plaintext,
plus a public offset that makes every slot non-negative and a uniform mask
per slot, and sends it to the coordinator, which decrypts, reads the slots
and returns them; the owner removes mask and offset: G_l, exactly as in the
per-row protocol. Per batch: a handful of ciphertexts and obfuscators instead
of 2 |S|, and one bucket product per s columns.

The batch loss 8 sum_i l_i = sum_i u_A,i^2 + 8 u_A^T v + (guest terms) needs
the cross term u_A^T v = w_A^T (X_A^T v). In SGD steps the host knows X_A^T v
once it has unmasked G_A (it learns G_A in Hardy's protocol anyway); in SQN
steps it does not (it receives its block of the direction), so the
coordinator, which decrypts G_A to apply H_t, sends G_A back encrypted under
its own key and the host weighs it by w_A homomorphically (``F_W`` bits). The
host encrypts its part H (one ciphertext) for the guest, which adds its
terms and sends the sum to the coordinator, as in the per-row protocol.

SQN: the blocks of quasi-Newton steps go to the coordinator unmasked (it
applies H_t to g, as in the paper), and the curvature rounds use the same
exchange with the per-row multipliers z_l / 4 = X_l s_l / 4 (v_t to the
coordinator, as in the paper).

What each role learns: exactly what it learns in the per-row protocol
(``guest.py``, ``host.py``, ``coordinator.py``): the host its gradient
blocks, the guest its gradient blocks and the epoch losses, the coordinator
masked blocks and the batch losses. The guest now *holds* every training row
of the host encrypted under the coordinator's key (and the host the guest's):
semantically secure as long as the coordinator colludes with neither (the
assumption the per-row protocol already makes: there the coordinator could
decrypt [[u_A]] of every batch). Every ciphertext that leaves a party is a
fresh encryption or re-randomised with the sender's own obfuscators.

Precision: X enters at F_X fractional bits (as in the per-row protocol, now
encrypted, so its precision costs nothing online); the per-row multipliers
at F_V = 24 bits (the exponent, so the speed knob): |error| <= 2^-25 max|x|
per gradient entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import gmpy2
import torch

from ..crypto import arith
from ..crypto.encoding import from_fixed
from ..crypto.keys import private_math, public_math
from ..crypto.obfuscators import default_pool
from ..crypto.tensor import EncryptedTensor
from ..crypto.transport import _from_bytes, _to_bytes
from .bounds import COEF_MAX, FEATURE_MAX, MARGIN_MAX, fixed, received
from .coordinator import Coordinator
from .guest import Guest
from .host import Host
from .masks import unmask
from .packed_check import check_packed  # noqa: F401  (re-exported)
from .session import PHASE_CURVATURE, PHASE_GRADIENT, PHASE_LOSS
from .taylor import LOG2

F_V = 24          # fractional bits of the per-row multipliers (the exponents of the linear combinations)
F_W = 40          # fractional bits of w_A weighing the coordinator's [[G_A]] in SQN steps (11 exponents a step)
PHASE_COLUMNS = "hetero-lr/columns"   # the one-off exchange of encrypted columns (not in the per-epoch bytes)


@dataclass(frozen=True)
class PackedColumns:
    """s slots of B bits per plaintext, ceil(columns / s) plaintexts per row; slot j of a plaintext holds
    a signed fixed-point integer (value * 2^F) in bits [jB, (j+1)B)."""

    columns: int
    slot_bits: int
    slots: int

    @classmethod
    def plan(cls, key_bits: int, columns: int, slot_bits: int) -> "PackedColumns":
        slots = (key_bits - 2) // slot_bits
        if slots < 1:
            raise ValueError(f"a {key_bits}-bit key cannot hold one {slot_bits}-bit slot: use a larger key")
        return cls(columns, slot_bits, min(slots, columns))

    @property
    def chunks(self) -> int:
        return -(-self.columns // self.slots)

    def chunk_columns(self, c: int) -> range:
        return range(c * self.slots, min((c + 1) * self.slots, self.columns))

    def pack(self, values, c: int) -> int:
        """sum_j values[j] 2^(jB) over chunk c's columns (signed integers in, a signed integer out)."""
        out, B = 0, self.slot_bits
        for k, j in enumerate(self.chunk_columns(c)):
            out += int(values[j]) << (k * B)
        return out

    def unpack(self, plaintext: int, c: int) -> list[int]:
        mask = (1 << self.slot_bits) - 1
        return [(int(plaintext) >> (k * self.slot_bits)) & mask for k in range(len(self.chunk_columns(c)))]


def slot_value_bound(batch: int, l2: float, feature_frac_bits: int) -> int:
    """Public bound of |X_l^T (u_A/4 + v) + |S| lambda w_l| at F_V + F_X bits (from the public caps only)."""
    multiplier = fixed(0.25 * MARGIN_MAX + 0.5, F_V)
    cross = batch * fixed(FEATURE_MAX, feature_frac_bits) * multiplier
    return 2 * cross + fixed(batch * l2 * COEF_MAX, F_V + feature_frac_bits)


def slot_bits(batch: int, l2: float, feature_frac_bits: int, mask_bits: int) -> tuple[int, int]:
    """(B, mask range bits): value + offset in [0, 2 base], plus a mask sigma bits wider, below 2^B."""
    base_bits = slot_value_bound(batch, l2, feature_frac_bits).bit_length()
    mask_range = base_bits + 1 + mask_bits
    return mask_range + 2, mask_range


def _ints(t: torch.Tensor, frac_bits: int) -> list[int]:
    return [int(v) for v in torch.round(t.to(torch.float64).cpu() * 2.0 ** frac_bits).tolist()]


def layout_batch(bounds) -> int:
    """The most rows a packed block sums over: a mini-batch or a Hessian sample."""
    return max(bounds.batch, bounds.hessian_batch)


class _PackedParty:
    """What the packed guest and host share: their encrypted rows, the peer's, the blocks for the coordinator."""

    def _packed_setup(self) -> None:
        s, pm = self.s, public_math(self.s.scheme.public_key)
        rows = layout_batch(s.bounds)
        B, self._mask_range = slot_bits(rows, s.l2, s.feature_frac_bits, s.bounds.mask_bits)
        self._layout = PackedColumns.plan(pm.bits, self.X.shape[1], B)
        self._base = slot_value_bound(rows, s.l2, s.feature_frac_bits)
        self._pm = pm

    def exchange_columns(self) -> None:
        """Encrypt this party's rows once (packed) for the other data party; receive the other's."""
        s, pm, lay = self.s, self._pm, self._layout
        peer = s.hosts[0] if self.fed.is_active else s.guest
        n = self.X.shape[0]
        Xi = torch.round(self.X_cpu * 2.0 ** s.feature_frac_bits).to(torch.int64).tolist()
        with self.fed.phase(PHASE_COLUMNS):
            s.clock.add("offline", s.scheme.prepare(n * lay.chunks))
            with s.clock("columns"):
                rows = [lay.pack(row, c) for c in range(lay.chunks) for row in Xi]     # chunk-major
                cs = arith.encrypt_raw(rows, s.scheme.pool.take(len(rows)), pm.n, pm.nsquare)
                info = {"rows": n, "chunks": lay.chunks, "key": pm.fingerprint}
            mine_first = self.fed.is_active
            with s.clock("send"):
                if mine_first:
                    self.fed.send_json(info, peer)
                    self.fed.send_tensor(_to_bytes(cs, pm.width), peer)
            with s.clock("recv"):
                theirs = self.fed.recv_json(peer)
                if theirs.get("rows") != n or theirs.get("key") != pm.fingerprint:
                    raise ValueError(f"{self.fed.name()}: the peer's encrypted columns do not match ({theirs})")
                chunks = int(theirs["chunks"])
                payload = self.fed.recv_tensor(peer, device="cpu")
                flat = _from_bytes(payload, pm.width, n * chunks, pm.nsquare)
            with s.clock("send"):
                if not mine_first:
                    self.fed.send_json(info, peer)
                    self.fed.send_tensor(_to_bytes(cs, pm.width), peer)
        self._peer_rows = [flat[c * n:(c + 1) * n] for c in range(chunks)]
        self._peer_chunks = chunks

    # ------------------------------------------------------------ per batch
    def _combine_for_peer(self, rows, multiplier: torch.Tensor) -> list:
        """[[X_peer[S]^T multiplier]] per chunk, re-randomised: prod_i [[P_i]]^(round(m_i 2^F_V))."""
        s, pm = self.s, self._pm
        exps = _ints(multiplier, F_V)
        with s.clock("he"):
            out = [arith.multiexp_columns([chunk[i] for i in rows], [exps], pm.nsquare)[0]
                   for chunk in self._peer_rows]
        with s.clock("send"):
            return arith.add_raw(out, s.scheme.pool.take(len(out)), pm.nsquare)

    def _exchange(self, rows, multiplier: torch.Tensor) -> list:
        """Both data parties form their peer's cross block; the guest receives first (no send-send deadlock)."""
        peer = self.s.hosts[0] if self.fed.is_active else self.s.guest
        mine = self._combine_for_peer(rows, multiplier)
        if self.fed.is_active:
            theirs = self._recv_cs(peer, self._layout.chunks)
            self._send_cs(mine, peer)
        else:
            self._send_cs(mine, peer)
            theirs = self._recv_cs(peer, self._layout.chunks)
        return theirs

    def _send_cs(self, cs, dst: int) -> None:
        with self.s.clock("send"):
            self.fed.send_tensor(_to_bytes(cs, self._pm.width), dst)

    def _recv_cs(self, src: int, count: int) -> list:
        with self.s.clock("recv"):
            return _from_bytes(self.fed.recv_tensor(src, device="cpu"), self._pm.width, count, self._pm.nsquare)

    def _block(self, cross, rows, multiplier: torch.Tensor, vector: torch.Tensor, masked: bool):
        """[[X_l^T (multiplier_peer + multiplier) + |rows| lambda vector + offset (+ mask)]] to the coordinator.

        Returns this party's own part (integers at F_V + F_X bits) and the masks (None when unmasked)."""
        s, pm, lay = self.s, self._pm, self._layout
        F = F_V + s.feature_frac_bits
        with s.clock("plain"):
            X_rows = self.X_cpu[torch.as_tensor(rows)]
            local = X_rows.T @ multiplier.to(torch.float64).cpu()
            if s.l2:
                local = local + (len(rows) * s.l2) * (self.penalized.cpu() * vector.to("cpu", torch.float64))
            local_ints = _ints(local, F)
            masks = s.masks.draw(lay.columns, self._mask_range) if masked else None
            extra = masks if masked else [0] * lay.columns
            plain = [lay.pack([a + self._base + r for a, r in zip(local_ints, extra)], c) for c in range(lay.chunks)]
        with s.clock("he"):
            block = arith.add_plain_raw(cross, plain, pm.n, pm.nsquare)
        with s.clock("send"):
            block = arith.add_raw(block, s.scheme.pool.take(len(block)), pm.nsquare)
        self._send_cs(block, s.coordinator)
        return local_ints, masks

    def _masked_block(self, cross, rows, multiplier: torch.Tensor):
        """SGD step: the masked block to the coordinator and back; returns g_l and the cross part (integers)."""
        s = self.s
        F = F_V + s.feature_frac_bits
        local_ints, masks = self._block(cross, rows, multiplier, self.w, masked=True)
        with s.clock("recv"):
            reply = self.fed.recv_json(s.coordinator)
        with s.clock("plain"):
            total = [v - self._base for v in unmask(reply, masks)]        # G_l |S| at F bits
            cross_ints = [t - a for t, a in zip(total, local_ints)]
            g = torch.tensor(total, dtype=torch.float64) / 2.0 ** F / len(rows)
        return g, cross_ints

    def _direction(self, cross, rows, multiplier: torch.Tensor):
        """SQN step: the unmasked block to the coordinator (it applies H_t); returns p_l and the own part."""
        local_ints, _ = self._block(cross, rows, multiplier, self.w, masked=False)
        with self.s.clock("recv"):
            p = self.fed.recv_tensor(self.s.coordinator, device="cpu").to(torch.float64)
        return p, local_ints

    def curvature(self, rows_H, s_l: torch.Tensor) -> None:
        """[[V_l]] = [[X_l^T (X s) / 4 + |S_H| lambda s_l]], unmasked (the coordinator learns v, as in the paper)."""
        with self.fed.phase(PHASE_CURVATURE):
            quarter = 0.25 * self.local_margins(rows_H, s_l)
            cross = self._exchange(rows_H, quarter)
            self._block(cross, rows_H, quarter, s_l, masked=False)

    def obfuscators_per_iteration(self, rows: int) -> int:
        return 2 * self._layout.chunks + 1

    def obfuscators_per_curvature(self, rows: int) -> int:
        return 2 * self._layout.chunks


class PackedGuest(_PackedParty, Guest):
    def __init__(self, session, X, y, penalized):
        super().__init__(session, X, y, penalized)
        self._packed_setup()

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, scheme, host = self.s, self.s.scheme, self.s.hosts[0]
        u_b = self.local_margins(rows)
        y = self.y[torch.as_tensor(rows)]
        v = 0.25 * u_b - 0.5 * y
        with self.fed.phase(PHASE_GRADIENT):
            from_host = self._exchange(rows, v)                 # sends [[X_A^T v]], receives [[X_B^T u_A / 4]]
            if quasi_newton:
                p, _ = self._direction(from_host, rows, v)
            else:
                p, _ = self._masked_block(from_host, rows, v)
                self.last_gradient = p
        with self.fed.phase(PHASE_LOSS):
            with s.clock("recv"):
                enc_h = scheme.recv(self.fed, host)
            with s.clock("he"):
                plain = (u_b * u_b - 4.0 * y * u_b).sum() + 8.0 * len(rows) * LOG2
                enc_loss = scheme.fixed(enc_h + plain, max(s.bounds.F_Q, enc_h.frac_bits))
            with s.clock("send"):
                scheme.send(self.fed, enc_loss, s.coordinator, packed_loss_bits(s.bounds, enc_loss.frac_bits))
        self.update(p, eta)


class PackedHost(_PackedParty, Host):
    def __init__(self, session, X, penalized):
        super().__init__(session, X, penalized)
        self._packed_setup()

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, scheme, guest = self.s, self.s.scheme, self.s.guest
        u = self.local_margins(rows)
        quarter = 0.25 * u
        with self.fed.phase(PHASE_GRADIENT):
            from_guest = self._exchange(rows, quarter)           # sends [[X_B^T u_A / 4]], receives [[X_A^T v]]
            if quasi_newton:
                p, local_ints = self._direction(from_guest, rows, quarter)
            else:
                p, cross = self._masked_block(from_guest, rows, quarter)
                self.last_gradient = p
        with self.fed.phase(PHASE_LOSS):
            if quasi_newton:
                enc_h = self._loss_part_encrypted(u, local_ints)
            else:
                with s.clock("plain"):
                    # u_A^T v = w_A^T (X_A^T v): the cross part of G_A, which the host has just unmasked.
                    uv = float(torch.tensor(cross, dtype=torch.float64) @ self.w.to("cpu", torch.float64)) \
                        / 2.0 ** (F_V + s.feature_frac_bits)
                    h = (u * u).sum() + 8.0 * uv
                with s.clock("encrypt"):
                    enc_h = scheme.encrypt(h.reshape(()), s.bounds.F_Q, max_abs=_host_loss_max(s.bounds))
            with s.clock("send"):
                scheme.send(self.fed, enc_h, guest, host_loss_bits(s.bounds, enc_h.frac_bits))
        self.update(p, eta)

    def _loss_part_encrypted(self, u: torch.Tensor, local_ints) -> EncryptedTensor:
        """SQN step: [[H]] = [[sum u_A^2 + 8 w_A^T (G_A - own part)]] from the coordinator's [[G_A]].

        The coordinator (which decrypted G_A to apply H_t) sends G_A back encrypted under its own key; the
        host weighs it by w_A homomorphically, so it learns no SQN-step gradient."""
        s, pm = self.s, self._pm
        F = F_V + s.feature_frac_bits + F_W
        with s.clock("recv"):
            enc_g = self._recv_cs(s.coordinator, len(local_ints))
        with s.clock("he"):
            w_ints = _ints(self.w, F_W)
            weighted = arith.multiexp_columns(enc_g, [w_ints], pm.nsquare)[0]            # [[w^T G]]
            eight = gmpy2.powmod(weighted, 8, pm.nsquare)
            own = _ints((u * u).sum().reshape(1), F)[0] - 8 * sum(a * b for a, b in zip(w_ints, local_ints))
            cs = arith.add_plain_raw([eight], [own], pm.n, pm.nsquare)
        bound = received(host_loss_bits(s.bounds, F))
        return EncryptedTensor(s.scheme.public_key, cs, (), F, bound, obfuscated=False, _pm=pm)


def _host_loss_max(bounds) -> float:
    return bounds.batch * (MARGIN_MAX ** 2 + 8 * MARGIN_MAX * (0.25 * MARGIN_MAX + 0.5))


def host_loss_bits(bounds, frac_bits: int | None = None) -> int:
    """Header bound of the host's [[H]] (public caps only)."""
    return fixed(_host_loss_max(bounds), bounds.F_Q if frac_bits is None else frac_bits).bit_length() + 1


def packed_loss_bits(bounds, frac_bits: int | None = None) -> int:
    """Header bound of the guest's [[8 sum l]] = [[H]] + its own terms."""
    f = bounds.F_Q if frac_bits is None else frac_bits
    plain = fixed(bounds.batch * (MARGIN_MAX ** 2 + 4 * MARGIN_MAX + 8), f)
    return ((1 << host_loss_bits(bounds, f)) + plain).bit_length()


class PackedCoordinator(Coordinator):
    """Decrypts the packed blocks: masked slots back to their owner (SGD), g for H_t (SQN), v for the pairs."""

    def _blocks(self, rows: int) -> list[list[int]]:
        """Receive and decrypt every data party's packed block; the slots minus the public offset."""
        s, fed = self.s, self.fed
        pm, sk = public_math(s.scheme.public_key), private_math(s.scheme.private_key)
        B, _ = slot_bits(layout_batch(s.bounds), s.l2, s.feature_frac_bits, s.bounds.mask_bits)
        base = slot_value_bound(layout_batch(s.bounds), s.l2, s.feature_frac_bits)
        out = []
        for party, columns in zip(s.data_parties, s.n_features):
            lay = PackedColumns.plan(pm.bits, columns, B)
            with s.clock("recv"):
                cs = _from_bytes(fed.recv_tensor(party, device="cpu"), pm.width, lay.chunks, pm.nsquare)
            with s.clock("decrypt"):
                plains = arith.decrypt_with(cs, sk)
                out.append([v - base for c, p in enumerate(plains) for v in lay.unpack(p, c)])
        return out

    def iteration(self, rows, k: int, eta: float, quasi_newton: bool) -> None:
        s, fed = self.s, self.fed
        F = F_V + s.feature_frac_bits
        with fed.phase(PHASE_GRADIENT):
            blocks = self._blocks(len(rows))
            if not quasi_newton:
                with s.clock("send"):
                    for party, ints in zip(s.data_parties, blocks):
                        fed.send_json([v + slot_value_bound(layout_batch(s.bounds), s.l2, s.feature_frac_bits)
                                       for v in ints], party)
            else:
                with s.clock("plain"):
                    g = torch.tensor([v for b in blocks for v in b], dtype=torch.float64) / 2.0 ** F / len(rows)
                    p = self.memory.direction(g)
                with s.clock("send"):
                    for party, p_l in zip(s.data_parties, torch.split(p, s.n_features)):
                        fed.send_tensor(p_l.contiguous(), party)
                with s.clock("encrypt"):
                    pm = public_math(s.scheme.public_key)
                    host_g = blocks[1]
                    cs = arith.encrypt_raw(host_g, default_pool(s.scheme.public_key).take(len(host_g)), pm.n,
                                           pm.nsquare)
                with s.clock("send"):
                    fed.send_tensor(_to_bytes(cs, pm.width), s.hosts[0])
        with fed.phase(PHASE_LOSS):
            ints, f = self._open(s.guest)
            self.tracker.add_batch(float(from_fixed(ints, f, ())) / 8.0, len(rows))

    def _curvature_v(self, rows_H: int) -> torch.Tensor:
        """As the per-row coordinator's, from the packed slots (F_V + F_X fractional bits)."""
        blocks = self._blocks(rows_H)
        with self.s.clock("plain"):
            F = F_V + self.s.feature_frac_bits
            return torch.tensor([x for b in blocks for x in b], dtype=torch.float64) / 2.0 ** F / rows_H


__all__ = ["F_V", "F_W", "PackedColumns", "PackedCoordinator", "PackedGuest", "PackedHost", "check_packed",
           "host_loss_bits", "layout_batch", "packed_loss_bits", "slot_bits", "slot_value_bound"]
