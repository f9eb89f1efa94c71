"""Command line: ``python -m engine run key=value ...`` (also ``shardmd run ...``).

Bad input prints one line, ``error: <what is wrong and how to fix it>``, and exits with 2.
"""
from __future__ import annotations

import os
import sys

USAGE = """\
usage: python -m engine run [key=value ...]
       python -m engine info FILE.h5          what a trajectory or checkpoint holds
       python -m engine plot FILE.h5 OUT.png  energies, temperature, pressure vs time
       python -m engine convert RUN.h5 OUT    frames to extxyz, .traj or any ASE format
       python -m engine --help

Run molecular dynamics.  Keys may be written with or without a leading '+'
(model=lj and +model=lj are the same).  Example:

  python -m engine run model=lj steps=2000 integrator=langevin temperature=120

Keys (default, meaning):
"""


def _help() -> str:
    from .config import help_text

    return USAGE + help_text() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_help())
        return 0 if argv else 2
    cmd, args = argv[0], argv[1:]
    if any(a in ("-h", "--help") for a in args):
        sys.stdout.write(_help())
        return 0
    from .errors import UserError
    from .parallel import env_rank

    try:
        if cmd == "run":
            return _run(args)
        if cmd == "convert":
            if len(args) != 2:
                raise UserError("usage: python -m engine convert RUN.h5 OUT.extxyz|OUT.traj|any ASE format")
            from .inspect_files import convert

            print(convert(args[0], args[1]))
            return 0
        if cmd in ("info", "plot"):
            from . import inspect_files

            need = 1 if cmd == "info" else 2
            if len(args) != need:
                raise UserError(f"usage: python -m engine {cmd} FILE.h5" + (" OUT.png" if cmd == "plot" else ""))
            if cmd == "info":
                print(inspect_files.info(args[0]))
            else:
                print(f"wrote {inspect_files.plot(args[0], args[1])}")
            return 0
        raise UserError(f"unknown command {cmd!r}; use `python -m engine run key=value ...` "
                        "(see python -m engine --help)")
    except UserError as exc:
        if env_rank() == 0:  # every rank meets a configuration error alike: say it once
            sys.stderr.write(f"error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


def _run(args: list[str]) -> int:
    from .config import compose_config
    from .parallel import env_size, launch_self, under_launcher
    from .preflight import check_domains, check_outputs

    cfg = compose_config(args)
    check_outputs(cfg)
    explicit_domains = any(a.lstrip("+").startswith("domains=") for a in args)
    if not under_launcher():
        if cfg.domains > 1:
            check_domains(cfg, local=True)   # before starting any rank
            return launch_self(int(cfg.domains), ["run", *args])
        return _run_ranks(cfg)
    size = env_size()
    if explicit_domains and cfg.domains != size:
        from .errors import UserError

        raise UserError(f"domains={cfg.domains} but the launcher started {size} ranks; "
                        f"drop domains= or use mpiexec -n {cfg.domains}")
    cfg.domains = size
    return _run_ranks(cfg)


def _run_ranks(cfg) -> int:
    """Run on this process's rank; an error here ends every rank."""
    import traceback

    from shardmd.domain.comm import init_comm, shutdown

    from .errors import UserError
    from .simulation import Simulation

    if os.environ.get("SHARDMD_SELF_LAUNCHED"):
        from .parallel import watch_parent

        watch_parent()
    comm = init_comm(cfg.device) if cfg.domains > 1 else None
    code = 0
    try:
        sim = Simulation(cfg, comm=comm)
        sim.run()
        code = sim.exit_code
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
