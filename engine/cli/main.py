"""Command line: ``python -m engine run key=value ...`` (also ``shardmd run ...``).

``run`` is a Hydra application: Hydra parses the command line (its own parser, its flags),
composes the configuration from the schema (engine/config/schema.py) and runs the job, or
with ``-m`` one job per combination of swept values, each in its own folder, one after
another.  A job whose ``domains`` asks for more ranks than the process has starts them itself
(engine/launch/parallel.py) and waits for them before the next job starts.

Bad input prints one line, ``error: <what is wrong and how to fix it>``, and exits with 2;
everything a run can meet is checked before the first job starts.
"""
from __future__ import annotations

import functools
import os
import sys

USAGE = """\
usage: python -m engine run [key=value ...] [-m] [--cfg job] [--config-path DIR --config-name NAME]
       python -m engine minimize [key=value ...]  FIRE relaxation (minimize.fmax, minimize.steps; docs/minimize.md)
       python -m engine info FILE.h5          what a trajectory or checkpoint holds
       python -m engine plot FILE.h5 OUT.png  energies, energy drift per atom, temperature, pressure vs time
       python -m engine convert RUN.h5 OUT [frames=A:B:C]   frames to LAMMPS dump/data, XTC, DCD, extxyz, ...
       python -m engine --help | --version

Run molecular dynamics.  Keys may be written with or without a leading '+'
(model=lj and +model=lj are the same).  Example:

  python -m engine run model=lj steps=2000 integrator=langevin temperature=120

Hydra's command line:
  -m, --multirun     one job per combination of swept values, one after another:
                     temperature=100,200 -m runs two, in multirun/<date>/<time>/<job>/
                     (under sbatch --array=0-1, array task K runs job K only)
  --cfg job          print the composed configuration and exit (also: hydra, all; --resolve)
  --config-path DIR --config-name NAME
                     start from a YAML file of yours (config=FILE.yaml is the same; README)
  hydra.run.dir=DIR  the run's folder: a relative output= is written there (default: .)
  ~key               remove an optional key (set it to null) or one entry of a map
  --info, --hydra-help, --version
  allow_code=true    let config files and spec files run code: Hydra callbacks, logging handlers,
                     _target_, model routes, model.trust_pickle, a spec's modules,
                     observables.modules (refused without it, the last also from the command
                     line; the log notes what was allowed). Command line only.

Keys (default, meaning):
"""


def _help() -> str:
    from shardmd.engine.config.help import help_text

    return USAGE + help_text() + "\n"


def version() -> str:
    import hydra

    from shardmd.engine import __version__

    return f"shardmd {__version__} (hydra-core {hydra.__version__}, Python {sys.version.split()[0]})"


def _one_line_warnings() -> None:
    """Print warnings about the user's data (:class:`OneLineWarning`) as ``Warning: <message>``
    on stderr; every other warning as Python would."""
    import warnings

    from shardmd.engine.errors import OneLineWarning

    shown = warnings.showwarning
    if getattr(shown, "one_line", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, OneLineWarning):
            (file or sys.stderr).write(f"Warning: {' '.join(str(message).split())}\n")
        else:
            shown(message, category, filename, lineno, file, line)

    show.one_line = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _say_which_clone()
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_help())
        return 0 if argv else 2
    if argv[0] in ("--version", "version"):
        print(version())
        return 0
    cmd, args = argv[0], argv[1:]
    if any(a in ("-h", "--help") for a in args):
        sys.stdout.write(_help())
        return 0
    from shardmd.engine.errors import UserError

    _one_line_warnings()

    try:
        if cmd in ("run", "minimize"):
            return _run(args, command=cmd)
        if cmd == "convert":
            if len(args) not in (2, 3) or (len(args) == 3 and not args[2].startswith("frames=")):
                raise UserError("usage: python -m engine convert RUN.h5 OUT [frames=START:STOP:STEP] (OUT: "
                                ".lammpstrj, .data, .xtc, .dcd, .extxyz, .traj or another format ASE writes)")
            from shardmd.engine.io.convert import convert

            return _print_out(convert(args[0], args[1], args[2] if len(args) == 3 else None))
        if cmd in ("info", "plot"):
            from shardmd.engine.io import inspect_files

            need = 1 if cmd == "info" else 2
            if len(args) != need:
                raise UserError(f"usage: python -m engine {cmd} FILE.h5" + (" OUT.png" if cmd == "plot" else ""))
            if cmd == "info":   # a protocol's or many systems' output names no file: their records
                from shardmd.engine.cli.dispatch import record_info

                return _print_out(record_info(args[0]) or inspect_files.info(args[0]))
            return _print_out(f"wrote {inspect_files.plot(args[0], args[1])}")
        raise UserError(f"unknown command {cmd!r}; use `python -m engine run key=value ...` "
                        "(see python -m engine --help)")
    except UserError as exc:
        from shardmd.engine.launch.parallel import env_rank  # here: --version and --cfg need no torch

        if env_rank() == 0:  # every rank meets a configuration error alike: say it once
            sys.stderr.write(f"error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


def _say_which_clone() -> None:
    from shardmd.engine.cli.clone_check import second_clone_warning
    from shardmd.engine.launch.parallel import env_rank

    line = second_clone_warning()
    if line and env_rank() == 0:
        sys.stderr.write(line + "\n")


def _print_out(text: str) -> int:
    """Print ``text``; exit status 0.  A reader that went away (``engine info run.h5 | head -1``) ends
    the command quietly, as SIGPIPE ends Unix tools: nothing on stderr, exit status 141 (128 +
    SIGPIPE, what a shell reports for ``yes | head -1``'s ``yes``).  Python ignores SIGPIPE, so a
    closed pipe raises BrokenPipeError at the write, or at the interpreter's last flush, where it
    would be printed as "Exception ignored ..."; so stdout is flushed here and, on that error,
    pointed at /dev/null."""
    import signal

    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):   # a stdout without a file descriptor (captured)
            pass
        return 128 + signal.SIGPIPE
    return 0


# -- run: Hydra's command line ------------------------------------------------------------------------
#: Hydra flags that make no sense for an installed engine (no shell-completion plugin, no .hydra/ pickles)
_REFUSED = {"shell_completion": "--shell-completion", "experimental_rerun": "--experimental-rerun"}


class _Raised:
    """An exception a run raised, carried out of Hydra (which would print its own line first)."""

    def __init__(self, exc: Exception):
        self.exc = exc


def _parser():
    from hydra._internal.utils import get_args_parser

    from shardmd.engine.errors import UserError

    parser = get_args_parser()

    def fail(message: str):
        raise UserError(f"{message}; see python -m engine --help")

    parser.error = fail
    return parser


def _run(args: list[str], command: str = "run") -> int:
    from pathlib import Path

    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from shardmd.engine.config import guard as config_guard
    from shardmd.engine.config.compose import job_config, load, normalize_overrides, search_path, split_config_file
    from shardmd.engine.errors import UserError

    if "--version" in args:
        print(version())
        return 0
    parser = _parser()
    ns = parser.parse_intermixed_args(args)
    for attr, flag in _REFUSED.items():
        if getattr(ns, attr):
            raise UserError(f"{flag} is not supported by python -m engine")
    allow, given = config_guard.split_allow_code(ns.overrides)
    config_guard.set_policy(allow)
    file, rest = split_config_file(given)
    if file is not None and (ns.config_path or ns.config_name):
        raise UserError("give config=FILE.yaml or --config-path/--config-name, not both")
    # a relative --config-path is the working directory's (Hydra's own is the app's source file's)
    config_dir = file.parent.resolve() if file else Path(ns.config_path).resolve() if ns.config_path else None
    if config_dir is not None and not config_dir.is_dir():
        raise UserError(f"--config-path={ns.config_path}: no such folder")
    extra = (Path(ns.config_dir).resolve(),) if ns.config_dir else ()
    if extra and not extra[0].is_dir():
        raise UserError(f"--config-dir={ns.config_dir}: no such folder")
    name = file.stem if file else ns.config_name or "config"
    # what ranks started for a job are given, besides the job's own overrides
    flags = [*([f"--config-path={config_dir}"] if config_dir else []),
             *([f"--config-name={name}"] if config_dir or ns.config_name else []),
             *([f"--config-dir={extra[0]}"] if extra else []),
             *([f"{config_guard.ALLOW_KEY}=true"] if allow else [])]
    overrides = normalize_overrides(rest)
    # a pkg:// search path is imported while Hydra composes: refused before composing
    config_guard.check_searchpath(config_guard.primary_file(config_dir, name), overrides, allow)

    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="shardmd", config_search_path=search_path(config_dir, extra))
    try:
        if ns.hydra_help or ns.info:   # both set up logging from the composed config: checked first
            load(hydra.config_loader, name, overrides)
        if ns.hydra_help:
            hydra.hydra_help(config_name=name, args_parser=parser, args=ns)
            return 0
        if ns.info:
            hydra.show_info(ns.info, config_name=name, overrides=overrides)
            return 0
        if ns.cfg:
            if ns.multirun:
                raise UserError("--cfg prints one job's configuration: drop -m")
            job_config(load(hydra.config_loader, name, overrides, check_code=False))   # printing runs nothing
            hydra.show_cfg(config_name=name, overrides=overrides, cfg_type=ns.cfg, package=ns.package,
                           resolve=ns.resolve)
            return 0
        if ns.resolve:
            raise UserError("--resolve goes with --cfg")
        task = functools.partial(_job, flags=flags, command=command)
        single = None if ns.multirun else _single_run(hydra.config_loader, name, overrides)
        if single is not None:   # the usual case: composed and checked there, once more by hydra.run
            overrides += single
        else:
            mode = load(hydra.config_loader, name, overrides, multirun=True).hydra.mode
            if ns.multirun or mode == RunMode.MULTIRUN:
                from shardmd.engine.cli.sweep import sweep

                return sweep(hydra, name,
                              overrides + ([] if mode == RunMode.MULTIRUN else ["hydra.mode=MULTIRUN"]), task)
            overrides += [] if mode == RunMode.RUN else ["hydra.mode=RUN"]
            job_config(load(hydra.config_loader, name, overrides))   # every error before the job starts
        result = hydra.run(config_name=name, task_function=task, overrides=overrides).return_value
        if isinstance(result, _Raised):
            raise result.exc
        return result
    finally:
        GlobalHydra.instance().clear()


def _single_run(loader, name: str, overrides: list[str]) -> list[str] | None:
    """The overrides to add (``hydra.mode=RUN`` where the config leaves the mode unset) when
    ``overrides`` compose in run mode into a config that is not a sweep and passes the checks;
    None otherwise (a sweep, or an error: the caller's general path decides, and says it).

    Composing costs ~0.3 s of CPU (Hydra's defaults list and OmegaConf merges). The general
    path composes three times (sweep mode to read ``hydra.mode``, run mode for the checks, and
    hydra.run); a plain run, which is also what every rank of a job runs, composes twice."""
    from hydra.types import RunMode

    from shardmd.engine.config.compose import job_config, load
    from shardmd.engine.errors import UserError

    try:
        cfg = load(loader, name, overrides)
        if cfg.hydra.mode == RunMode.MULTIRUN:
            return None
        job_config(cfg)   # every error before the job starts
    except UserError:
        return None
    return [] if cfg.hydra.mode == RunMode.RUN else ["hydra.mode=RUN"]


def _job(cfg, flags: list[str], command: str = "run") -> int | None:
    """Hydra's task function: one job (a run, or one of a sweep's)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from shardmd.engine.cli.sweep import job_output, run_job
    from shardmd.engine.config.compose import hydra_value, validate
    from shardmd.engine.config.expressions import update_keeping_expression

    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    array = os.environ.get("SLURM_ARRAY_TASK_ID") if sweep else None
    if array is not None and int(array) != hc.job.num:
        return None   # another array task's job
    overrides = list(hc.overrides.task)
    # an output written as an interpolation stays one: no stored copy holds its value
    expr = update_keeping_expression(cfg, "output", lambda v: job_output(v, hc.runtime.output_dir))
    rank_args = [*flags, *overrides, f"output={expr or hydra_value(cfg.output)}", "hydra.run.dir=."]
    explicit_domains = any(o.lstrip("+").split("=")[0] == "domains" for o in overrides)
    if not sweep:
        try:
            validate(cfg)
            return _run_config(cfg, rank_args, explicit_domains, command)
        except Exception as exc:  # noqa: BLE001 - raised again by _run, outside Hydra
            return _Raised(exc)
    return run_job(cfg, int(hc.job.num), overrides, expr or str(cfg.output),
                   lambda: _run_config(cfg, rank_args, explicit_domains, command))


def _run_config(cfg, rank_args: list[str], explicit_domains: bool, command: str = "run") -> int:
    """One run (``command`` run or minimize): here, on ranks this process starts (``domains`` > 1),
    or on the launcher's."""
    from shardmd.engine.launch.parallel import env_size, launch_self, under_launcher
    from shardmd.engine.run.preflight import check_domains, check_outputs

    check_outputs(cfg)
    many = cfg.system.get("frames") is not None or bool(cfg.system.get("files"))   # engine/batch/
    if command == "minimize" and not many:
        from shardmd.engine.relax.minimize import minimize_cfg

        minimize_cfg(cfg)   # its refusals before any rank starts
    if not under_launcher():
        if cfg.domains > 1:
            if not many:   # many systems: ranks share them, no domains
                check_domains(cfg, local=True)   # before starting any rank
            return launch_self(int(cfg.domains), [command, *rank_args])
        return _run_ranks(cfg, command)
    size = env_size()
    if explicit_domains and cfg.domains != size:
        from shardmd.engine.errors import UserError

        raise UserError(f"domains={cfg.domains} but the launcher started {size} ranks; "
                        f"drop domains= or use mpiexec -n {cfg.domains}")
    cfg.domains = size
    return _run_ranks(cfg, command)


def _run_ranks(cfg, command: str = "run") -> int:
    """Run on this process's rank; an error here ends every rank."""
    import traceback

    from shardmd.domain.comm import init_comm, shutdown
    from shardmd.engine.cli.dispatch import run_command
    from shardmd.engine.errors import UserError

    if os.environ.get("SHARDMD_SELF_LAUNCHED"):
        from shardmd.engine.launch.parallel import watch_parent

        watch_parent()
    comm = init_comm(cfg.device) if cfg.domains > 1 else None
    if comm is not None:   # a rank that stops answering ends the job in seconds, named
        from shardmd.engine.launch.heartbeat import start

        start(comm, float(cfg.health.rank_silence))
    code = 0
    try:
        code = run_command(cfg, comm, command)
    except UserError as exc:
        if comm is None or comm.size == 1:
            raise
        collective = getattr(exc, "collective", False)
        if not collective or comm.rank == 0:
            where = "" if collective else f" (rank {comm.rank})"
            sys.stderr.write(f"error{where}: {exc.one_line()}\n")
            sys.stderr.flush()
        if collective:
            shutdown(comm)
            return exc.exit_code
        comm.abort(exc.exit_code)
    except BaseException as exc:  # a bug or an injected failure: end all ranks now
        if comm is None or comm.size == 1:
            raise
        sys.stderr.write(f"error (rank {comm.rank}): {type(exc).__name__}: {exc}\n")
        log = traceback.format_exc()
        sys.stderr.write(log if os.environ.get("SHARDMD_TRACEBACK") else "")
        sys.stderr.flush()
        comm.abort(1)
    if comm is not None:
        shutdown(comm)
    return code
