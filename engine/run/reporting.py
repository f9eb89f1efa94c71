"""What people see: a LAMMPS-style thermo table, a progress line, a log file, a timing summary."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from shardmd.engine.errors import OutputError
from shardmd.engine.observables import columns as thermo_columns


def _ns_per_day(steps_per_s: float, dt_fs: float) -> float:
    return steps_per_s * dt_fs * 1e-6 * 86400


def _fmt_duration(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:d}:{sec:02d}"


class Eta:
    """The remaining time of a run (s) from a smoothed step rate.

    Rates are measured from the first update on, never from the run's start: the first step
    carries one-off work (the model's first call, kernel compiles, the first neighbour build),
    which made the first estimate of a 2-minute run ~600x too long. Each later update moves the
    rate towards the rate since the previous one, an exponential moving average with time
    constant ``tau`` s, so a machine that gets busier or quieter moves the estimate within ~tau.
    """

    def __init__(self, tau: float = 20.0):
        self.tau = tau
        self._last: tuple[float, int] | None = None
        self.rate: float | None = None   # steps/s

    def update(self, now: float, step: int) -> None:
        """now: a monotonic clock (s); step: the steps done."""
        if self._last is None:
            self._last = (now, step)
            return
        t, s = self._last
        if now <= t or step <= s:
            return
        r = (step - s) / (now - t)
        self.rate = r if self.rate is None else self.rate + (1.0 - math.exp(-(now - t) / self.tau)) * (r - self.rate)
        self._last = (now, step)

    def remaining(self, step: int, last_step: int) -> float | None:
        """Seconds to ``last_step``; None before a rate is known."""
        return (last_step - step) / self.rate if self.rate else None


class Reporter:
    """Thermo table, progress and log.  Only rank 0 reports (``enabled=False`` elsewhere).

    log_path: the log file (every line printed, also in quiet mode); quiet: nothing on the
    terminal but errors; progress: a progress line on stderr (a live one on a terminal);
    config_line: the log's first line, the configuration, expressions as written
    (shardmd.engine.config.compose.echo_line); one
    line, so that the log's line count still says how far a run is (tools and tests watch it);
    columns: the thermo table's (engine/observables/columns.py), None: the default ones as
    registered when the table starts.
    """

    def __init__(self, log_path: str | Path | None, quiet: bool = False, progress: bool = True,
                 enabled: bool = True, stream=None, log_mode: str = "w", config_line: str | None = None,
                 columns: list | None = None):
        self.enabled = enabled
        self.quiet = quiet
        self.progress = progress and not quiet
        self.out = stream or sys.stdout
        self.err = sys.stderr
        self.log = None
        # opened at the first line, so a run refused before its header leaves no log behind
        self._log_path = Path(log_path) if enabled and log_path else None
        self._log_mode = log_mode
        self._config_line = config_line
        self._header_done = False
        self.columns = columns
        self._columns = []
        self._t0 = None
        self._step0 = 0
        self._last_progress = 0.0
        self._eta = Eta()
        self._live = bool(getattr(self.err, "isatty", lambda: False)())

    def line(self, text: str = "") -> None:
        if not self.enabled:
            return
        if self._log_path is not None:
            self._log(text)
        if not self.quiet:
            self._clear_progress()
            self.out.write(text + "\n")
            self.out.flush()

    def _log(self, text: str) -> None:
        try:
            if self.log is None:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                self.log = open(self._log_path, self._log_mode, buffering=1)
                if self._config_line:
                    self.log.write(self._config_line + "\n")
            self.log.write(text + "\n")
        except OSError as exc:   # a full disk or a vanished folder ends the run (exit 4)
            path, self._log_path = self._log_path, None
            raise OutputError(f"cannot write the log {str(path)!r} ({exc.strerror or exc}); free space or choose "
                              "another output=; the trajectory and checkpoints written so far are intact") from None

    def thermo(self, step: int, time_fs: float, obs: dict) -> None:
        if not self.enabled:
            return
        if not self._header_done:   # the default columns are those registered when the table starts
            self._columns = self.columns if self.columns is not None else thermo_columns.parse(None)
            self.line(thermo_columns.header(self._columns))
            self._header_done = True
        # a space between columns: a wide value (PE of a 10 M-atom system) never joins its neighbour;
        # an absent value (no pressure without a virial) is '-'
        self.line(thermo_columns.row(self._columns, step, time_fs, obs))

    def start(self, step: int) -> None:
        self._t0 = time.perf_counter()
        self._step0 = step
        self._eta = Eta()

    def rates(self, step: int, dt_fs: float, n_atoms: int, elapsed: float | None = None) -> dict[str, float]:
        if elapsed is None:
            elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        elapsed = max(elapsed, 1e-9)
        done = step - self._step0
        sps = done / elapsed
        return {"elapsed_s": elapsed, "steps_per_s": sps, "ns_per_day": _ns_per_day(sps, dt_fs),
                "atom_steps_per_s": sps * n_atoms}

    def progress_update(self, step: int, last_step: int, dt_fs: float, n_atoms: int, force=False) -> None:
        if not (self.enabled and self.progress):
            return
        now = time.perf_counter()
        interval = 0.5 if self._live else 30.0
        if not force and now - self._last_progress < interval:
            return
        self._last_progress = now
        self._eta.update(now, step)
        sps = self._eta.rate or self.rates(step, dt_fs, n_atoms)["steps_per_s"]   # the average until a rate is known
        total = max(last_step - self._step0, 1)
        frac = (step - self._step0) / total
        eta = self._eta.remaining(step, last_step)
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        text = (f"[{bar}] step {step}/{last_step} {100 * frac:5.1f}%  {sps:.2f} steps/s  "
                f"{_ns_per_day(sps, dt_fs):.3f} ns/day  ETA {'?' if eta is None else _fmt_duration(eta)}")
        if self._live:
            self.err.write("\r" + text + "\033[K")
        else:
            self.err.write(text + "\n")
        self.err.flush()

    def _clear_progress(self) -> None:
        if self._live and self.progress and self._last_progress:
            self.err.write("\r\033[K")
            self.err.flush()

    def summary(self, lines: list[str]) -> None:
        for text in lines:
            self.line(text)

    def close(self) -> None:
        if self.enabled and self._live and self.progress and self._last_progress:
            self.err.write("\n")
        if self.log:
            try:
                self.log.close()
            except OSError:   # already reported by the write that failed
                pass
            self.log = None
