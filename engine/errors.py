"""User-facing errors: one line naming the problem and the fix, never a traceback."""
from __future__ import annotations


class UserError(Exception):
    """Bad input (config, files, structures).  The CLI prints ``error: <message>`` and exits 2."""

    exit_code = 2
    #: raised alike on every rank (printed once by rank 0, no abort needed)
    collective = False

    def one_line(self) -> str:
        return " ".join(str(self).split())


class CollectiveError(UserError):
    """A UserError every rank raises at the same point (e.g. an impossible decomposition)."""

    collective = True
