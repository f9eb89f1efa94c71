"""Per-step times of MACE MD on one GPU under a TorchScript setting (issue 23: the executor
switch in models/mace.py, `_fixed_jit_executor`).

    python docs/logs/issue23/jit_mode.py VARIANT CUEQ [REPEAT]
VARIANT: executor_off (torch._C._jit_set_profiling_executor(False) around each call, the
setting up to session 11), both (that and torch._C._jit_set_profiling_mode(False): models/mace.py
since session 11), profiling_off (the mode flag alone), default (no switch). One process per
variant: TorchScript keeps an executor per function for the life of the process. Prints step:ms, 'R' where the neighbour list was rebuilt.
"""
import contextlib
import sys
import time
import warnings

warnings.simplefilter("ignore")
import torch  # noqa: E402

import shardmd.models.mace as mm  # noqa: E402
from shardmd.engine.config import compose_config  # noqa: E402
from shardmd.engine.simulation import Simulation  # noqa: E402

variant, cueq = sys.argv[1], sys.argv[2]
rep = int(sys.argv[3]) if len(sys.argv) > 3 else 24


@contextlib.contextmanager
def switch(*setters):
    previous = [setter(False) for setter in setters]
    try:
        yield
    finally:
        for setter, value in zip(setters, previous):
            setter(value)


if variant == "executor_off":
    mm._fixed_jit_executor = lambda: switch(torch._C._jit_set_profiling_executor)
elif variant == "both":
    mm._fixed_jit_executor = lambda: switch(torch._C._jit_set_profiling_executor, torch._C._jit_set_profiling_mode)
elif variant == "profiling_off":
    mm._fixed_jit_executor = lambda: switch(torch._C._jit_set_profiling_mode)
elif variant == "default":
    mm._fixed_jit_executor = contextlib.nullcontext
else:
    raise SystemExit(f"unknown variant {variant}")
sim = Simulation(compose_config(["model=mace", f"system.repeat=[{rep},{rep},{rep}]", "precision=float32",
                                 "device=cuda", f"model.cueq={cueq}", "steps=60", "thermo.every=0",
                                 "trajectory.every=0", "checkpoint.every=0", "quiet=true", "overwrite=true",
                                 "output=/tmp/jit_mode.h5", "model.cuda_graph=false"]))
sim.setup()
sim.started = True
sim._last_step = 60
out, times = [], []
for _ in range(60):
    torch.cuda.synchronize()
    t = time.perf_counter()
    b = sim.nl.n_builds
    sim.step()
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t)
    times.append(ms)
    out.append(f"{sim.state.step}:{ms:.0f}{'R' if sim.nl.n_builds > b else ''}")
steady = sorted(times[5:])[len(times[5:]) // 2]
print(f"{variant} cueq={cueq} atoms={4 * rep ** 3} median(steps 6-60)={steady:.1f} ms max(steps 2-60)="
      f"{max(times[1:]):.0f} ms\n  " + " ".join(out), flush=True)
