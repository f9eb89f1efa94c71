"""What ``python -m engine run|minimize`` runs on a rank: a protocol of stages
(engine/protocol/), many systems (engine/batch/), a relaxation or a run."""
from __future__ import annotations

from shardmd.engine.batch.frames import many_systems


def run_command(cfg, comm, command: str = "run") -> int:
    """``python -m engine run|minimize`` on this rank (``comm``: the job's Comm, or None): its exit status."""
    if cfg.get("stages"):
        from shardmd.engine.protocol.run import run_stages

        return run_stages(cfg, comm, command)
    if many_systems(cfg):
        from shardmd.engine.batch.run import batch_run

        return batch_run(cfg, comm, command)
    if command == "minimize":
        from shardmd.engine.relax.minimize import minimize_run

        return minimize_run(cfg, comm=comm)
    from shardmd.engine.run.simulation import Simulation

    sim = Simulation(cfg, comm=comm)
    sim.run()
    return sim.exit_code
