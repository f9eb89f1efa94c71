"""Where a compiled MACE run leaves the eager one: per-step positions and forces against eager.

The shipped model, float64, 256 Cu atoms at 1200 K, dt 2 fs, run step by step eagerly and then
in each chosen mode; prints, per mode, the list builds, the first step whose positions differ
by more than 1e-9 Å, and max |dx|, max |dF| every 10 steps. Round-off alone keeps |dx| near
1e-15 Å over 60 steps (CPU, with and without rebuilds); a jump at a build or at the first
graph capture names the culprit.

    python scripts/check_compiled_mace.py --device cuda                       # cuEquivariance if installed
    python scripts/check_compiled_mace.py --device cuda --cueq false --modes compile-graph compile
    python scripts/check_compiled_mace.py --device cpu --cueq false --modes compile neighbor.skin=0.3
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import tempfile

import numpy as np

MODES = {"compile-graph": ("true", "true"), "compile": ("false", "true"), "graph": ("true", "false"),
         "compile-static": ("false", "true"), "compile-aot": ("false", "true"), "compile-eager": ("false", "true")}


@contextlib.contextmanager
def variant(mode: str, dynamo: list[str]):
    """compile-static: one compiled graph per shape (no symbolic sizes); compile-aot: dynamo and
    AOTAutograd without inductor (backend 'aot_eager'); compile-eager: dynamo alone (backend
    'eager'): which layer a wrong result comes from. ``dynamo``: torch._dynamo.config settings."""
    import torch

    plain = torch.compile
    with contextlib.ExitStack() as stack:
        for kv in dynamo:
            k, v = kv.split("=", 1)
            stack.enter_context(torch._dynamo.config.patch(**{k: ast.literal_eval(v)}))
        if mode == "compile-eager":
            torch.compile = functools.partial(plain, backend="eager")
        if mode == "compile-static":
            stack.enter_context(torch._dynamo.config.patch(automatic_dynamic_shapes=False, cache_size_limit=64))
        if mode == "compile-aot":
            torch.compile = functools.partial(plain, backend="aot_eager")
        try:
            yield
        finally:
            torch.compile = plain


def trajectory(device: str, cueq: str, graph: str, comp: str, steps: int, extra: list[str]):
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.run.simulation import Simulation

    d = tempfile.mkdtemp()
    sim = Simulation(compose_config([
        "model=mace", "precision=float64", f"device={device}", "system.repeat=[4,4,4]", "temperature=1200",
        "dt=2.0", f"steps={steps}", "thermo.every=0", "trajectory.every=0", "checkpoint.every=0", "quiet=true",
        "overwrite=true", f"model.cuda_graph={graph}", f"model.compile={comp}", f"model.cueq={cueq}",
        f"output={d}/run.h5", *extra]))
    out = []
    sim.run(1)
    for k in range(1, steps + 1):
        while sim.state.step < k:
            sim.step()
        full = sim.domain.gather(sim.state, ("positions", "forces"))
        out.append((full["positions"].copy(), full["forces"].copy(), sim.nl.n_builds))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cueq", default="auto")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--modes", nargs="+", default=["compile-graph", "compile", "graph"],
                    help=f"of {sorted(MODES)}; anything with '=' is a setting for every run")
    ap.add_argument("--dynamo", nargs="*", default=[], help="torch._dynamo.config settings, KEY=VALUE")
    a = ap.parse_args()
    extra = [m for m in a.modes if "=" in m]
    ref = trajectory(a.device, a.cueq, "false", "false", a.steps, extra)
    for mode in [m for m in a.modes if "=" not in m]:
        graph, comp = MODES[mode]
        try:
            with variant(mode, a.dynamo):
                got = trajectory(a.device, a.cueq, graph, comp, a.steps, extra)
        except Exception as exc:  # noqa: BLE001 - one line says why, the other modes go on
            print(f"{mode}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        dx = [float(np.abs(g[0] - r[0]).max()) for g, r in zip(got, ref)]
        df = [float(np.abs(g[1] - r[1]).max()) for g, r in zip(got, ref)]
        first = next((k + 1 for k, x in enumerate(dx) if x > 1e-9), None)
        print(f"{mode}: builds {[g[2] for g in got][::10]} (eager {[r[2] for r in ref][::10]}); first step with "
              f"|dx| > 1e-9 A: {first}; max|dx| every 10 steps {['%.1e' % x for x in dx[::10]]}; "
              f"max|dF| {['%.1e' % x for x in df[::10]]}, steps 1-4 {['%.1e' % x for x in df[:4]]}", flush=True)


if __name__ == "__main__":
    main()
