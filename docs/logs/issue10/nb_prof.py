"""Where a 4M-atom LJ neighbour build goes on the GPU (torch.profiler, CUDA kernels)."""
import sys, time, argparse
import torch
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
sys.path.insert(0, "scripts")
import bench_lj
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
from torch.profiler import profile, ProfilerActivity

ap = argparse.ArgumentParser(); ap.add_argument("--atoms", type=int, default=4_000_000)
ap.add_argument("--precision", default="float32"); a = ap.parse_args()
ap2 = None
args = argparse.Namespace(steps=50, threads=0, device="cuda" if torch.cuda.is_available() else "cpu", precision=a.precision)
n = bench_lj.cells_for(a.atoms)
sim = Simulation(compose_config(bench_lj.overrides(n, "default", args)))
sim.setup(); sim.started = True
for _ in range(5): sim.step()
s, d = sim.state, sim.domain
build = lambda: d.nl.build(d.padded_positions, s.cell, s.pbc, ids=d.padded_ids, n_query=s.n_atoms)
for _ in range(2): build()
sync()
for name, fn in (("build", build),):
    t = []
    for _ in range(5):
        sync(); t0 = time.perf_counter(); fn(); sync(); t.append(time.perf_counter() - t0)
    print(f"{name}: min {min(t)*1e3:.2f} ms, median {sorted(t)[2]*1e3:.2f} ms", flush=True)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])) as prof:
        for _ in range(3): fn()
        sync()
    print(prof.key_averages().table(sort_by="cuda_time_total" if torch.cuda.is_available() else "cpu_time_total", row_limit=6, max_name_column_width=60), flush=True)
nl = d.nl.current
print("edges", nl.n_edges, "per atom", nl.n_edges / s.n_atoms, "points", nl.n_points, "ids sorted?",
      bool((d.padded_ids[1:] > d.padded_ids[:-1]).all()) if d.padded_ids is not None else None)
from shardmd.domain.neighbors import build_neighbor_list
x = d.padded_positions
perm = torch.randperm(x.shape[0], device=x.device)
xp, idp = x[perm].contiguous(), d.padded_ids[perm].contiguous()
f = lambda: build_neighbor_list(xp, s.cell, s.pbc, d.nl.radius, ids=idp)
f(); t = []
for _ in range(5):
    sync(); t0 = time.perf_counter(); nlp = f(); sync(); t.append(time.perf_counter() - t0)
print(f"build, ids in random spatial order: min {min(t)*1e3:.2f} ms, edges {nlp.n_edges}")
