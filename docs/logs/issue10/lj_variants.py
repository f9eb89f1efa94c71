"""Experiment: the LJ kernel reading one packed int64 per edge (neighbour | shift) instead of
an int32 neighbour and a vec3i shift (four loads). 4M atoms, float32, the in.lj lattice."""
import sys, time
from typing import Any
import torch
sys.path.insert(0, "scripts")
import bench_lj
from shardmd.domain.neighbors import build_neighbor_list
from shardmd.domain.warp_setup import init_warp, as_array, as_vec3, as_mat33, as_vec3i, wp_device
from shardmd.models.lj import LennardJones
from shardmd.models.lj_kernels import _lj_pair
wp = init_warp()
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

@wp.kernel(enable_backward=False)
def lj_packed(x: wp.array(dtype=wp.vec3f), cell: wp.array(dtype=wp.mat33f), offsets: wp.array(dtype=wp.int32),
              packed: wp.array(dtype=wp.int64), params: wp.vec3f, cutoff2: float, variant: int,
              forces: wp.array(dtype=wp.vec3f), energies: wp.array(dtype=float), virials: wp.array(dtype=wp.mat33f)):
    i = wp.tid()
    h = cell[0]
    xi = x[i]
    f = wp.vec3f()
    e = float(0.0)
    w = wp.mat33f()
    for p in range(offsets[i], offsets[i + 1]):
        v = packed[p]
        j = wp.int32(v & wp.int64(2147483647))
        k = wp.int32(v >> wp.int64(31))
        d = x[j] - xi
        if k != 537395712 and variant == 0:   # (512 << 20) | (512 << 10) | 512: S = 0
            s0 = float(((k >> 20) & 1023) - 512)
            s1 = float(((k >> 10) & 1023) - 512)
            s2 = float((k & 1023) - 512)
            image = s0 * h[0] + s1 * h[1] + s2 * h[2]
            d += image
            u, fpr = _lj_pair(wp.dot(d, d), params, cutoff2)
            g = fpr * d
            e += u
            f -= g
            w += wp.outer(image, g)
        else:
            u, fpr = _lj_pair(wp.dot(d, d), params, cutoff2)
            g = fpr * d
            e += u
            f -= g
    forces[i] = f
    energies[i] = 0.5 * e
    virials[i] = wp.outer(xi, f) + 0.5 * w

n_c = bench_lj.cells_for(int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000); u = bench_lj.units()
g = torch.stack(torch.meshgrid(*[torch.arange(n_c)] * 3, indexing="ij"), -1).reshape(-1, 3).float()
basis = torch.tensor([[0, 0, 0], [.5, .5, 0], [.5, 0, .5], [0, .5, .5]])
torch.manual_seed(0)
x = ((g[:, None] + basis[None]).reshape(-1, 3) * u["a"] + 0.1 * torch.randn(4 * n_c**3, 3)).to(dev)
cell = (torch.eye(3) * n_c * u["a"]).to(dev)
nl = build_neighbor_list(x, cell, (True,) * 3, u["cutoff"] + u["skin"])
n = x.shape[0]
lj = LennardJones({18: bench_lj.EPSILON}, {18: bench_lj.SIGMA}, cutoff=u["cutoff"], shift=False)
numbers = torch.full((n,), 18, dtype=torch.int64, device=dev)
def T(name, fn, reps=5):
    fn(); best = 1e9
    for _ in range(reps):
        sync(); t = time.perf_counter(); fn(); sync(); best = min(best, time.perf_counter() - t)
    print(f"  {name:44s} {best*1e3:8.3f} ms", flush=True)
    return best
ref = lj.compute(x, cell, torch.tensor([True] * 3), numbers, nl)
T("LennardJones.compute (neighbors + vec3i shifts)", lambda: lj.compute(x, cell, torch.tensor([True] * 3), numbers, nl))
s = nl.shifts.long() + 512
packed = (((s[:, 0] << 20) | (s[:, 1] << 10) | s[:, 2]) << 31) | nl.neighbors.long()
print("edges", nl.n_edges, "with a shift", int((nl.shifts != 0).any(1).sum()))
sg, ep = lj.sigma[18], lj.epsilon[18]
params = wp.vec3f(4 * ep * sg**12, 4 * ep * sg**6, 0.0)
F = torch.empty(n, 3, device=dev); E = torch.empty(n, device=dev); W = torch.empty(n, 3, 3, device=dev)
for v in (0, 1):
    run = lambda v=v: wp.launch(lj_packed, dim=n, device=wp_device(x), inputs=[as_vec3(x), as_mat33(cell[None]), as_array(nl.offsets),
        wp.from_torch(packed, dtype=wp.int64), params, float(u["cutoff"]) ** 2, v, as_vec3(F), as_array(E), as_mat33(W)])
    T(f"packed kernel, variant {v} ({'exact' if v == 0 else 'shifts ignored: a bound'})", run)
    if v == 0:
        run(); sync()
        print("   max|dF|/max|F| vs compute:", float((F - ref["forces"]).abs().max() / ref["forces"].abs().max()),
              " dE/E:", float((E.sum() - ref["energy"]).abs() / ref["energy"].abs()),
              " dW:", float((W.sum(0) - ref["virial"]).abs().max() / ref["virial"].abs().max()))
