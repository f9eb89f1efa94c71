"""Can mace-torch's forward+backward (forces) be captured in a CUDA graph? Bare model, fixed graph."""
import sys, time, types, warnings, traceback
warnings.simplefilter("ignore")
import torch
sys.path.insert(0, "scripts")
from bench_mace import _calculator, atoms_for
from mace import data as mdata
from mace.tools import torch_geometric

torch._C._jit_set_profiling_executor(False)
for cueq in (True, False):
    for n in [int(v) for v in sys.argv[1:]]:
        a = types.SimpleNamespace(dtype="float32", device="cuda", model=None, cueq=cueq)
        calc = _calculator(a)
        atoms = atoms_for(n)
        atoms.rattle(0.05, seed=1)
        ad = mdata.AtomicData.from_config(mdata.config_from_atoms(atoms), z_table=calc.z_table, cutoff=calc.r_max,
                                          heads=getattr(calc, "available_heads", None))
        b = next(iter(torch_geometric.dataloader.DataLoader([ad], batch_size=1))).to("cuda")
        d = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in b.to_dict().items()}
        model = calc.models[0]
        call = lambda: model(dict(d), compute_force=True, training=False)["forces"]
        for _ in range(5): ref = call()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(50): call()
        torch.cuda.synchronize(); eager = (time.perf_counter() - t) / 50
        tag = f"{'cueq' if cueq else 'e3nn'} {len(atoms)} atoms"
        try:
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3): call()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = call()
            g.replay(); torch.cuda.synchronize()
            err = float((out - ref).abs().max()); scale = float(ref.abs().max())
            # new positions into the static input: does the replay follow them?
            with torch.no_grad():
                d["positions"].add_(0.01)
            g.replay(); f2 = call(); torch.cuda.synchronize()
            err2 = float((out - f2).abs().max())
            with torch.no_grad():
                d["positions"].sub_(0.01)
            t = time.perf_counter()
            for _ in range(50): g.replay()
            torch.cuda.synchronize(); graph = (time.perf_counter() - t) / 50
            print(f"{tag}: eager {1e3*eager:.2f} ms, graph replay {1e3*graph:.2f} ms ({eager/graph:.2f}x); "
                  f"max|dF| {err:.2e} (max|F| {scale:.2e}), after moving atoms {err2:.2e}", flush=True)
        except Exception as e:
            print(f"{tag}: eager {1e3*eager:.2f} ms; capture FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
