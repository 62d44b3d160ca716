"""Errors raised by the federation runtime."""

from __future__ import annotations


class PartyFailure(RuntimeError):
    """Another party died, never joined, or stopped answering.

    ``party`` is the rank believed to be the root cause (the one that is gone),
    ``reporter`` the rank that raised the error.
    """

    def __init__(self, message: str, *, party: int | None = None, reporter: int | None = None,
                 phase: str | None = None):
        super().__init__(message)
        self.party = party
        self.reporter = reporter
        self.phase = phase


class FederationError(RuntimeError):
    """Raised by the launcher when one or more party processes failed.

    ``errors`` maps rank to the error text that party reported (or to a note
    that it died without reporting). ``root`` is the rank whose failure
    explains the others, when it can be told.
    """

    def __init__(self, message: str, *, errors: dict[int, str], root: int | None = None):
        super().__init__(message)
        self.errors = errors
        self.root = root


class BackendUnavailable(RuntimeError):
    """The torch build lacks the asked torch.distributed backend (gloo, MPI)."""
