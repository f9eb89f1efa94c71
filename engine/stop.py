"""Stop requests from signals (SIGTERM, SIGINT, SIGUSR1), turned into a collective decision.

A handler only sets a flag; the run loop asks all ranks together (one small all-reduce per
step) and every rank stops after the same step, writes a checkpoint and exits with
``EXIT_STOPPED``.  Batch systems send SIGTERM (or, configured, SIGUSR1) before a kill; the
signal may reach the self-launching parent (which forwards it to its ranks) or every rank.
"""
from __future__ import annotations

import signal

#: exit status of a run stopped early by a signal, with a checkpoint to continue from
#: (75 = EX_TEMPFAIL: "try again"; resubmit with restart=auto)
EXIT_STOPPED = 75
SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGUSR1")) if s)


class StopRequest:
    def __init__(self):
        self.signal_name: str | None = None
        self._old = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handler(self, signum, frame):
        self.signal_name = signal.Signals(signum).name

    def install(self) -> None:
        for s in SIGNALS:
            try:
                self._old[s] = signal.signal(s, self._handler)
            except (ValueError, OSError):  # not the main thread
                pass

    def uninstall(self) -> None:
        for s, old in self._old.items():
            try:
                signal.signal(s, old)
            except (ValueError, OSError):
                pass
        self._old = {}
