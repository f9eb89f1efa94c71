import sys, time, warnings; warnings.simplefilter("ignore")
import torch
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
cueq = sys.argv[1]
sim = Simulation(compose_config(["model=mace", "system.repeat=[24,24,24]", "precision=float32", "device=cuda", f"model.cueq={cueq}",
                                 "steps=60", "thermo.every=0", "trajectory.every=0", "checkpoint.every=0", "quiet=true",
                                 "overwrite=true", "output=/tmp/st.h5"]))
sim.setup(); sim.started = True; sim._last_step = 60
out = []
for i in range(60):
    torch.cuda.synchronize(); t = time.perf_counter(); b = sim.nl.n_builds
    sim.step(); torch.cuda.synchronize()
    out.append(f"{sim.state.step}:{1e3*(time.perf_counter()-t):.0f}{'R' if sim.nl.n_builds > b else ''}{'v' if sim._verified else ''}")
print("cueq", cueq, " ".join(out), "rollbacks", sim.deferred.rollbacks)
