"""Test-only seam: the engine's CLI with ``Simulation.step`` raising on one rank at one step.

    mpiexec -n 3 python tests/helpers/inject_failure.py RANK:STEP run model=lj ...

The engine itself carries no fault-injection hook; this wrapper replaces the step method in
this process only (each MPI rank runs it), so what follows the exception is the engine's
real error path.
"""
import sys

from shardmd.engine.cli.main import main
from shardmd.engine.run import simulation

RANK, STEP = (int(v) for v in sys.argv[1].split(":"))
_step = simulation.Simulation.step


def _failing_step(self):
    if (self.comm.rank, self.state.step) == (RANK, STEP):
        raise RuntimeError(f"injected failure at step {STEP}")
    return _step(self)


simulation.Simulation.step = _failing_step
sys.exit(main(sys.argv[2:]))
