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


def record_info(path: str) -> str | None:
    """``python -m engine info X.h5`` where ``X.h5`` is not a file but the output of a protocol
    (``X.stages.csv``) or of many systems (``X.summary.csv``, ``X.systems/``): what they hold;
    None when there is neither."""
    import os

    from shardmd.engine.batch import journal
    from shardmd.engine.protocol.run import finished, record_path
    from shardmd.engine.protocol.stages import stage_output

    if os.path.exists(path):
        return None
    if record_path(path).exists():
        done = finished(path)
        lines = [f"protocol {path}: {len(done)} stage(s) finished (record {record_path(path)})"]
        lines += [f"  stage {k} {name}: finished at step {end}; output {stage_output(path, name)}"
                  for k, (name, end, _) in sorted(done.items())]
        return "\n".join(lines)
    rows = journal.finished(path)
    summary = journal.summary_path(path)
    if not rows and not summary.exists():
        return None
    if summary.exists():
        import csv

        with open(summary, encoding="utf-8") as fh:
            statuses = [r["status"] for r in csv.DictReader(fh)]
        where = f"summary {summary}"
    else:
        statuses = [r.status for r in rows.values()]
        where = f"record {journal.folder(path)} (no summary yet: running or stopped)"
    counts = {s: statuses.count(s) for s in ("ok", "failed", "stopped", "skipped") if statuses.count(s)}
    return (f"many systems {path}: {len(statuses)} system(s), " + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f"; {where}; each system's file: {journal.system_output(path, 0, 1).replace('.0.', '.<i>.')}")
