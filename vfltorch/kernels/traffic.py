"""FDSKL's bytes per training iteration, from the public sizes: the formula the tests check the meter against.

All ranks together (the dealer included), per iteration of the bounded model, with Q data parties, B rows per
batch, D features and G gradient sums per step (D under Adam):

* ``paper`` (masked phases, ``protocol.py``): 2Q - 2 messages of B D angles, ``angle_bits`` each.
* ``shared`` (``shared.py``, docs/fdskl.md *Where the bytes go*): the phases in a star into the active party,
  (Q - 1) B D angles of 16 bits; f's product in Z_2^fb (2 B D words) and the gradient's in Z_2^gb (2 B G
  words); the dealer's corrections and the openings; 128-bit seeds. At ``TRAIN_BITS`` (20, 16):
  2 (Q - 1) B D + 5 B D + 4 B G + 5 B + 4 G + 32 Q - 16 bytes; with 32-bit products:
  2 (Q - 1) B D + 8 B (D + G) + 12 (B + G) + 32 Q - 16. The dealer's messages of up to ``DEALER_WINDOW``
  iterations also carry an 8-byte length per recipient and window (at most 8 Q per iteration, not counted).
* ``sealed`` (``sealed.py``, the default): per iteration H and D each send A a D-vector and a B-vector of int64
  words and A sends H one of each: 24 (B + D) bytes. Its setup, once per row (``sealed_setup_bytes``): the star of
  phases ((Q - 1) angles of 16 bits per feature, and the dealer's 128-bit seeds per chunk of rows, 32 (Q - 1)),
  A's U (2D words), V - M1 and k - M2 (D words each): (2 (Q - 1) + 32) D bytes per row. Once per run
  (``sealed_once_bytes``): the three pair seeds and the opened alpha (a D-vector from H and from D), 16 D + 48.
  Its width selection (``sealed_selection_bytes``): each candidate a sealed run on the selection rows, with f
  on the held-out rows opened instead of alpha.

``announce`` turns it into the line a long run prints before its training starts (issue 38): the bytes the
links will carry, and what that is at 100 Mbit/s, a fair guess of a link between organisations.
"""

from __future__ import annotations

ANNOUNCE_BYTES = 100e6          # runs that will send less than this say nothing
LINK_BITS_PER_SECOND = 100e6    # the link speed the line converts to time at


def sealed_once_bytes(D: int) -> int:
    """The sealed protocol's training bytes once per run: the three pair seeds and the opened alpha."""
    return 16 * int(D) + 48


def sealed_setup_bytes(rows: int, Q: int, D: int, chunk: int) -> int:
    """The sealed protocol's setup bytes for ``rows`` rows set up ``chunk`` at a time (sealed.setup_rows)."""
    rows, Q, D = int(rows), int(Q), int(D)
    chunks = -(-rows // max(1, int(chunk))) if rows else 0
    return chunks * 32 * (Q - 1) + rows * D * (2 * (Q - 1) + 32)


def sealed_selection_bytes(Q: int, D: int, rows: int, held: int, B: int, steps: int, chunk: int, f_chunk: int,
                           candidates: int) -> int:
    """The sealed width selection's bytes (``selection.select_width_sealed``): per candidate of D features, the setup
    of its ``rows`` selection rows and ``held`` held-out rows (each ``chunk`` at a time), ``steps`` iterations of
    ``B`` rows, the three pair seeds and, instead of the opened alpha, f on the held-out rows: a (D + rows of the
    chunk)-vector from H and from D per ``f_chunk`` held-out rows."""
    held_chunks = -(-int(held) // max(1, int(f_chunk))) if held else 0
    one = (sealed_setup_bytes(rows, Q, D, chunk) + sealed_setup_bytes(held, Q, D, chunk)
           + int(steps) * iteration_bytes("sealed", Q, B, D, D) + 48 + 16 * (int(D) * held_chunks + int(held)))
    return int(candidates) * one


def iteration_bytes(protocol: str, Q: int, B: int, D: int, G: int, *, bits=(20, 16), angle_bits: int = 16
                    ) -> int | None:
    """Bytes per training iteration, all ranks together (module docstring); None where no formula is kept."""
    Q, B, D, G = int(Q), int(B), int(D), int(G)
    if Q < 2:
        return 0
    if protocol == "paper":
        return (2 * Q - 2) * B * D * int(angle_bits) // 8
    if protocol == "sealed":
        return 24 * (B + D)
    if protocol == "shared":
        star = 2 * (Q - 1) * B * D
        if tuple(bits) == (20, 16):
            return star + 5 * B * D + 4 * B * G + 5 * B + 4 * G + 32 * Q - 16
        if tuple(bits) == (32, 32):
            return star + 8 * B * (D + G) + 12 * (B + G) + 32 * Q - 16
    return None


def _size(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


def _transfer(total: int) -> str:
    seconds = 8 * total / LINK_BITS_PER_SECOND
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def announce(per_iteration: int | None, iterations: int | None, *, extras: bool = True, fixed: int = 0
             ) -> str | None:
    """'vfl: fdskl: training will move about 4.59 GB over the links ...' for ``iterations``, or None (short runs,
    no formula). ``extras``: the run may add a width selection and a compression (not under ``sealed``, whose
    selection announces itself: ``announce_selection``); ``fixed``: bytes outside the iterations (``sealed``'s
    setup)."""
    if not per_iteration or not iterations:
        return None
    total = per_iteration * iterations + int(fixed)
    if total < ANNOUNCE_BYTES:
        return None
    setup = f"{_size(fixed)} once and " if fixed else ""
    return (f"vfl: fdskl: training will move about {_size(total)} over the links ({setup}{per_iteration / 1e6:.3g} MB "
            f"per iteration x {iterations} iterations, all parties together"
            f"{'; a width selection and a compression add theirs' if extras else ''}): {_transfer(total)} of "
            f"transfer at 100 Mbit/s")


def announce_selection(total: int, candidates: int) -> str | None:
    """The line the sealed width selection prints before its candidates run (None under ``ANNOUNCE_BYTES``)."""
    if total < ANNOUNCE_BYTES:
        return None
    return (f"vfl: fdskl: the kernel-width selection ({candidates} candidate runs on a sample of rows) will move "
            f"about {_size(total)} over the links before training, all parties together: {_transfer(total)} of "
            f"transfer at 100 Mbit/s (sigma_grid=(1.0,) / --sigma-grid 1 skips it)")


__all__ = ["ANNOUNCE_BYTES", "sealed_once_bytes", "sealed_setup_bytes", "sealed_selection_bytes", "announce",
           "announce_selection", "iteration_bytes"]
