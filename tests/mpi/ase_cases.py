"""Run under ``mpiexec -n K``: an ordinary ASE script using ShardMDCalculator.

Rank 0 writes OUT/results_K.npz with energy, forces, stress (every rank's, to compare) and
the relaxed structure of a BFGS run whose log goes to OUT/bfgs_K.log.
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
atoms.calc = calc
e, f, s = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
all_e = calc.comm.all_gather_object((e, f, s))
opt = BFGS(atoms, logfile=str(out / f"bfgs_{world.size}.log"))
opt.run(fmax=5e-3, steps=60)
if calc.comm.is_root:
    np.savez(out / f"results_{calc.comm.size}.npz", energy=e, forces=f, stress=s,
             same=all(np.array_equal(f, o[1]) and o[0] == e and np.array_equal(s, o[2]) for o in all_e),
             relaxed=atoms.positions, world_size=world.size)
