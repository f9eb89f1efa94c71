"""Many systems from Python: lists of ``ase.Atoms`` in, the same list with results out.

    from shardmd.engine.batch.api import relax_many, run_many
    relaxed = relax_many(candidates, "model=mace", "minimize.fmax=0.02", "output=relax/r.h5")
    final = run_many(structures, "model=mace", "integrator=langevin", "steps=2000", "output=md/m.h5")

The arguments after the structures are the command line's keys (``python -m engine run``); each
structure runs as the frame of that index would with ``system.frames`` (docs/batch.md), and
the files are the same: ``X.<i>.h5``, ``X.<i>.extxyz`` (relaxed), ``X.summary.csv``.
Returned: in the input's order, a copy of each structure at its end (positions, cell, and for
MD velocities) with a single-point calculator holding its energy and forces (eV, eV/Å), and
``atoms.info["shardmd"]`` its summary row (status, steps, converged, output, note); None in
place of a structure that failed or was left out (``system.skip_bad=true``).
"""
from __future__ import annotations

from dataclasses import asdict

from shardmd.engine.errors import UserError


def _many(structures, overrides, command: str):
    from ase import Atoms
    from omegaconf import open_dict

    from shardmd.engine.batch import journal
    from shardmd.engine.batch.run import batch_run
    from shardmd.engine.config.compose import compose_config

    structures = list(structures)
    if not structures or not all(isinstance(a, Atoms) for a in structures):
        raise UserError(f"{command}_many takes a non-empty list of ase.Atoms")
    cfg = compose_config([str(o) for o in overrides])
    if cfg.system.get("file") or cfg.restart.file is not None:
        raise UserError(f"{command}_many runs the structures it is given: drop system.file= and restart= "
                        "(python -m engine with system.frames continues a stopped run)")
    if command == "run" and int(cfg.trajectory.every) <= 0:
        raise UserError("run_many reads each system's end from its trajectory: give trajectory.every > 0")
    with open_dict(cfg):
        cfg.system.frames = "all"
    batch_run(cfg, None, command, structures=structures)
    rows = journal.finished(str(cfg.output))
    width = len(str(len(structures) - 1))
    return [_result(rows.get(k), command, str(cfg.output), k, width) for k in range(len(structures))]


def _result(row, command: str, output: str, k: int, width: int):
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.io import read

    from shardmd.engine.batch import journal

    if row is None or row.status != "ok":
        return None
    if command == "minimize":
        path = journal.system_output(output, k, width).rsplit(".", 1)[0] + ".extxyz"
        atoms = read(path)
    else:
        atoms = read(journal.system_output(output, k, width), index=-1)
    results = {"energy": row.energy_eV}
    if atoms.calc is not None and "forces" in atoms.calc.results:
        results["forces"] = atoms.calc.results["forces"]
    atoms.calc = SinglePointCalculator(atoms, **results)
    atoms.info["shardmd"] = asdict(row)
    return atoms


def run_many(structures, *overrides: str):
    """MD of every structure (the keys of ``python -m engine run``; ``trajectory.every`` must
    be > 0: the end state is read from each trajectory)."""
    return _many(structures, overrides, "run")


def relax_many(structures, *overrides: str):
    """FIRE relaxation of every structure (the keys of ``python -m engine minimize``)."""
    return _many(structures, overrides, "minimize")
