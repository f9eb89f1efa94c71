"""``model.compile=auto``: whether a run compiles its model (a model that offers ``compile_now``:
models/mace.py), decided once the run's atoms are known and before the model's first call.

Compiling costs time once (inductor builds kernels for the first list's sizes, then once more
for symbolic sizes) and saves a share of every later step (the shipped MACE model on one H100:
1.50-1.53x from 864 to 340k atoms, docs/benchmarks.md "Against torch-sim 0.6.2"). So auto
compiles where the run's eager time, estimated from its length, is many times the compile
time, and where compiling has been checked:

- a GPU (on the CPU the gain is 1.03-1.4x for 30-170 s of compiling per shape);
- one domain and one piece (several GPUs under a compiled module are unchecked; parts are
  called layer by layer, which a compiled module is not);
- more than ``SMALL`` atoms (the CUDA graph's limit, models/mace.py ``GRAPH_MAX_POINTS``):
  below it the eager call replays as a CUDA graph, and through the CLI on one H100 at 864
  atoms auto's compiled run made 2.77e5 atom-steps/s against the eager graph's 3.16e5
  (``model.compile=true model.cuda_graph=true``: 3.84e5; docs/benchmarks.md), so a small
  system compiles only when asked;
- ``steps x atoms / RATE >= SECONDS`` with the step count being the run's last step
  (``steps``, the same number when a run is continued, so a restart makes the same choice and
  its trajectory stays the uninterrupted run's) and RATE the eager rate measured for the
  shipped model (a larger model is slower: it is estimated short and compiled later than it
  could be, never earlier).

A machine without a C compiler keeps the eager module (``true`` would refuse in one line).
"""
from __future__ import annotations

#: eager atom-steps per second of the shipped model on one H100 / H200 from 16k atoms up
RATE = 1.25e6
#: up to this many atoms auto stays eager (models/mace.py GRAPH_MAX_POINTS: the eager CUDA graph)
SMALL = 50_000
#: compile where the estimated eager run takes at least this long (s): ~5x the compile time seen
SECONDS = 300.0


def estimated_seconds(steps: int, atoms: int) -> float:
    """The eager run's estimated length (s) for the shipped model on one GPU."""
    return max(int(steps), 0) * atoms / RATE


def reason_not(cfg, atoms: int, ranks: int, device) -> str | None:
    """Why auto does not compile this run (a few words), or None when it should."""
    if device.type != "cuda":
        return "not on a GPU"
    if ranks > 1:
        return f"{ranks} domains"
    if int(cfg.get("subdomains", 1)) != 1:
        return "called in parts"
    if cfg.system.get("frames") or cfg.system.get("files"):
        return "many systems"
    if atoms <= SMALL:
        return f"{atoms} atoms (up to {SMALL}: the eager call replays as a CUDA graph; model.compile=true compiles)"
    secs = estimated_seconds(int(cfg.steps), atoms)
    if secs < SECONDS:
        return f"a short run (~{secs:.0f} s eager, compiles from ~{SECONDS:.0f} s)"
    return None


def apply(cfg, dmodel, atoms: int, ranks: int, device) -> str:
    """Compile ``dmodel``'s model where auto says so; returns the header's words (", compiled"
    or "") — the log line says why not only when the user could want to know."""
    model = getattr(dmodel, "model", None)
    if getattr(model, "compile_asked", None) != "auto" or not hasattr(model, "compile_now"):
        return ", compiled" if getattr(model, "compiled", False) else ""
    if reason_not(cfg, atoms, ranks, device) is not None:
        return ""
    problem = model.compile_now()
    if problem:
        return ", not compiled (no C compiler for model.compile=auto)"
    return ", compiled (model.compile=auto: a long run)"
