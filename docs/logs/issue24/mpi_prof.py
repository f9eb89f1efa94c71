import sys, os, time, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import torch, bench_lj as B
from shardmd.domain.comm import init_comm, shutdown
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
class A: pass
args = A(); args.steps = 100; args.threads = 1; args.device = "cpu"; args.precision = "float64"; args.sort = "spatial"
n = B.cells_for(int(sys.argv[1]))
ov = [o for o in B.overrides(n, "lammps", args) if not o.startswith(("output=",))] + ["checkpoint.every=0", f"output=/tmp/issue24_mpi_{os.getpid()}.h5"]
cfg = compose_config(ov)
comm = init_comm(cfg.device); cfg.domains = comm.size
sim = Simulation(cfg, comm=comm)
B.apply_newton(sim, "on")
T = collections.defaultdict(lambda: [0.0, 0.0, 0])
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **kw):
        w, c = time.perf_counter(), time.process_time()
        r = f(*a, **kw)
        t = T[key]; t[0] += time.perf_counter() - w; t[1] += time.process_time() - c; t[2] += 1
        return r
    setattr(obj, name, g)
wrap(sim.model.lj, "compute", "lj.compute")
wrap(sim.dmodel, "compute", "dmodel.compute")
wrap(sim.domain, "refresh", "domain.refresh") if hasattr(sim.domain, "refresh") else None
wrap(sim.comm, "all_reduce", "comm.all_reduce")
wrap(sim.neighbors, "update", "neighbors.update")
wrap(sim.comm, "any", "comm.any")
wrap(sim.integrator, "first_half", "integrator.first_half")
wrap(sim.integrator, "second_half", "integrator.second_half")
wrap(sim, "_report", "sim._report")
w0, c0 = time.perf_counter(), time.process_time()
sim.run()
W, C = time.perf_counter() - w0, time.process_time() - c0
lines = [f"rank {comm.rank}: run wall {W:.3f} cpu {C:.3f}; nq {sim.state.n_atoms} points {sim.domain.padded_positions.shape[0]} edges {sim.nl.current.n_edges}"]
for k, (w, c, m) in T.items():
    lines.append(f"  {k:20s} n={m:4d} wall {w*1e3/ max(m,1):8.3f} ms/call cpu {c*1e3/max(m,1):8.3f} total wall {w:.3f}")
print("\n".join(lines), flush=True)
del sim
shutdown(comm)
os._exit(0)
