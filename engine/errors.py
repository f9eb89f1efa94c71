"""User-facing errors: one line naming the problem and the fix, never a traceback.

Exit statuses (the CLI's, also those of every rank under MPI):

====  ===================================================================================
 0    the run reached ``steps``
 2    bad input (configuration, structure or checkpoint file); nothing was started
 3    the run became unhealthy (non-finite or exploding positions, velocities, forces or
      energy); frames and checkpoints up to the last healthy output are kept
 4    an output could not be written (disk full, read-only, I/O error); earlier frames
      and checkpoints are kept
 5    a rank stopped answering (no heartbeat for ``health.rank_silence`` s: stopped, e.g.
      SIGSTOP or a debugger, or its node down); every rank ended; the checkpoints written
      before are kept (``engine/launch/heartbeat.py``)
75    stopped by a signal after writing a checkpoint (``engine/launch/stop.py``)
====  ===================================================================================
"""
from __future__ import annotations

#: exit status of every rank when one stopped answering (engine/launch/heartbeat.py)
EXIT_RANK_LOST = 5


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


class UnhealthyRun(UserError):
    """The dynamics went bad (NaN/inf, an atom jumping too far): exit status 3."""

    exit_code = 3


class OneLineWarning(UserWarning):
    """A warning about the user's data that the CLI prints as one line (``Warning: <message>``)
    rather than Python's file, line and source; the Python API sees an ordinary warning."""


class OutputError(UserError):
    """A trajectory, log or checkpoint write failed (ENOSPC, EIO, read-only): exit status 4."""

    exit_code = 4
