"""Engine runs on the ranks of this MPI world: the CLI's ``run`` (or ``minimize``) without its launch.

Usage: mpiexec -n K python tests/mpi/engine_runs.py [minimize] key=value ...   (domains is K)
``run(comm, argv)`` composes the configuration from ``argv`` as ``python -m engine run`` does
and runs it on ``comm`` (tests/mpi/world.py runs it beside other tests' work in one world);
an argv starting with ``minimize`` relaxes as ``python -m engine minimize`` does. A non-zero
exit status of the run is an error. Give paths (output=, system.file=) absolute.
"""

from shardmd.engine.config.compose import compose_config
from shardmd.engine.run.simulation import Simulation


def run(comm, argv):
    if argv[:1] == ["minimize"]:
        from shardmd.engine.relax.minimize import minimize_run

        minimize_run(compose_config([*argv[1:], f"domains={comm.size}"]), comm=comm)
        return
    sim = Simulation(compose_config([*argv, f"domains={comm.size}"]), comm=comm)
    sim.run()
    if sim.exit_code != 0:
        raise SystemExit(f"rank {comm.rank}: run {' '.join(argv)} ended with exit status {sim.exit_code}")


if __name__ == "__main__":
    from launch import main

    main(run)
