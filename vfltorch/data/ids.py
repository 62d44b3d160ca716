"""What an ID is when rows are aligned: its canonical text, and the error every PSI engine raises.

Both PSI engines (``psi.py``'s ECDH, ``psi_rr22.py``'s RR22) and the party-file loader compare IDs through
``canonical_id``; keeping it here, apart from either engine, lets each import it without importing the other.
"""

from __future__ import annotations

import numpy as np


class PSIError(RuntimeError):
    """Row alignment failed (no common ID, a malformed message, an unusable ID, an engine's crash)."""


def canonical_id(v) -> str:
    """The text an ID is compared by: the ID's own text, stripped of surrounding whitespace, case and leading
    zeros kept ("0001000" is not "1000", "AB" is not "ab"); integers (a Python caller's IDs) as their decimal text.

    A floating-point ID is refused: the file loader reads ID columns as text, and a float has lost what it held
    (123.0 for "123", a value above 2**53 rounded onto a neighbour's ID), so matching it would pair different
    people (issue 33)."""
    if isinstance(v, str):
        text = v.strip()
    elif isinstance(v, (bool, np.bool_)):
        raise PSIError(f"an ID must be text or an integer, got the boolean {v!r}")
    elif isinstance(v, (int, np.integer)):
        text = str(int(v))
    elif isinstance(v, (float, np.floating)):
        raise PSIError(f"an ID was read as the floating-point number {v!r}, which cannot be matched exactly (a value "
                       f"above 2**53 is rounded; 123.0 is not the text 123): read the ID column as text")
    elif isinstance(v, bytes):
        text = v.decode("utf-8", "strict").strip()
    else:
        raise PSIError(f"an ID must be text or an integer, got {type(v).__name__} {v!r}")
    if not text:
        raise PSIError("an ID is blank: every row needs an ID to be aligned")
    return text
