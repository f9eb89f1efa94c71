"""Run a protocol: its stages one after another in one process group (docs/protocols.md).

Each stage is an ordinary run (or FIRE relaxation) of its own configuration with its own
outputs, ``X.<name>.h5`` and ``X.<name>.ckpt/`` for ``output=X.h5``. A stage starts from the
previous stage's final checkpoint, read back as a restart reads it, in an uninterrupted
protocol as after a kill, so that ``restart=auto`` reaches the same bits: a stage recorded as
finished in ``X.stages.csv`` is skipped, the stage that was running continues from its own
newest checkpoint (a relaxation, or a stage without one, starts again from the previous end).
Step numbers run on across stages (a stage's ``steps`` is its own length), as LAMMPS's do.
A temperature ramp ``[start, stop]`` sets the thermostat's target of step k to
``start + (k - b) / (e - b) (stop - start)`` for a stage from step b to e (LAMMPS's
``fix nvt temp start stop``).
"""
from __future__ import annotations

import copy
import csv
import os
from pathlib import Path

from omegaconf import open_dict

from shardmd.engine.errors import OutputError, UserError
from shardmd.engine.protocol.stages import Stage, build


def record_path(output: str) -> Path:
    p = Path(output)
    return p.with_name(p.stem + ".stages.csv")


def finished(output: str) -> dict[int, tuple[str, int, str]]:
    """{stage index: (name, end step, end checkpoint)} of the stages recorded as finished."""
    path = record_path(output)
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    rows = csv.reader(text[: text.rfind("\n") + 1].splitlines())
    return {int(r[0]): (r[1], int(r[2]), r[3]) for r in rows if len(r) == 4 and r[0].isdigit()}


def _record(output: str, st: Stage, end: int, checkpoint: str) -> None:
    try:
        with open(record_path(output), "a", encoding="utf-8") as fh:
            csv.writer(fh, lineterminator="\n").writerow([st.index, st.name, end, checkpoint])
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutputError(f"cannot record stage {st.name} in {str(record_path(output))!r}: "
                          f"{exc.strerror or exc}") from None


def _same_protocol(stages: list[Stage], done: dict, path: str) -> None:
    """restart=auto continues the recorded protocol: each finished stage must have the name it was
    recorded with and, for MD, the steps it ran; another protocol is a one-line error."""
    prev = 0
    for st in stages:
        if st.index not in done:
            return
        name, end, _ = done[st.index]
        if name != st.name:
            raise UserError(f"restart=auto: stages[{st.index}] is {st.name!r}, but {path!r} recorded {name!r} "
                            "there: another protocol; restore it, or add overwrite=true to run it again")
        if st.kind == "run" and end - prev != int(st.cfg.steps):
            raise UserError(f"restart=auto: stages[{st.index}] ({name}) has steps={int(st.cfg.steps)}, but it "
                            f"finished after {end - prev} ({path!r}); restore its steps, or add overwrite=true "
                            "to run the protocol again")
        prev = end


def _ramp(start: float, stop: float, begin: int, end: int):
    def schedule(integrator, step: int) -> None:
        frac = (step - begin) / (end - begin) if end > begin else 1.0
        getattr(integrator, "inner", integrator).temperature = start + frac * (stop - start)
    return schedule


def _end_state(checkpoint: str, dtype, device):
    from shardmd.engine.io.checkpoint import read_checkpoint
    from shardmd.engine.run.restart import state_from_checkpoint

    state, _ = state_from_checkpoint(read_checkpoint(checkpoint), dtype, device)
    return state


def _newest(output: str) -> str | None:
    from shardmd.engine.io.checkpoint import checkpoint_dir, newest_valid

    folder = checkpoint_dir(output)
    found = newest_valid(folder) if folder.is_dir() else None
    return None if found is None else str(found[0])


def _stage_config(st: Stage, begin: int, resume: bool):
    """The stage's configuration at step ``begin``: absolute step counts, its own output; under
    restart=auto it continues from its own checkpoint when it has one."""
    c = copy.deepcopy(st.cfg)
    going_on = resume and st.kind == "run" and _newest(st.output) is not None
    with open_dict(c):
        c.output = st.output
        if st.kind == "run":
            c.steps = begin + int(st.cfg.steps)
        else:
            c.minimize.steps = begin + int(st.cfg.minimize.steps)
            c.minimize.structure = None
        c.restart.file = "auto" if going_on else None
        c.overwrite = bool(c.overwrite or resume)   # a stage that starts again replaces its own outputs
    return c, going_on


def run_stages(cfg, comm, command: str = "run") -> int:
    """Every stage of ``cfg.stages`` in order (collective); the exit status of the last run."""
    from shardmd.engine.run import stages as run_stages_mod
    from shardmd.engine.run.preflight import refuse_earlier_log
    from shardmd.engine.run.reporting import Reporter

    if command != "run":
        raise UserError("a protocol (stages=...) runs with python -m engine run; its stages say which relax")
    if cfg.restart.file not in (None, "auto"):
        raise UserError(f"restart={cfg.restart.file}: a protocol continues with restart=auto (each stage from its "
                        "own checkpoints); drop the path")
    stages = build(cfg)
    resume = cfg.restart.file == "auto"
    done = finished(str(cfg.output)) if resume else {}
    _same_protocol(stages, done, str(record_path(str(cfg.output))))
    if not resume and not cfg.overwrite and record_path(str(cfg.output)).exists():
        raise UserError(f"{str(record_path(str(cfg.output)))!r} records an earlier protocol with this output; "
                        "continue it with restart=auto, or add overwrite=true to start again")
    refuse_earlier_log(Path(str(cfg.output)).with_suffix(".log"), resume, bool(cfg.overwrite))
    if comm is not None:
        comm.barrier()   # every rank looked before rank 0 opens the log
    if not resume and (comm is None or comm.is_root):
        record_path(str(cfg.output)).unlink(missing_ok=True)
    dtype = run_stages_mod.DTYPES[cfg.precision]
    log = Reporter(Path(str(cfg.output)).with_suffix(".log") if comm is None or comm.is_root else None,
                   quiet=cfg.quiet, progress=False, enabled=comm is None or comm.is_root,
                   log_mode="a" if resume else "w")
    log.line(f"protocol: {len(stages)} stages ({', '.join(f'{s.name} ({s.kind})' for s in stages)}), "
             f"{len(done)} finished before")
    end, checkpoint, code = 0, None, 0
    for st in stages:
        if st.index in done:
            _, end, checkpoint = done[st.index]
            continue
        c, going_on = _stage_config(st, end, resume)
        state = None
        if checkpoint is not None and not going_on:
            state = _end_state(checkpoint, dtype, run_stages_mod.device_of(c, comm) if comm else "cpu")
        log.line(f"stage {st.index} {st.name} ({st.kind}) from step {end}: output {st.output}"
                 + (", continuing from its checkpoint" if going_on else ""))
        end, code = _run_stage(st, c, state, comm)
        if code:
            log.line(f"stage {st.name} stopped at step {end} (exit status {code}); continue with restart=auto")
            log.close()
            return code
        checkpoint = _newest(st.output)
        if comm is None or comm.is_root:
            _record(str(cfg.output), st, end, checkpoint)
        if comm is not None:
            comm.barrier()
        log.line(f"stage {st.index} {st.name} finished at step {end}")
    log.close()
    return code


def _run_stage(st: Stage, c, state, comm) -> tuple[int, int]:
    """(end step, exit status) of one stage; its final checkpoint written."""
    from shardmd.engine.relax.minimize import minimize_cfg, minimizer, structure_path
    from shardmd.engine.run.simulation import Simulation

    if st.kind == "minimize":
        c = minimize_cfg(c)
        sim = Simulation(c, state=state, comm=comm)
        m = c.minimize
        # its run ends with a checkpoint of the relaxed state, where the next stage starts
        minimizer(sim, m).run(fmax=float(m.fmax), steps=int(m.steps), structure=structure_path(c))
        return sim.state.step, 0
    sim = Simulation(c, state=state, comm=comm)
    if st.ramp is not None:
        begin = int(c.steps) - int(st.cfg.steps)   # the stage's first step, also when it continues
        sim.schedule = _ramp(st.ramp[0], st.ramp[1], begin, int(c.steps))
    try:
        sim.run()
    finally:
        sim.close()
    return sim.state.step, sim.exit_code
