"""Host vs device time per step: engine (with its phase timers) and bare mace-torch f+b."""
import sys, time, types, warnings
warnings.simplefilter("ignore")
import torch
sys.path.insert(0, "scripts")
from bench_mace import engine_overrides, _calculator, atoms_for
from shardmd.engine.config import compose_config
from shardmd.engine.simulation import Simulation
import os
DEV = os.environ.get("DEV", "cuda")
SYNC = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)

for n in [int(v) for v in sys.argv[1:]]:
    a = types.SimpleNamespace(dtype="float32", device=DEV, model=None, cueq=DEV == "cuda", no_pipelined_reads=False,
                              warmup=10, steps=100)
    sim = Simulation(compose_config(engine_overrides(n, a)))
    sim.setup(); sim.started = True
    for _ in range(10): sim.step()
    SYNC()
    t0 = dict(sim.timers); host = 0.0
    t = time.perf_counter()
    for _ in range(100):
        h = time.perf_counter(); sim.step(); host += time.perf_counter() - h
    SYNC(); wall = time.perf_counter() - t
    ph = {k: 1e3 * (v - t0.get(k, 0.0)) / 100 for k, v in sim.timers.items()}
    print(f"engine {sim.state.n_atoms} atoms: wall {1e3*wall/100:.2f} ms/step, host {1e3*host/100:.2f} ms/step; "
          "phases (host ms/step): " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items() if v > 0.005))
    sim.close()
    calc = _calculator(a)
    from mace import data as mdata
    from mace.tools import torch_geometric
    atoms = atoms_for(n)
    ad = mdata.AtomicData.from_config(mdata.config_from_atoms(atoms), z_table=calc.z_table, cutoff=calc.r_max,
                                      heads=getattr(calc, "available_heads", None))
    b = next(iter(torch_geometric.dataloader.DataLoader([ad], batch_size=1))).to(DEV)
    d = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in b.to_dict().items()}
    model = calc.models[0]
    for _ in range(10): model(dict(d), compute_force=True, training=False)
    SYNC(); host = 0.0; t = time.perf_counter()
    for _ in range(100):
        h = time.perf_counter(); model(dict(d), compute_force=True, training=False); host += time.perf_counter() - h
    SYNC(); wall = time.perf_counter() - t
    print(f"bare   {len(atoms)} atoms: wall {1e3*wall/100:.2f} ms/call, host {1e3*host/100:.2f} ms/call")
