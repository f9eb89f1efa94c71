"""Run under ``mpiexec -n K``: an ordinary ASE script using ShardMDCalculator.

Rank 0 writes OUT/results_K.npz with energy, forces, stress (every rank's, to compare), the
relaxed structure of a BFGS run whose log goes to OUT/bfgs_K.log, and a sequence of calls on
one calculator that keeps its neighbour list (reused, rebuilt when one atom, owned by one
rank only, passes skin/2, built afresh for a new cell, new species and after reset), each
with its largest relative difference from a new calculator's result.
"""
import sys
from pathlib import Path

import numpy as np
from ase.build import bulk
from ase.optimize import BFGS

from shardmd.engine.ase_calculator import ShardMDCalculator

out = Path(sys.argv[1])
calc = ShardMDCalculator(model="lj", cutoff=6.0)   # first: imports mpi4py and fixes ase.parallel.world
from ase.parallel import world  # noqa: E402

atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat((3, 3, 3))
atoms.rattle(0.12, seed=4)
atoms.set_cell(atoms.cell.array @ np.array([[1, 0, 0], [0.08, 1, 0], [0, 0.05, 1]]), scale_atoms=True)
start = atoms.copy()
atoms.calc = calc
e, f, s = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
all_e = calc.comm.all_gather_object((e, f, s))
opt = BFGS(atoms, logfile=str(out / f"bfgs_{world.size}.log"))
opt.run(fmax=5e-3, steps=60)

KW = {"model": "lj", "cutoff": 6.0, "skin": 0.6, "epsilon": {"Ar": 0.0104, "Kr": 0.0140},
      "sigma": {"Ar": 3.40, "Kr": 3.65}}
b = start.copy()
b.calc = kept = ShardMDCalculator(**KW)
base = b.positions.copy()
move = np.random.default_rng(5).normal(size=base.shape)
move *= 0.29 / np.linalg.norm(move, axis=1).max()


def under_half_skin():
    b.positions = base + move


def one_atom_over():
    b.positions[7] = base[7] + [0.0, 0.31, 0.0]


def on_from_there():
    b.positions[7] += [0.2, 0.0, 0.0]


def new_cell():
    b.set_cell(b.cell.array * 1.005, scale_atoms=True)


def new_species():
    b.numbers[[1, 5]] = 36


steps = [lambda: None, under_half_skin, one_atom_over, on_from_there, new_cell, new_species, kept.reset]
seq_e, seq_f, seq_rel, seq_stats = [], [], [], []
for step in steps:
    step()
    ek, fk, sk = b.get_potential_energy(), b.get_forces(), b.get_stress()
    ref = b.copy()
    ref.calc = ShardMDCalculator(**KW)
    e0, f0, s0 = ref.get_potential_energy(), ref.get_forces(), ref.get_stress()
    seq_rel.append(max(abs(ek - e0) / abs(e0), np.linalg.norm(fk - f0) / np.linalg.norm(f0),
                       np.linalg.norm(sk - s0) / np.linalg.norm(s0)))
    seq_e.append(ek)
    seq_f.append(fk)
    seq_stats.append([kept.stats[k] for k in ("builds", "rebuilds", "reuses")])
all_seq = calc.comm.all_gather_object((seq_e, seq_f))

if calc.comm.is_root:
    np.savez(out / f"results_{calc.comm.size}.npz", energy=e, forces=f, stress=s,
             same=all(np.array_equal(f, o[1]) and o[0] == e and np.array_equal(s, o[2]) for o in all_e),
             relaxed=atoms.positions, world_size=world.size, seq_energy=seq_e, seq_forces=seq_f,
             seq_rel=seq_rel, seq_stats=seq_stats,
             seq_same=all(o[0] == seq_e and all(np.array_equal(x, y) for x, y in zip(o[1], seq_f)) for o in all_seq))
