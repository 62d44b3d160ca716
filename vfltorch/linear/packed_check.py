"""Which settings the packed-features layout (``packed.py``) runs under; torch-free, so that the CLI can
answer an impossible combination before any party starts."""

from __future__ import annotations


def check_packed(protocol: str, encryption: bool, parties: int | None) -> str | None:
    """Why ``packed_features`` cannot run with these settings (None: it can)."""
    if protocol != "paper":
        return "packed_features applies to the paper protocol (protocol='paper', --protocol paper)"
    if not encryption:
        return "packed_features is a Paillier layout: it has no plaintext mode (drop --insecure-plaintext)"
    if parties is not None and parties != 2:
        return f"packed_features runs between one guest and one host (2 data parties), got {parties}"
    return None


__all__ = ["check_packed"]
