import sys, time, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import torch, bench_lj as B
class A: pass
args = A(); args.steps = 200; args.threads = 1; args.device = "cpu"; args.precision = "float64"; args.sort = "spatial"
n = B.cells_for(int(sys.argv[1])); mode = sys.argv[2]
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
def mk():
    sim = Simulation(compose_config(B.overrides(n, "lammps", args)))
    B.apply_newton(sim, mode); sim.setup(); sim.started = True; return sim
lat = mk(); th = mk()
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 60): th.step()
th.rebuild(); th.compute_forces()
def edges(s): return int(s.nl.current.offsets[-1])
def inside(s):
    return None
t = {"lat": [], "th": []}
for r in range(15):
    for k, s in (("lat", lat), ("th", th)):
        c = time.process_time(); s.compute_forces(); t[k].append(time.process_time() - c)
print(mode, "edges lat/th", edges(lat), edges(th), {k: (round(min(v)*1e3, 2), round(st.median(v)*1e3, 2)) for k, v in t.items()})
