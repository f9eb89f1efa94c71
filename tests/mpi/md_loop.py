"""The NVE loop the K-domain model scripts share (tests/mpi/shard_md.py, tests/mpi/global_sums.py):
the engine's pieces without the engine (RankDomain for migration, halo and lists, velocity
Verlet, the model through DistributedModel), a forced rebuild every 10 steps and on the skin
criterion."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shardmd.domain.distributed_model import DistributedModel
from shardmd.engine.run.rank_domain import RankDomain
from shardmd.engine.run.state import State
from shardmd.integrators import VelocityVerlet


@dataclass
class Run:
    """What a finished loop leaves: this rank's state, its domain, the last outputs, the
    energy per step (eV) and the rebuild count; ``seen`` holds ``every``'s callback results."""

    state: State
    dec: RankDomain
    out: dict
    energies: list = field(default_factory=list)
    rebuilds: int = 0
    seen: list = field(default_factory=list)


def nve(comm, model, atoms, cutoff: float, steps: int, dt: float = 2.0, skin: float = 0.5,
        every: int = 0, callback=None) -> tuple[Run, DistributedModel]:
    """``steps`` steps of ``dt`` fs from ``atoms`` (ASE, with velocities) on ``comm``'s ranks;
    ``callback(state, dec, out)`` at step 0 and every ``every`` steps."""
    torch.set_num_threads(1)
    dm = DistributedModel(model)
    dec = RankDomain(comm, cutoff, skin)
    state = dec.distribute(State.from_atoms(atoms))
    dec.rebuild(state)

    def forces():
        out = dm.compute(dec.ctx, dec.padded_positions, dec.padded_numbers, dec.nl.current)
        state.forces = out["forces"]
        return out

    run = Run(state, dec, forces())
    run.energies.append(float(run.out["energy"]))
    if every:
        run.seen.append(callback(state, dec, run.out))
    vv = VelocityVerlet(dt)
    for step in range(1, steps + 1):
        vv.first_half(state.positions, state.velocities, state.forces, state.masses, state.ids, step - 1)
        if step % 10 == 0 or dec.needs_rebuild(state):
            dec.rebuild(state)
            run.rebuilds += 1
        else:
            dec.refresh(state)
        run.out = forces()
        vv.second_half(state.velocities, state.forces, state.masses)
        run.energies.append(float(run.out["energy"]))
        if every and step % every == 0:
            run.seen.append(callback(state, dec, run.out))
    return run, dm
