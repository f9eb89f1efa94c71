"""Why does the MACE capture fail in float64? Variants of the test's run, then sync-debug the call."""
import sys, traceback, warnings
import torch
warnings.simplefilter("ignore")
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation

def run(prec, cueq, temp, repeat, steps=30):
    cfg = compose_config(["model=mace", f"precision={prec}", "device=cuda", f"system.repeat=[{repeat},{repeat},{repeat}]",
                          f"temperature={temp}", "dt=2.0", f"steps={steps}", "thermo.every=0", "trajectory.every=0",
                          "checkpoint.every=0", "quiet=true", "overwrite=true", "model.cuda_graph=true",
                          f"model.cueq={cueq}", f"output=/tmp/gd_{prec}_{cueq}.h5"])
    sim = Simulation(cfg); sim.run()
    g = sim.model._graphed
    print(f"{prec} cueq={cueq} T={temp} rep={repeat}: cueq_on={sim.model.cueq} disabled={g.disabled} "
          f"cap={g.captures} rep={g.replays} eager={g.eager}", flush=True)
    return sim

for args in [("float64", "auto", 1200, 4), ("float64", "false", 1200, 4), ("float32", "auto", 1200, 4),
             ("float64", "auto", 300, 6)]:
    try:
        sim = run(*args)
    except Exception:
        traceback.print_exc()
# sync-debug an eager call of the failing variant
sim = run("float64", "auto", 1200, 4, steps=5)
m = sim.model
orig = m._evaluate
def dbg(*a, **k):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return orig(*a, **k)
    except Exception:
        traceback.print_exc(limit=-8)
        raise
    finally:
        torch.cuda.set_sync_debug_mode(0)
m._evaluate = dbg
m._graphed.drop(); m._graphed.disabled = None
try:
    sim.step(); sim.step(); sim.step()
except Exception as e:
    print("step raised", type(e).__name__, str(e)[:300])
print("after dbg: disabled", m._graphed.disabled)
# capture modes
for mode in ("thread_local", "relaxed"):
    m._evaluate = orig
    import shardmd.domain.graphed_call as gc
    src = gc.GraphedCall._capture
    def cap(self, fn, inputs, mode=mode):
        self.static_in = tuple(t.detach().clone() for t in inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=mode):
            out = fn(*self.static_in)
        self.graph, self.static_out = graph, dict(out); self.captures += 1
    gc.GraphedCall._capture = cap
    m._graphed.drop(); m._graphed.disabled = None
    for _ in range(3): sim.step()
    print(mode, "disabled", m._graphed.disabled, "cap", m._graphed.captures, flush=True)
    gc.GraphedCall._capture = src
