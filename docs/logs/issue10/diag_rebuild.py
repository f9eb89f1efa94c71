"""Why is the step after a neighbour rebuild slow? Per-step host/device time + allocator stats,
then profiler tables of a rebuild step, the step after it and a normal step."""
import sys, time, warnings; warnings.simplefilter("ignore")
import os, torch
V = os.environ.get("VARIANT", "base")
if V == "texpr_off": torch._C._jit_set_texpr_fuser_enabled(False)
if V == "dynamic": torch.jit.set_fusion_strategy([("DYNAMIC", 20)])
if V == "no_profiling": torch._C._jit_set_profiling_executor(False)
if V == "e3nn_noscript":
    import e3nn; e3nn.set_optimization_defaults(jit_script_fx=False)
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
cueq, n_steps, prof_out = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
sim = Simulation(compose_config(["model=mace", "system.repeat=[24,24,24]", "precision=float32", "device=cuda", f"model.cueq={cueq}",
                                 f"steps={n_steps}", "thermo.every=0", "trajectory.every=0", "checkpoint.every=0", "quiet=true",
                                 "overwrite=true", "output=/tmp/st.h5"]))
sim.setup(); sim.started = True; sim._last_step = n_steps
K = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
def ms(): s = torch.cuda.memory_stats(); return [s.get(k, 0) for k in K] + [s["reserved_bytes.all.current"] >> 20]
out = []
for i in range(n_steps // 2):
    torch.cuda.synchronize(); m0 = ms(); t = time.perf_counter(); b = sim.nl.n_builds
    sim.step(); th = time.perf_counter() - t; torch.cuda.synchronize(); tt = time.perf_counter() - t; m1 = ms()
    d = [b_ - a_ for a_, b_ in zip(m0[:4], m1[:4])]
    out.append(f"{sim.state.step}{'R' if sim.nl.n_builds > b else ''}{'v' if sim._verified else ''}:"
               f"{1e3*th:.0f}/{1e3*tt:.0f}ms alloc{d[0]} free{d[1]} retry{d[2]} res{m1[4]}MiB")
print("cueq", cueq, "variant", V, " ".join(o.split(" alloc")[0] for o in out), "rollbacks", sim.deferred.rollbacks, sep="\n")
if prof_out:
    from torch.profiler import profile, ProfilerActivity
    keep, prev_r = {}, False
    for i in range(n_steps // 2, n_steps):
        b = sim.nl.n_builds; torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            sim.step(); torch.cuda.synchronize()
        r = sim.nl.n_builds > b
        tag = "rebuild" if r else ("after" if prev_r else "normal")
        if tag not in keep or tag == "after":
            keep[tag] = p
        prev_r = r
        if "after" in keep and "rebuild" in keep and tag == "after":
            break
    with open(prof_out, "w") as f:
        for tag, p in keep.items():
            ka = p.key_averages()
            f.write(f"===== {tag} by self CPU\n" + ka.table(sort_by="self_cpu_time_total", row_limit=18) + "\n")
            f.write(f"===== {tag} by self CUDA\n" + ka.table(sort_by="self_cuda_time_total", row_limit=12) + "\n")
    print("profiles:", list(keep))
