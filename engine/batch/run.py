"""Run many independent systems (``system.frames``): MD (``python -m engine run``) or relaxation
(``python -m engine minimize``) of every selected frame of ``system.file``.

Each system is an ordinary one-rank :class:`~shardmd.engine.run.simulation.Simulation` of the
run's configuration with ``system.index`` set to its frame, sharing the model built once: so
a system's trajectory is the one ``system.index=i`` gives alone (the same code, and random
numbers keyed by the frame: :func:`shardmd.integrators.random.frame_seed`), every integrator
works, and each system's file, checkpoints and bit-exact restart are a normal run's. Under
several ranks (``domains=N`` or mpirun) rank r takes every N-th system; no halo joins them, so
the files do not depend on the rank count. docs/batch.md says what is not batched yet.

Outputs for ``output=X.h5``: ``X.<i>.h5`` per system (i its frame index, zero-padded to the
width of the file's last index), ``X.<i>.extxyz`` per relaxed system, ``X.summary.csv``, and
``X.systems/`` (the record of finished systems that ``restart=auto`` continues from).
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
from omegaconf import open_dict

from shardmd.domain.comm import Comm
from shardmd.engine.batch import journal
from shardmd.engine.batch.frames import checked, frame_count, load_frames, read_files
from shardmd.engine.config.checks import parse_frames
from shardmd.engine.errors import UserError
from shardmd.engine.launch.stop import EXIT_STOPPED
from shardmd.engine.run import stages
from shardmd.engine.run.preflight import refuse_earlier_log
from shardmd.engine.run.reporting import Reporter
from shardmd.engine.run.state import State
from shardmd.integrators.random import frame_seed


def system_config(cfg, index: int, width: int, command: str, resume: bool = False):
    """The configuration of frame ``index`` run alone (what ``system.index=index`` gives);
    ``resume``: a system that was running when the run stopped continues from its own newest
    checkpoint, or (a relaxation, or one without a checkpoint) starts again over its own outputs."""
    c = copy.deepcopy(cfg)
    output = journal.system_output(str(cfg.output), index, width)
    with open_dict(c):
        if not c.system.get("file"):   # structures given in Python or system.files: the index keys the seed here
            c.seed = frame_seed(int(cfg.seed), index)
        if resume and (command == "minimize" or not _has_checkpoint(output)):
            c.restart.file, c.overwrite = None, True   # it starts again, over its own outputs
        c.system.index = index
        c.system.frames, c.system.files = None, []
        c.domains = 1
        c.output = output
        # stepped with others (engine/batch/lockstep.py): no rollback may replay one system alone
        c.neighbor.deferred, c.neighbor.pipelined = False, False
        if command == "minimize":
            c.minimize.structure = None   # beside its own output: X.<i>.extxyz
    return c


class _Log:
    """The run's log (every line) and terminal (every line up to 50 systems, else about every
    fiftieth and the last: 10,000 relaxations print 50 lines of progress, not 10,000)."""

    def __init__(self, path, quiet: bool, enabled: bool, resume: bool):
        self.file = Reporter(path, quiet=True, progress=False, enabled=enabled, log_mode="a" if resume else "w")
        self.term = Reporter(None, quiet=quiet, progress=False, enabled=enabled)
        self.count = 0

    def line(self, total, text: str | None = None) -> None:
        """``line(text)``, or ``line(total, text)`` for one of ``total`` systems finishing."""
        if text is None:
            total, text = None, total
        self.file.line(text)
        if total is not None:
            self.count += 1
        if total is None or total <= 50 or self.count % max(total // 50, 1) == 0 or self.count == total:
            self.term.line(text)

    def close(self) -> None:
        self.file.close()
        self.term.close()


def _has_checkpoint(output: str) -> bool:
    from shardmd.engine.io.checkpoint import checkpoint_dir, newest_valid

    folder = checkpoint_dir(output)
    return folder.is_dir() and newest_valid(folder) is not None


def _silent() -> Reporter:
    return Reporter(None, quiet=True, progress=False, enabled=False)


def _one(cfg_i, atoms, dmodel, command: str, resume: bool) -> tuple[journal.Row, int]:
    """Run one system: (its row of the summary, its exit status); an error of this system is
    its row's note, and the other systems run on."""
    from shardmd.engine.relax.minimize import minimize_cfg, minimizer, structure_path
    from shardmd.engine.run.simulation import Simulation

    k, n = int(cfg_i.system.index), len(atoms)
    try:
        if command == "minimize":
            cfg_i = minimize_cfg(cfg_i)
            state = State.from_atoms(atoms, dtype=stages.DTYPES[cfg_i.precision])
            sim = Simulation(cfg_i, state=state, model=dmodel, reporter=_silent(), comm=Comm())
            m = cfg_i.minimize
            res = minimizer(sim, m).run(fmax=float(m.fmax), steps=int(m.steps), structure=structure_path(cfg_i))
            return journal.Row(k, n, "ok", energy_eV=float(res["energy"]), volume_A3=_volume(sim),
                               steps=int(res["steps"]), converged=bool(res["converged"]),
                               fmax_eV_per_A=float(res["fmax"]), output=str(cfg_i.output)), 0
        # a system that was running when the run stopped continues from its own checkpoint
        state = None if cfg_i.restart.file else State.from_atoms(atoms, dtype=stages.DTYPES[cfg_i.precision])
        sim = Simulation(cfg_i, state=state, model=dmodel, reporter=_silent(), comm=Comm())
        try:
            obs = sim.run()
        finally:
            sim.close()
        code = sim.exit_code
        if code:
            return journal.Row(k, n, "stopped", steps=int(sim.state.step), output=str(cfg_i.output),
                               note=f"stopped at step {sim.state.step}"), code
        return journal.Row(k, n, "ok", energy_eV=float(obs["potential_energy"]), volume_A3=_volume(sim),
                           steps=int(sim.state.step), output=str(cfg_i.output)), 0
    except UserError as exc:
        return journal.Row(k, n, "failed", output=str(cfg_i.output),
                           note=f"exit status {exc.exit_code}: {exc.one_line()}"), exc.exit_code


def _room(cfg, device, dmodel):
    """``batch.size``: a count; auto: 1 on the CPU (one call per system is faster there), on
    CUDA the systems that fill the device's free memory (engine/batch/room.py)."""
    from shardmd.engine.batch.room import FILL, Room, system_bytes
    from shardmd.engine.run.preflight import ATOM_BYTES, EDGE_BYTES, LEARNED_EDGE_BYTES, memory_budget

    if cfg.batch.size != "auto":
        return Room(count=int(cfg.batch.size))
    budget = memory_budget(cfg, device) if device.type == "cuda" else None
    if budget is None:
        return Room(count=1)
    radius = float(dmodel.cutoff) + float(cfg.neighbor.skin)
    per_edge = float(getattr(dmodel.model, "bytes_per_edge", None)
                     or EDGE_BYTES.get(str(cfg.model.name), LEARNED_EDGE_BYTES))

    def cost(atoms) -> float:
        volume = abs(float(atoms.cell.volume)) if all(atoms.pbc) else None
        return system_bytes(len(atoms), volume, radius, per_edge, ATOM_BYTES)

    return Room(budget=FILL * budget[0], cost=cost)


def _atoms_of_output(output: str) -> int | None:
    """Atoms in a system's trajectory (a system that was running when the run stopped), or None."""
    import h5py

    try:
        with h5py.File(output, "r") as f:
            return int(f["particles/all/position/value"].shape[1])
    except Exception:  # noqa: BLE001 - no file, or one without a frame: nothing to compare
        return None


def _same_systems(cfg, good, path: str, width: int) -> None:
    """restart=auto continues the systems of the record: each frame must have the atom count its
    finished row (or its running system's trajectory) holds; another input is a one-line error."""
    rows = journal.finished(str(cfg.output))
    for k, atoms in good:
        recorded = str(rows[k].atoms) if k in rows else ""
        had = int(recorded) if recorded.isdigit() and int(recorded) else \
            _atoms_of_output(journal.system_output(str(cfg.output), k, width))
        if had is not None and had != len(atoms):
            raise UserError(f"restart=auto: system {k} of {path!r} has {len(atoms)} atoms, but the run recorded in "
                            f"{str(journal.folder(str(cfg.output)))!r} ran {had}: another input; give the same "
                            "input, or add overwrite=true to start again")


def _together(cfg, todo, width: int, dmodel, resume: bool, finished, room, device) -> int:
    """MD of ``todo`` with up to ``batch.size`` systems per model call (engine/batch/lockstep.py)."""
    from shardmd.engine.batch.lockstep import run_together
    from shardmd.engine.run.simulation import Simulation

    outputs = {}

    def start(k, atoms):
        cfg_i = system_config(cfg, k, width, "run", resume)
        outputs[k] = str(cfg_i.output)
        state = None if cfg_i.restart.file else State.from_atoms(atoms, dtype=stages.DTYPES[cfg_i.precision])
        return Simulation(cfg_i, state=state, model=dmodel, reporter=_silent(), comm=Comm())

    def on_end(k, sim, obs):
        finished(journal.Row(k, sim.n_global, "ok", energy_eV=float(obs["potential_energy"]), volume_A3=_volume(sim),
                             steps=int(sim.state.step), output=outputs[k]), 0)

    def on_error(k, sim, exc):
        atoms = sim.n_global if sim is not None else next(len(a) for j, a in todo if j == k)
        finished(journal.Row(k, atoms, "failed", output=outputs.get(k, ""),
                             note=f"exit status {exc.exit_code}: {exc.one_line()}"), exc.exit_code)

    def on_stop(k, sim):
        finished(journal.Row(k, sim.n_global, "stopped", steps=int(sim.state.step), output=outputs[k],
                             note=f"stopped at step {sim.state.step}; continue with restart=auto"), EXIT_STOPPED)

    peak = None
    if device.type == "cuda":
        import torch

        peak = (lambda: torch.cuda.reset_peak_memory_stats(device), lambda: torch.cuda.max_memory_allocated(device))
    return run_together(iter(todo), start, room, dmodel.model, on_end, on_error, on_stop, peak)


def _relaxed_together(cfg, todo, width: int, dmodel, resume: bool, finished, room) -> None:
    """FIRE relaxations of ``todo`` with up to ``batch.size`` systems per model call
    (engine/batch/relax_lockstep.py); each system's files and row as :func:`_one` makes them."""
    from shardmd.engine.batch.relax_lockstep import relax_together
    from shardmd.engine.relax.minimize import minimize_cfg, minimizer, structure_path
    from shardmd.engine.run.simulation import Simulation

    outputs = {}

    def start(k, atoms):
        cfg_i = minimize_cfg(system_config(cfg, k, width, "minimize", resume))
        outputs[k] = str(cfg_i.output)
        state = State.from_atoms(atoms, dtype=stages.DTYPES[cfg_i.precision])
        sim = Simulation(cfg_i, state=state, model=dmodel, reporter=_silent(), comm=Comm())
        m = cfg_i.minimize
        return minimizer(sim, m), structure_path(cfg_i), float(m.fmax), int(m.steps)

    def on_end(k, sim, res):
        finished(journal.Row(k, sim.n_global, "ok", energy_eV=float(res["energy"]), volume_A3=_volume(sim),
                             steps=int(res["steps"]), converged=bool(res["converged"]),
                             fmax_eV_per_A=float(res["fmax"]), output=outputs[k]), 0)

    def on_error(k, sim, exc):
        atoms = sim.n_global if sim is not None else next(len(a) for j, a in todo if j == k)
        finished(journal.Row(k, atoms, "failed", output=outputs.get(k, ""),
                             note=f"exit status {exc.exit_code}: {exc.one_line()}"), exc.exit_code)

    relax_together(iter(todo), start, room, dmodel.model, on_end, on_error)


def _too_large(cfg, todo, dmodel, device) -> dict:
    """{index: why} of the systems whose estimate in one piece exceeds the memory budget
    (engine/run/preflight.py's), for a model that can be called in parts: each of them runs
    alone with ``subdomains=0`` (the fewest parts that fit) instead of failing."""
    from shardmd.engine.batch.room import system_bytes
    from shardmd.engine.run.preflight import ATOM_BYTES, EDGE_BYTES, GIB, LEARNED_EDGE_BYTES, memory_budget

    if not getattr(dmodel.model, "counts_rows", False) or int(cfg.get("subdomains", 1)) != 1:
        return {}
    budget = memory_budget(cfg, device)
    if budget is None:
        return {}
    radius = float(dmodel.cutoff) + float(cfg.neighbor.skin)
    per_edge = float(getattr(dmodel.model, "bytes_per_edge", None)
                     or EDGE_BYTES.get(str(cfg.model.name), LEARNED_EDGE_BYTES))
    out = {}
    for k, atoms in todo:
        volume = abs(float(atoms.cell.volume)) if all(atoms.pbc) else None
        need = system_bytes(len(atoms), volume, radius, per_edge, ATOM_BYTES)
        if need > budget[0]:
            out[k] = f"~{need / GIB:.3g} GiB in one piece, more than {budget[0] / GIB:.3g} GiB ({budget[1]})"
    return out


def _volume(sim) -> float | str:
    return float(sim.state.volume()) if bool(sim.state.pbc.all()) else ""


def batch_run(cfg, comm: Comm | None, command: str = "run", structures=None) -> int:
    """Every selected frame of ``system.file`` (or every ``ase.Atoms`` of ``structures``, the
    Python API: engine/batch/api.py) as its own system; this rank's share; the summary on rank
    0. Exit status 0 when every system ran (a relaxation that did not converge counts as ran),
    else the first failed system's."""
    comm = comm or Comm()
    if structures is None and cfg.system.get("files"):
        if cfg.system.get("file"):
            raise UserError("system.file and system.files are both given; give one (system.files takes a list)")
        structures = read_files(cfg.system.files)
    if structures is None and not cfg.system.get("file"):
        raise UserError("system.frames needs system.file (or system.files): give the structure file to select "
                        "frames from")
    path = str(cfg.system.file) if structures is None else "system.files" if cfg.system.get("files") else \
        "the structures given"
    if int(cfg.system.get("index", -1)) != -1:   # each system's index is its frame's: the key would be ignored
        raise UserError(f"system.index={cfg.system.index} picks one frame, system.frames/files run many; give one of "
                        "them (system.frames=I:I+1 runs frame I alone)")
    if cfg.restart.file not in (None, "auto"):
        raise UserError(f"restart={cfg.restart.file}: a many-system run continues with restart=auto (each system "
                        "from its own checkpoint); drop the path")
    resume = cfg.restart.file == "auto"
    # done: relaxed (converged or not), or ran to ``steps`` (a larger ``steps`` continues them)
    done = {k: r for k, r in (journal.finished(str(cfg.output)) if resume else {}).items()
            if r.status == "ok" and (command == "minimize" or int(r.steps) >= int(cfg.steps))}
    if not resume and not cfg.overwrite and journal.folder(str(cfg.output)).exists():
        raise UserError(f"{str(journal.folder(str(cfg.output)))!r} holds the record of an earlier many-system run "
                        "with this output; continue it with restart=auto, or add overwrite=true to start again")
    log_path = cfg.output.rsplit(".", 1)[0] + ".log"
    refuse_earlier_log(Path(log_path), resume, bool(cfg.overwrite))
    dtype = stages.DTYPES[cfg.precision]
    device = stages.device_of(cfg, comm)
    dmodel, _ = stages.the_model(cfg, None, dtype, device)
    checks = (dmodel.model, float(cfg.health.min_distance), bool(cfg.system.skip_bad))
    if structures is None:
        good, bad = load_frames(path, cfg.system.frames, *checks)
    else:
        picked = list(range(len(structures)))[parse_frames(cfg.system.frames or "all")]
        if not picked:
            raise UserError(f"system.frames={cfg.system.frames} selects none of the {len(structures)} structures")
        good, bad = checked(((k, structures[k]) for k in picked), path, *checks)
    width = len(str(max((frame_count(path) if structures is None else len(structures)) - 1, 0)))
    if resume:
        _same_systems(cfg, good, path, width)
    if cfg.overwrite and not resume and comm.is_root:
        for p in journal.folder(str(cfg.output)).glob("done.*.csv"):
            p.unlink()
    comm.barrier()
    log = _Log(log_path if comm.is_root else None, cfg.quiet, comm.is_root, resume)
    mine = [(k, a) for j, (k, a) in enumerate(good) if j % comm.size == comm.rank]
    todo = [(k, a) for k, a in mine if k not in done]
    log.line(f"{command}: {len(good)} systems of {path!r} ({len(bad)} bad frame(s) left out), "
             f"{len(done)} done before, {comm.size} rank(s); outputs {journal.system_output(str(cfg.output), 0, width)}"
             f" ... and {journal.summary_path(str(cfg.output))}")
    record = journal.Journal(str(cfg.output), comm.rank)
    t0, codes = time.perf_counter(), []

    def finished(row: journal.Row, status: int) -> None:
        record.add(row)
        codes.append(status)
        log.line(len(todo), f"[{len(done) + len(codes)} done, {len(todo) - len(codes)} left on rank {comm.rank}, "
                 f"{time.perf_counter() - t0:.1f} s] system {row.system}: {row.status}"
                 + (f", {row.steps} steps, energy {row.energy_eV:.10g} eV" if row.status == "ok" else f" ({row.note})"))

    room = _room(cfg, device, dmodel)
    large = _too_large(cfg, todo, dmodel, device)
    for k in large:
        log.line(f"system {k}: {large[k]}; it runs alone, its model call in parts (subdomains=0)")
    batch, alone = [(k, a) for k, a in todo if k not in large], [(k, a) for k, a in todo if k in large]
    joinable = hasattr(dmodel.model, "compute_batch") and (room.count or 2) > 1
    together = joinable and (command == "run" or (command == "minimize" and cfg.minimize.method == "fire"))
    if together and command == "run":
        _together(cfg, batch, width, dmodel, resume, finished, room, device)
    elif together:   # FIRE's steps of many systems in one model call each
        _relaxed_together(cfg, batch, width, dmodel, resume, finished, room)
    for k, atoms in ([] if together else batch) + alone:
        cfg_k = system_config(cfg, k, width, command, resume)
        if k in large:
            with open_dict(cfg_k):
                cfg_k.subdomains = 0
        finished(*_one(cfg_k, atoms, dmodel, command, resume))
        if codes[-1] == EXIT_STOPPED:   # a signal stops the run, not only the system it reached
            log.line("stopped by a signal; continue with restart=auto")
            break
    code = next((c for c in codes if c), 0)
    comm.barrier()   # every rank's record is complete (the ranks share the output folder, as for the files)
    if comm.is_root:
        every = journal.finished(str(cfg.output))
        for b in bad:
            every.setdefault(b.index, journal.Row(b.index, 0, "skipped", note=b.reason))
        summary = journal.write_summary(str(cfg.output), list(every.values()))
        ok = sum(r.status == "ok" for r in every.values())
        log.line(f"{ok} of {len(every)} systems ran; summary {str(summary)!r}")
    log.close()
    code = max(comm.all_reduce(torch.tensor([code])).tolist()) if comm.size > 1 else code
    sys.stdout.flush()
    return int(code)
