"""Command line: ``python -m engine run key=value ...`` (also ``shardmd run ...``).

Bad input prints one line, ``error: <what is wrong and how to fix it>``, and exits with 2.
"""
from __future__ import annotations

import sys

USAGE = """\
usage: python -m engine run [key=value ...]
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

    try:
        if cmd == "run":
            return _run(args)
        raise UserError(f"unknown command {cmd!r}; use `python -m engine run key=value ...` "
                        "(see python -m engine --help)")
    except UserError as exc:
        sys.stderr.write(f"error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


def _run(args: list[str]) -> int:
    from .config import compose_config

    cfg = compose_config(args)
    from .simulation import Simulation

    sim = Simulation(cfg)
    sim.run()
    return 0
