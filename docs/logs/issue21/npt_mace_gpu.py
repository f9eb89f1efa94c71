"""MACE NPT step cost against NVE on one GPU (issue 21): the shipped model, fcc Cu, float32.

    python docs/logs/issue21/npt_mace_gpu.py CASE REPEAT STEPS [CUEQ]
CASE: verlet | verlet-sync | nose-hoover | npt-iso | npt-tri. One process per case. verlet runs
with the CUDA default, the deferred skin check; the others with `neighbor.deferred=false`
(NHC and NPT refuse the deferred check: its rollbacks do not restore chains or the cell), so
verlet-sync is NVE under the same per-step check as NPT. Times STEPS steps after
20 warm-up steps (CUDA synchronised), prints atom-steps/s, neighbour builds and the volume change.
"""
import sys
import time
import warnings

warnings.simplefilter("ignore")
import torch  # noqa: E402

from shardmd.engine.config import compose_config  # noqa: E402
from shardmd.engine.simulation import Simulation  # noqa: E402

case, rep, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cueq = sys.argv[4] if len(sys.argv) > 4 else "true"
extra = {"verlet": ["integrator=verlet"],
         "verlet-sync": ["integrator=verlet"],
         "nose-hoover": ["integrator=nose-hoover", "integrator.tdamp=100"],
         "npt-iso": ["integrator=npt", "integrator.couple=iso", "integrator.pressure=1.0",
                     "integrator.pdamp=1000", "integrator.tdamp=100"],
         "npt-tri": ["integrator=npt", "integrator.couple=tri", "integrator.pressure=1.0",
                     "integrator.pdamp=1000", "integrator.tdamp=100"]}[case]
sim = Simulation(compose_config(["model=mace", f"system.repeat=[{rep},{rep},{rep}]", "precision=float32",
                                 "device=cuda", f"model.cueq={cueq}", "temperature=300", "dt=1.0",
                                 f"steps={20 + steps}", "thermo.every=0", "trajectory.every=0",
                                 "checkpoint.every=0", "quiet=true", "overwrite=true",
                                 f"output=/tmp/npt_{case}.h5", *extra,
                                 *([] if case == "verlet" else ["neighbor.deferred=false"])]))
sim.run(20)
torch.cuda.synchronize()
v0 = float(torch.det(sim.state.cell.double()))
b0 = sim.nl.n_builds
t = time.perf_counter()
sim.run(20 + steps)
torch.cuda.synchronize()
wall = time.perf_counter() - t
n = 4 * rep ** 3
v1 = float(torch.det(sim.state.cell.double()))
print(f"{case:12s} atoms={n} steps={steps} {n * steps / wall:.3e} atom-steps/s  {1e3 * wall / steps:.2f} ms/step  "
      f"builds={sim.nl.n_builds - b0}  dV/V={(v1 - v0) / v0:+.2e}", flush=True)
sim.close()
