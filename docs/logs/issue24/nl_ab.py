import sys, time, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import torch, bench_lj as B
import shardmd.domain.neighbors as N
class A: pass
args = A(); args.steps = 200; args.threads = 1; args.device = "cpu"; args.precision = "float64"; args.sort = "spatial"
n = B.cells_for(int(sys.argv[1]))
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
sim = Simulation(compose_config(B.overrides(n, "lammps", args)))
B.apply_newton(sim, "on"); sim.setup(); sim.started = True
for _ in range(60): sim.step()
d, s = sim.domain, sim.state
def build(cap, half=True):
    return N.build_neighbor_list(d.padded_positions, s.cell, s.pbc, d.nl.radius, ids=d.padded_ids, n_query=s.n_atoms, half=half, capacity=cap)
for half in (True, False):
    N.ONE_PASS_ON_CPU = False; ref = build(None, half); N.ONE_PASS_ON_CPU = True
    for cap in (None, int(ref.n_edges * 1.1), ref.n_edges, ref.n_edges - 1, 1):
        nl = build(cap, half)
        print("half", half, "cap", cap, "equal to two-pass:", torch.equal(nl.offsets, ref.offsets) and torch.equal(nl.packed, ref.packed) and torch.equal(nl.order, ref.order), nl.n_edges)
T = {"one": [], "two": []}
E = ref.n_edges
N.ONE_PASS_ON_CPU = True; build(None)
for r in range(11):
    N.ONE_PASS_ON_CPU = True
    c = time.process_time(); build(int(E * 1.1)); T["one"].append(time.process_time() - c)
    N.ONE_PASS_ON_CPU = False
    c = time.process_time(); build(None); T["two"].append(time.process_time() - c)
print("build ms (min, median):", {k: (round(min(v)*1e3, 2), round(st.median(v)*1e3, 2)) for k, v in T.items()})
