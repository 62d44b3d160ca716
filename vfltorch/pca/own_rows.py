"""Each data party gets its own rows of the rotated-back components, and no other party's (issue 39).

The covariance protocol (``exact.py``) opens P C P^T / s^2 at the coordinator, which takes its k leading
eigenvectors W (d x k). The components are V = P^T W, and party l's output is its rows V_l. Sending W to
every data party, each of which knew P, gave every party every V_m: with the scores X V (an output) that
rebuilt another party's centred columns at rank k, X_m ~ (X V) V_m^T, and its covariance block. Here:

1. The coordinator encodes W at ``W_BITS`` fractional bits and splits it in Z_2^128: the second holder h1
   gets the 128-bit seed of a uniform R (d x k), the first holder h0 the explicit enc(W) - R (uniform to it).
2. Only the two holders know P. Each multiplies its share by L = round(P^T 2**``P_BITS``) (``_matmul128``):
   shares of L enc(W) = enc(V) at W_BITS + P_BITS = 108 fractional bits. |V| <= 1, so the value stays below
   2**127 and nothing is truncated.
3. h0 sends h1 the seed of a zero-sharing Z (d x k, uniform in Z_2^128): h0 adds it, h1 subtracts it.
4. For every data party l, each holder other than l sends it rows l of its share (plus or minus Z_l);
   l adds them (and its own rows, if it is a holder). Each message is uniform on its own; their sum is enc(V_l).

What a data party receives: uniform 128-bit words whose sum is its own V_l; a holder also a uniform share of
W (h0) or a seed (h1), and, from the other holder, uniform words that open its own rows. Nobody learns
another party's rows of V beyond what the output implies (docs/pca.md). Cost: 2 d k words to h0, 16-byte
seeds, and 2 x 2 f_l k words per party (every entry 128 bits): O(d k), against O(d^2) for the rotation.
"""

from __future__ import annotations

import numpy as np
import torch

from ..comm import Federation
from ..comm.sharing import _add128, _matmul128, _neg128, _stream_from, fresh_seed

W_BITS = 62          # fractional bits of the coordinator's W (|W| <= 1: fits a signed int64)
P_BITS = 46          # fractional bits of P in the product (``_matmul128`` takes |L| < 2**47)
_U64 = np.uint64
_SEED_WORDS = 2


def _uniform128(seed: torch.Tensor, shape) -> tuple[np.ndarray, np.ndarray]:
    """A uniform Z_2^128 tensor (hi, lo words) from a 128-bit seed."""
    count = int(np.prod(shape))
    words = _stream_from(seed).bytes(16 * count).view(_U64).reshape(2, *shape)
    return words[0].copy(), words[1].copy()


def encode128(x: torch.Tensor, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """round(x 2**bits) as signed 128-bit words (|x| 2**bits < 2**63)."""
    e = np.round(x.detach().cpu().double().numpy() * 2.0 ** bits).astype(np.int64)
    return np.where(e < 0, ~_U64(0), _U64(0)).astype(_U64), e.view(_U64)


def decode128(x, bits: int) -> torch.Tensor:
    """Signed 128-bit words (hi, lo) divided by 2**bits, as float64."""
    hi, lo = x
    return torch.from_numpy(hi.view(np.int64).astype(np.float64) * 2.0 ** (64 - bits)
                            + lo.astype(np.float64) * 2.0 ** -bits)


def _wire(x) -> torch.Tensor:
    return torch.from_numpy(np.stack([x[0], x[1]]).view(np.int64))


def _from_wire(t: torch.Tensor):
    w = t.numpy().view(_U64)
    return w[0].copy(), w[1].copy()


def open_own_rows(fed: Federation, W: torch.Tensor | None, rotation: torch.Tensor | None, *, holders, dealer: int,
                  parties, offsets, k: int) -> torch.Tensor | None:
    """V = P^T W, each data party opened only its rows (module docstring).

    ``W`` (d x k, float64, |W| <= 1) at the dealer only; ``rotation`` P (d x d) at the two ``holders`` only;
    ``offsets`` the public column offsets of ``parties`` (party i owns rows offsets[i]:offsets[i + 1]).
    Returns this data party's rows V_l (f_l x k, float64, CPU); ``None`` at the dealer.
    """
    h0, h1 = holders
    d = offsets[-1]
    share = None
    if fed.rank == dealer:
        seed = fresh_seed()
        R = _uniform128(seed, (d, k))
        fed.send(_wire(_add128(encode128(W, W_BITS), _neg128(R))), h0)
        fed.send(seed, h1)
        return None
    if fed.rank not in parties:
        return None
    if fed.rank in holders:
        if fed.rank == h0:
            share = _from_wire(fed.recv(dealer, (2, d, k), torch.int64, device="cpu"))
        else:
            share = _uniform128(fed.recv(dealer, (_SEED_WORDS,), torch.int64, device="cpu"), (d, k))
        L = np.round(rotation.detach().cpu().double().numpy().T * 2.0 ** P_BITS).astype(np.int64)
        share = _matmul128(L, share)                       # shares of enc(V) at W_BITS + P_BITS bits
        # A zero-sharing, so that each message a party receives is uniform on its own.
        if fed.rank == h0:
            z_seed = fresh_seed()
            fed.send(z_seed, h1)
            share = _add128(share, _uniform128(z_seed, (d, k)))
        else:
            z_seed = fed.recv(h0, (_SEED_WORDS,), torch.int64, device="cpu")
            share = _add128(share, _neg128(_uniform128(z_seed, (d, k))))
    mine = None
    # One recipient at a time, in the same order at every rank: blocking sends never wait on each other.
    for i, r in enumerate(parties):
        rows = slice(offsets[i], offsets[i + 1])
        if fed.rank == r:
            f = offsets[i + 1] - offsets[i]
            total = None if share is None else (share[0][rows].copy(), share[1][rows].copy())
            for h in holders:
                if h != r:
                    part = _from_wire(fed.recv(h, (2, f, k), torch.int64, device="cpu"))
                    total = part if total is None else _add128(total, part)
            mine = decode128(total, W_BITS + P_BITS)
        elif share is not None:
            fed.send(_wire((share[0][rows], share[1][rows])), r)
    return mine
