"""Run several test scripts' work in ONE MPI world (one launch: each rank imports torch, Warp,
the engine once, ~4 s of CPU per rank, instead of once per script).

Usage: mpiexec -n K python tests/mpi/world.py TASKS.json
TASKS.json holds ``[[script, [argv...], done_file], ...]``: for each, in order,
``<script>.run(comm, argv)`` (a module of tests/mpi) runs on every rank; rank 0 then writes
``done_file`` (the task's seconds), so a test can tell its task finished even when a later
one failed. After the last task the world shuts down as lj_cases.py checks it must (gloo's
worker threads joined; a rank that finds them alive exits non-zero). An exception on any rank
ends the world (the launcher stops the others), as it ended the single-script launch before.

SHARDMD_TEST_DEVICE=cuda runs on the GPUs, as the scripts themselves do. conftest.py's
``mpi_world`` fixture builds TASKS.json from the tests pytest selected (their modules'
``world_tasks`` hooks).
"""
import importlib
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main():
    from lj_cases import check_gloo_shutdown

    from shardmd.domain.comm import init_comm

    tasks = json.loads(Path(sys.argv[1]).read_text())
    comm = init_comm(os.environ.get("SHARDMD_TEST_DEVICE", "cpu"))
    for script, argv, done in tasks:
        t0 = time.perf_counter()
        importlib.import_module(script).run(comm, list(argv))
        comm.barrier()
        if comm.is_root:   # the task's wall time, for a look at where a world's time goes
            Path(done).write_text(f"{time.perf_counter() - t0:.2f}\n")
    check_gloo_shutdown(comm)


if __name__ == "__main__":
    main()
