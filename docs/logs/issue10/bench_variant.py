"""bench_mace / diag with MaceModel's JIT executor scope swapped: JITV=simple|dynamic|profiling."""
import contextlib, os, runpy, sys, warnings; warnings.simplefilter("ignore")
import torch
import shardmd.models.mace as mm
V = os.environ.get("JITV", "simple")
if V == "dynamic":
    @contextlib.contextmanager
    def cm():
        prev = torch._C._jit_set_fusion_strategy([("DYNAMIC", 20)])
        try:
            yield
        finally:
            torch._C._jit_set_fusion_strategy(prev)
    mm._fixed_jit_executor = cm
elif V == "profiling":
    mm._fixed_jit_executor = contextlib.nullcontext
script, sys.argv = sys.argv[1], sys.argv[1:]
print("JIT variant", V)
runpy.run_path(script, run_name="__main__")
