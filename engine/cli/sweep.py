"""Sweeps (``python -m engine run ... -m``): every job's configuration checked before the first
starts, the jobs run one after another by Hydra's sweeper and launcher, and at the end a summary:
printed (which failed, where the outputs are) and written as ``summary.csv`` in the sweep's
folder, beside the jobs' folders and Hydra's ``multirun.yaml`` (``summary-<task>.csv`` for a
SLURM array task, which runs its own job only).

The CSV has one row per job run here, in job order, written also when jobs failed (a failed job
hides none of the others; the sweep then exits with the first failure's status):

=====================  ==========================================================================
job                    Hydra's job number (its folder's name)
overrides              the job's own overrides, space-separated, as on the command line
exit_status            0, or the job's exit status (2 bad input, 3 unhealthy, ...; 1 an error of
                       the job's code)
output                 the job's trajectory (``output``), relative to the working directory
final_step             the step of the last potential energy recorded (blank: none)
final_potential_energy eV, the last one the job recorded: its trajectory's ``potential_energy``
                       observable, else the last thermo line of its log (blank: none)
=====================  ==========================================================================
"""
from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: the CSV's columns, in order
COLUMNS = ("job", "overrides", "exit_status", "output", "final_step", "final_potential_energy")


class Stopped(BaseException):
    """A sweep job stopped by a signal (exit 75) or interrupted: the sweep stops too.
    A BaseException, so that Hydra's launcher does not go on to the next job."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class JobRow:
    """A job this process ran: its number, overrides, exit status, output path and folder."""

    num: int
    overrides: tuple[str, ...]
    code: int
    output: str
    folder: str


#: jobs that ended in this process, in order (the rows when a stopped sweep returns nothing)
_ENDED: list[JobRow] = []


def job_output(output: str, output_dir: str) -> str:
    """``output`` inside the job's folder (unless absolute), relative to the working directory."""
    rel = os.path.relpath(output_dir)
    return output if os.path.isabs(output) or rel == os.curdir else os.path.join(rel, output)


def run_job(cfg, num: int, overrides: list[str], output: str, run) -> int:
    """One sweep job: ``run()`` (its exit status) with every failure one line on rank 0 and the
    next job still run; a signal's exit (75) or an interrupt stops the sweep (:class:`Stopped`)."""
    from shardmd.engine.config.compose import validate
    from shardmd.engine.errors import UserError
    from shardmd.engine.launch.parallel import env_rank

    if env_rank() == 0 and not cfg.quiet:
        print(f"job {num}: {' '.join(overrides)} -> {output}", flush=True)
    try:
        validate(cfg)
        code = run()
    except UserError as exc:
        if env_rank() == 0:
            sys.stderr.write(f"error: job {num}: {exc.one_line()}\n")
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # noqa: BLE001 - a job's fault (a model's bug): one line, the next job runs
        if env_rank() == 0:
            first = " ".join(str(exc).split())
            sys.stderr.write(f"error: job {num}: {type(exc).__name__}: {first} "
                             "(SHARDMD_TRACEBACK=1 prints the traceback)\n")
            if os.environ.get("SHARDMD_TRACEBACK"):
                import traceback

                traceback.print_exc()
        code = 1
    from hydra.core.hydra_config import HydraConfig

    _ENDED.append(JobRow(num, tuple(overrides), int(code), output, str(HydraConfig.get().runtime.output_dir)))
    if code in (75, 130):
        raise Stopped(code)
    return code


def sweep(hydra, name: str, overrides: list[str], task) -> int:
    """Check every job's configuration, let Hydra's sweeper and launcher run them, then say and
    write the summary; the exit status of the first failed job, else 0."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    from shardmd.engine.config.compose import load
    from shardmd.engine.errors import UserError
    from shardmd.engine.launch.parallel import env_rank, under_launcher

    master = load(hydra.config_loader, name, overrides, multirun=True)
    jobs = None
    if master.hydra.sweeper._target_ == f"{BasicSweeper.__module__}.BasicSweeper":
        jobs = _check_jobs(hydra, master, overrides)
    array = os.environ.get("SLURM_ARRAY_TASK_ID")
    if array is not None and jobs is not None and not (array.isdigit() and int(array) < len(jobs)):
        raise UserError(f"SLURM array task {array} has no job: the sweep has {len(jobs)} "
                        f"(submit it with --array=0-{len(jobs) - 1})")
    if under_launcher() and "SLURM_ARRAY_JOB_ID" not in os.environ \
            and not any(o.startswith("hydra.sweep.dir=") for o in overrides):
        raise UserError("a sweep under mpiexec/srun needs one folder for all ranks: give hydra.sweep.dir=DIR "
                        "(or submit it as a SLURM array)")
    _ENDED.clear()
    try:
        returns = hydra.multirun(config_name=name, task_function=task, overrides=overrides)
    except Stopped as stop:   # the jobs ended so far in the CSV; the stop said its own line
        if env_rank() == 0:
            write_csv(sorted(_ENDED, key=lambda r: r.num), str(master.hydra.sweep.dir))
        return stop.code
    rows = [row for batch in returns for r in batch if (row := _job_row(r)) is not None]
    folder = next((str(r.hydra_cfg.hydra.sweep.dir) for batch in returns for r in batch), str(master.hydra.sweep.dir))
    return _summarize(rows, folder, master.quiet)


def _check_jobs(hydra, master, overrides: list[str]) -> list:
    """The basic sweeper's jobs, each composed and checked (one line for the first bad one)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from shardmd.engine.config import guard as config_guard
    from shardmd.engine.config.compose import composition_error, job_config
    from shardmd.engine.run.builders import check_system

    params = [f"{k}={v}" for k, v in (master.hydra.sweeper.params or {}).items()]
    args = params + OmegaConf.to_container(master.hydra.overrides.task)
    parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(args)
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    for job in jobs:
        try:
            cfg = hydra.config_loader.load_sweep_config(master, list(job))
        except Exception as exc:  # noqa: BLE001 - as in config.load: one line whatever Hydra raises
            raise composition_error(exc, list(job)) from None
        config_guard.check(cfg, [*overrides, *job], config_guard.allowed())
        check_system(job_config(cfg).system)   # the builder's keys together (a density no packing reaches)
    return jobs


def _job_row(r) -> JobRow | None:
    """The row of a job Hydra ran; a job Hydra itself failed (its exception kept in the return)
    counts as exit 1; None: another SLURM array task's job."""
    from hydra.core.utils import JobStatus

    hc = r.hydra_cfg.hydra
    code = r._return_value if r.status == JobStatus.COMPLETED else 1
    if code is None:
        return None
    ended = next((e for e in _ENDED if e.num == int(hc.job.num)), None)
    output = ended.output if ended else job_output(str(r.cfg.output), str(hc.runtime.output_dir))
    return JobRow(int(hc.job.num), tuple(r.overrides or ()), int(code), output, str(hc.runtime.output_dir))


def _summarize(rows: list[JobRow], folder: str, quiet: bool) -> int:
    """Print the summary (stderr when a job failed; nothing when quiet and all succeeded) and
    write the CSV (rank 0); the first failure's exit status, else 0."""
    from shardmd.engine.launch.parallel import env_rank

    rows = sorted(rows, key=lambda r: r.num)
    failed = [r for r in rows if r.code]
    if env_rank() != 0:
        return failed[0].code if failed else 0
    csv_path = write_csv(rows, folder)
    if failed or not quiet:
        out = sys.stderr if failed else sys.stdout
        out.write(f"sweep: {len(rows) - len(failed)} of {len(rows)} jobs succeeded\n"
                  + "".join(f"  job {r.num}: {' '.join(r.overrides) or '(no overrides)'} -> exit {r.code}, "
                            f"{r.folder}\n" for r in rows) + f"  summary: {csv_path}\n")
        if failed:
            out.write(f"error: {len(failed)} of {len(rows)} jobs failed: "
                      + ", ".join(f"job {r.num} (exit {r.code})" for r in failed) + f"; outputs in {folder}\n")
        out.flush()
    return failed[0].code if failed else 0


def write_csv(rows: list[JobRow], folder: str) -> str:
    """``summary.csv`` (a SLURM array task: ``summary-<task>.csv``) in the sweep's folder, one
    row per job (the module docstring); its path.  Written whole to a temporary name first, then
    renamed: a reader never sees half a file."""
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    path = Path(folder) / (f"summary-{task}.csv" if task is not None else "summary.csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            step, energy = final_energy(r.output)
            w.writerow([r.num, " ".join(r.overrides), r.code, r.output, "" if step is None else step,
                        "" if energy is None else repr(energy)])
    os.replace(tmp, path)
    return str(path)


def final_energy(output: str) -> tuple[int | None, float | None]:
    """(step, potential energy eV) last recorded by the run whose trajectory is ``output``: the
    trajectory's ``potential_energy`` observable, else the last thermo line of its log; (None,
    None) when neither holds one (a job refused before it ran, a damaged file)."""
    import warnings

    path = Path(output)
    if path.is_file():
        try:
            from shardmd.engine.io.h5md import read_observables

            with warnings.catch_warnings():   # a damaged file: the log below, or blank
                warnings.simplefilter("ignore")
                steps, _, values = read_observables(str(path)).get("potential_energy", ((), (), ()))
            if len(values):
                return int(steps[-1]), float(values[-1])
        except Exception:  # noqa: BLE001 - not ours, or unreadable: the log may still say
            pass
    return _log_energy(path.with_suffix(".log"))


def _log_energy(log: Path) -> tuple[int | None, float | None]:
    """(step, PotEng) of the log's last thermo line (the columns named by its header line)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    col, last = None, (None, None)
    for line in lines:
        cols = line.split()
        if "PotEng(eV)" in cols and cols[0] == "Step":
            col = cols.index("PotEng(eV)")
        elif col is not None and len(cols) > col and cols[0].isdigit():
            try:
                last = int(cols[0]), float(cols[col])
            except ValueError:
                continue
    return last
