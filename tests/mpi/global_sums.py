"""NVE dynamics of the charge-equilibration model (tests/qeq_model.py) on K domains, with
finite differences of the K-domain energy and direct checks of the collectives' backward.

Usage: mpiexec -n K python tests/mpi/global_sums.py OUT_DIR STEPS
(``run(comm, argv)`` also runs in-process on one domain).  Three wrappings of the model:
``qeq`` (energy summed over ranks by the model, forces by DistributedModel), ``qeq_partial``
(energy a per-rank partial listed in ``all_reduce_outputs``) and ``qeq_self`` (the model
differentiates itself, seeding the replicated energy with ``seed_once``).  Rank 0 writes
OUT_DIR/<name>.npz: per checkpoint (every 10 steps) the wrapped positions, forces, per-point
energies, charges and energy in id order; the energy per step; migrations; rebuilds; finite
differences of the K-domain energy along a few coordinates and the forces there; and
OUT_DIR/collectives.json with the backward checks.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import qeq_model as Q  # noqa: E402
from launch import main  # noqa: E402
from md_loop import nve  # noqa: E402

from shardmd.domain.api import (  # noqa: E402
    ModelConfig,
    NeighborConfig,
    all_reduce_sum,
    autograd_target,
    seed_once,
    to_local,
)
from shardmd.domain.collectives import seed_once as seed_once_on  # noqa: E402

F64 = torch.float64
TEMPERATURE = 1200.0
DT = 2.0
CHECK_EVERY = 10
FD_PROBES = ((5, 0), (77, 1), (130, 2), (201, 0))   # (id, axis)
FD_STEP = 1e-4


class PartialEnergyQEq(Q.QEqModel):
    """The same model returning this rank's partial energy (owned rows), summed over ranks by
    DistributedModel (``all_reduce_outputs``): the global values inside are reused all the same."""

    def __init__(self):
        super().__init__(Q.SPEC_QEQ.replace(name="qeq-partial", all_reduce_outputs={"energy"}))

    def compute(self, positions, cell, pbc, numbers, nl):
        out = super().compute(positions, cell, pbc, numbers, nl)
        out["energy"] = to_local(out["energies"]).sum().reshape(1)
        return out


class SelfForceQEq(Q.QEqModel):
    """The same model computing its forces itself: the energy (identical on every rank) is the
    objective, seeded once with ``seed_once``; ghost rows of the derivative are partial sums."""

    def __init__(self):
        super().__init__(Q.SPEC_QEQ.replace(name="qeq-self", reverse_outputs={"forces"},
                                            owned_only_outputs={"energies", "charges"}))
        self.model_config = ModelConfig(outputs=("energy", "energies", "charges", "forces"),
                                        neighbors=NeighborConfig(Q.CUTOFF), autograd_inputs={"positions"})

    def compute(self, positions, cell, pbc, numbers, nl):
        out = super().compute(positions, cell, pbc, numbers, nl)
        (g,) = torch.autograd.grad(seed_once(out["energy"].sum()), autograd_target(positions))
        return {"energy": out["energy"].detach(), "energies": out["energies"].detach(),
                "charges": out["charges"].detach(), "forces": -g}


MODELS = {"qeq": Q.QEqModel, "qeq_partial": PartialEnergyQEq, "qeq_self": SelfForceQEq}


def initial_atoms():
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    atoms = Q.sample()
    MaxwellBoltzmannDistribution(atoms, temperature_K=TEMPERATURE, rng=np.random.default_rng(5))
    Stationary(atoms)
    return atoms


def _gathered(comm, dec, state, out) -> dict | None:
    extra = {"energies": out["energies"], "charges": out["charges"]}
    full = dec.gather(state, ("positions", "forces"), extra=extra)
    if full is None:
        return None
    return {k: np.asarray(full[k]) for k in ("positions", "forces", "energies", "charges")}


def _finite_differences(comm, dm, dec, state) -> tuple[list, list]:
    """Central differences of the K-domain energy along FD_PROBES, and the forces there."""
    fd, forces = [], []
    out = dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)
    for gid, axis in FD_PROBES:
        rows = torch.nonzero(state.ids == gid).flatten()
        f = float(out["forces"][rows[0], axis]) if rows.numel() else 0.0
        forces.append(float(comm.all_reduce(torch.tensor([f], dtype=F64))[0]))
        e = []
        for h in (FD_STEP, -FD_STEP):
            if rows.numel():
                state.positions[rows[0], axis] += h
            dec.refresh(state)
            e.append(float(dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)["energy"]))
            if rows.numel():
                state.positions[rows[0], axis] -= h
        dec.refresh(state)
        fd.append(-(e[0] - e[1]) / (2 * FD_STEP))
    return fd, forces


def run_md(comm, name: str, steps: int) -> dict | None:
    run, dm = nve(comm, MODELS[name](), initial_atoms(), Q.CUTOFF, steps, DT, every=CHECK_EVERY,
                  callback=lambda state, dec, out: _gathered(comm, dec, state, out))
    state, dec, energies, rebuilds, frames = run.state, run.dec, run.energies, run.rebuilds, run.seen
    fd, f_at = _finite_differences(comm, dm, dec, state)
    migrated = dec.migrated()
    if comm.rank != 0:
        return None
    res = {key: np.stack([fr[key] for fr in frames]) for key in frames[0]}
    res.update(energy=np.array(energies), migrated=migrated, rebuilds=rebuilds, grid=np.array(dec.grid.shape),
               cell=state.cell.numpy(), numbers=Q.sample().numbers, fd=np.array(fd), fd_forces=np.array(f_at),
               fd_probes=np.array(FD_PROBES))
    return res


def collective_checks(comm) -> dict:
    """The backward of all_reduce_sum against the derivative worked out by hand: every rank
    holds x_r (3 values), y = sum_r x_r, rank r's objective E_r = w_r . y^2 (a global value
    reused nonlinearly), E = sum_r E_r; dE/dx_r = 2 y * sum_s w_s on every rank."""
    r, k = comm.rank, comm.size
    x = torch.tensor([1.0 + r, 0.5 - r, 0.25 * r], dtype=F64, requires_grad=True)
    w = lambda s: torch.tensor([1.0 + s, 2.0, -0.5 * s], dtype=F64)  # noqa: E731
    y = all_reduce_sum(comm, x)
    (g,) = torch.autograd.grad((w(r) * y * y).sum(), x)
    y_ref = sum(torch.tensor([1.0 + s, 0.5 - s, 0.25 * s], dtype=F64) for s in range(k))
    want = 2 * y_ref * sum(w(s) for s in range(k))
    err = float((g - want).abs().max())
    # a replicated objective: seed_once makes d(sum y)/dx_r = 1, not k
    y2 = all_reduce_sum(comm, x)
    (g2,) = torch.autograd.grad(seed_once_on(comm, y2).sum(), x)
    err2 = float((g2 - 1.0).abs().max())
    worst = comm.all_reduce(torch.tensor([err, err2], dtype=F64), "max")
    return {"reused_global_value": float(worst[0]), "seed_once": float(worst[1])}


def run(comm, argv):
    out, steps = Path(argv[0]), int(argv[1])
    names = argv[2:] or list(MODELS)
    checks = collective_checks(comm)
    for name in names:
        res = run_md(comm, name, steps)
        if res is not None:
            np.savez(out / f"{name}.npz", **res)
    if comm.rank == 0:
        (out / "collectives.json").write_text(json.dumps(checks))


if __name__ == "__main__":
    main(run)
