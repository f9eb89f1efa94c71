"""Stop requests from signals (SIGTERM, SIGINT, SIGUSR1), turned into a collective decision.

A handler only sets a flag; the run loop asks all ranks together at every step (in the skin
check's all-reduce at a step with a check, else one small all-reduce of its own; with a deferred
check at its blocking read-backs: engine/run/rebuild.py ``stop_agreed``) and every rank stops after
the same step, writes a checkpoint and exits with ``EXIT_STOPPED``.  Batch systems send
SIGTERM (or, configured, SIGUSR1) before a kill; the signal may reach the self-launching parent
(which forwards it to its ranks) or every rank.
"""
from __future__ import annotations

import os
import signal
import threading

#: exit status of a run stopped early by a signal, with a checkpoint to continue from
#: (75 = EX_TEMPFAIL: "try again"; resubmit with restart=auto)
EXIT_STOPPED = 75
SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGUSR1")) if s)


#: the batch system's stop signals, recorded from the interpreter's start (install_early)
EARLY_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGUSR1")) if s)
#: environment variable through which a self-launching parent hands a recorded signal to its ranks
PENDING_ENV = "SHARDMD_PENDING_STOP"
_EARLY: list[int] = []
#: set when a run's stop handling ends (:meth:`StopRequest.uninstall`, after the stop's checkpoint
#: or any other end of the run): a watchdog that asked for a stop waits for it, however long a
#: busy machine makes the set-up, the step or the checkpoint (engine/launch/parallel.py watch_parent)
RUN_ENDED = threading.Event()


def _record(signum, frame) -> None:
    _EARLY.append(signum)


def install_early() -> None:
    """``python -m engine run``, first thing: record SIGTERM / SIGUSR1 instead of dying
    of them. Imports and set-up take seconds, and a batch system's stop signal in that window
    killed the run without a checkpoint (exit 143). The run's :class:`StopRequest` takes a
    recorded signal over (the run stops after its first step, checkpoints, exits 75), and a
    self-launching parent hands it to its ranks (``PENDING_ENV``). SIGINT keeps Python's
    KeyboardInterrupt: a user's Ctrl-C on a starting run still ends it at once."""
    for s in EARLY_SIGNALS:
        try:
            signal.signal(s, _record)
        except (ValueError, OSError):  # not the main thread
            pass


def early_signal() -> str | None:
    """The name of the first stop signal recorded before the run's handler, if any."""
    return signal.Signals(_EARLY[0]).name if _EARLY else None


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
        # a signal that came while the process was starting (install_early), here or in the
        # self-launching parent: taken over once (a later run in this process starts afresh)
        early, handed = early_signal(), os.environ.pop(PENDING_ENV, None)
        pending = early or handed
        _EARLY.clear()
        if pending and self.signal_name is None:
            self.signal_name = pending

    def uninstall(self) -> None:
        RUN_ENDED.set()
        for s, old in self._old.items():
            try:
                signal.signal(s, old)
            except (ValueError, OSError):
                pass
        self._old = {}
