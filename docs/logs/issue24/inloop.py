"""In-loop vs standalone cost of compute_forces: CPU time and minor page faults."""
import resource, statistics as st, sys, time, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "scripts"))
import torch
import bench_lj as B

class A: pass
args = A(); args.steps = 200; args.threads = 1; args.device = "cpu"; args.precision = "float64"; args.sort = "spatial"
n = B.cells_for(int(sys.argv[1]) if len(sys.argv) > 1 else 32000)
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
sim = Simulation(compose_config(B.overrides(n, "lammps", args)))
B.apply_newton(sim, "on")
sim.setup(); sim.started = True
print("threads", torch.get_num_threads(), "natoms", sim.state.n_atoms)

def flt(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

rec = {"cf_cpu": [], "cf_flt": [], "step_cpu": [], "step_flt": [], "threads": set()}
orig = sim.compute_forces
def cf(*a, **kw):
    f0, c0 = flt(), time.process_time()
    orig(*a, **kw)
    rec["cf_cpu"].append(time.process_time() - c0); rec["cf_flt"].append(flt() - f0)
    rec["threads"].add(torch.get_num_threads())
sim.compute_forces = cf

def loop(k):
    for _ in range(k):
        f0, c0 = flt(), time.process_time()
        sim.step()
        rec["step_cpu"].append(time.process_time() - c0); rec["step_flt"].append(flt() - f0)

def standalone(k):
    out = []; fl = []
    for _ in range(k):
        f0, c0 = flt(), time.process_time()
        orig()
        out.append(time.process_time() - c0); fl.append(flt() - f0)
    return out, fl

res = {"loop_cf": [], "loop_step": [], "alone": [], "loop_flt": [], "alone_flt": [], "step_flt": []}
for rnd in range(int(os.environ.get("ROUNDS", 5))):
    for k in rec: 
        if k != "threads": rec[k].clear()
    loop(19)
    # drop steps with a rebuild (max step cpu)
    res["loop_cf"].append(st.median(rec["cf_cpu"])); res["loop_step"].append(st.median(rec["step_cpu"]))
    res["loop_flt"].append(st.median(rec["cf_flt"])); res["step_flt"].append(st.median(rec["step_flt"]))
    a, fl = standalone(19)
    res["alone"].append(st.median(a)); res["alone_flt"].append(st.median(fl))
for k, v in res.items():
    print(f"{k:10s} median {st.median(v)*(1e3 if 'flt' not in k else 1):9.3f}  all", [round(x*(1e3 if 'flt' not in k else 1), 2) for x in v])
print("threads seen in loop", rec["threads"])
