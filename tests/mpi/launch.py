"""The ``__main__`` of a tests/mpi script run alone under ``mpiexec`` (tests/mpi/world.py runs
several scripts' ``run`` in one launch instead): ``run(comm, argv)`` on the launcher's ranks,
then the comm's clean shutdown."""
from __future__ import annotations

import sys


def main(run) -> None:
    from shardmd.domain.comm import init_comm, shutdown

    comm = init_comm("cpu")
    run(comm, sys.argv[1:])
    shutdown(comm)
