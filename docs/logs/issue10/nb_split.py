"""Split a 4M-atom neighbour build into its launches (synchronised timings, min of 5)."""
import sys, time, argparse, shutil
import torch
import warp as wp
sys.path.insert(0, "scripts")
import bench_lj
import shardmd.domain.neighbors as N
from shardmd.domain import neighbor_kernels as nk
from shardmd.domain.warp_setup import as_array, as_mat33, as_vec3, as_vec3i, scalar_type, wp_device
print("ncu:", shutil.which("ncu"), "nsys:", shutil.which("nsys"))
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
ap = argparse.ArgumentParser(); ap.add_argument("--atoms", type=int, default=4_000_000); a = ap.parse_args()
n_c = bench_lj.cells_for(a.atoms); u = bench_lj.units()
g = torch.stack(torch.meshgrid(*[torch.arange(n_c)] * 3, indexing="ij"), -1).reshape(-1, 3).float()
basis = torch.tensor([[0, 0, 0], [.5, .5, 0], [.5, 0, .5], [0, .5, .5]])
torch.manual_seed(0)
x = ((g[:, None] + basis[None]).reshape(-1, 3) * u["a"] + 0.1 * torch.randn(4 * n_c**3, 3)).to(dev)
cell = (torch.eye(3) * n_c * u["a"]).to(dev); pbc = (True,) * 3; cutoff = u["cutoff"] + u["skin"]
ids = torch.arange(x.shape[0], device=dev)

def T(name, fn, reps=5):
    fn(); best = 1e9
    for _ in range(reps):
        sync(); t = time.perf_counter(); fn(); sync(); best = min(best, time.perf_counter() - t)
    print(f"  {name:38s} {best*1e3:8.3f} ms", flush=True)

n = x.shape[0]; nq = n
T("whole build_neighbor_list", lambda: N.build_neighbor_list(x, cell, pbc, cutoff, ids=ids))
hinv = torch.linalg.inv(cell.T).contiguous()
nb, reach = N._bin_grid(cell, pbc, cutoff, n)
print("bins", nb, "reach", reach, "points per bin", n / (nb[0] * nb[1] * nb[2]))
d = wp_device(x); pbc_v, nb_v, reach_v = wp.vec3i(1, 1, 1), wp.vec3i(*nb), wp.vec3i(*reach)
xw = torch.empty_like(x); img = torch.empty(n, 3, dtype=torch.int32, device=dev); bin_of = torch.empty(n, dtype=torch.int32, device=dev)
cw, hw = as_mat33(cell[None]), as_mat33(hinv[None])
binp = lambda: wp.launch(nk.bin_points, dim=n, device=d, inputs=[as_vec3(x), hw, cw, pbc_v, nb_v, as_vec3(xw), as_vec3i(img), as_array(bin_of)])
T("bin_points", binp)
def sort():
    by_id = torch.argsort(ids, stable=True)
    return by_id[torch.argsort(bin_of[by_id], stable=True)]
T("two stable argsorts", sort)
order = sort(); n_bins = nb[0] * nb[1] * nb[2]
per_bin = torch.bincount(bin_of.long(), minlength=n_bins)
bin_start = torch.zeros(n_bins + 1, dtype=torch.int64, device=dev); bin_start[1:] = torch.cumsum(per_bin, 0)
order32, start32 = order.to(torch.int32).contiguous(), bin_start.to(torch.int32).contiguous()
rank = torch.empty_like(order32); rank[order] = torch.arange(n, dtype=torch.int32, device=dev)
xs = xw[order].contiguous()
cand = N._candidates_per_bin(per_bin, nb, reach, pbc)[bin_of.long()]
ws = torch.zeros(nq + 1, dtype=torch.int64, device=dev); ws[1:] = torch.cumsum((cand + 31) // 32, 0)
print("candidates per point", float(cand.float().mean()))
mask = torch.empty(int(ws[-1]), dtype=torch.int32, device=dev)
counts = torch.zeros(nq, dtype=torch.int32, device=dev); offsets = torch.zeros(nq + 1, dtype=torch.int32, device=dev)
dn = torch.zeros(1, dtype=torch.int32, device=dev); dsft = torch.zeros(1, 3, dtype=torch.int32, device=dev)
common = [as_vec3(xs), as_array(order32), as_array(rank), as_array(start32), as_array(bin_of), as_vec3i(img), cw, pbc_v, nb_v, reach_v,
          scalar_type(x.dtype)(cutoff ** 2), as_array(ws.to(torch.int32))]
mw = wp.from_torch(mask, dtype=wp.uint32)
mark = lambda: wp.launch(nk.scan_neighbors, dim=nq, device=d, inputs=common + [0, mw, as_array(offsets), as_array(counts), as_array(dn), as_vec3i(dsft)])
T("scan pass 1 (mark)", mark)
offsets[1:] = torch.cumsum(counts, 0); ne = int(offsets[-1]); print("edges", ne)
nbr = torch.empty(ne, dtype=torch.int32, device=dev); sh = torch.empty(ne, 3, dtype=torch.int32, device=dev)
emit = lambda: wp.launch(nk.scan_neighbors, dim=nq, device=d, inputs=common + [1, mw, as_array(offsets), as_array(counts), as_array(nbr), as_vec3i(sh)])
T("scan pass 2 (emit)", emit)
print(f"  list bytes written by emit: {(nbr.numel()*4 + sh.numel()*4)/1e9:.2f} GB")
sys.path.insert(0, ".devrun")
import emit_variants as ev
pk = torch.empty(ne, dtype=torch.int64, device=dev); code = torch.empty(ne, dtype=torch.int32, device=dev)
nbr2 = torch.empty_like(nbr); sh2 = torch.empty_like(sh)
for v in range(4):
    f = lambda v=v: wp.launch(ev.emit_v, dim=nq, device=d, inputs=[as_vec3(xs), as_array(order32), as_array(rank), as_array(start32),
        as_array(bin_of), as_vec3i(img), pbc_v, nb_v, reach_v, as_array(ws.to(torch.int32)), mw, as_array(offsets), v,
        as_array(nbr2), as_vec3i(sh2), wp.from_torch(pk, dtype=wp.int64), as_array(code)])
    T(f"emit variant {v}", f)
    if v == 0:
        print("   variant 0 equals the kernel:", bool(torch.equal(nbr2, nbr) and torch.equal(sh2, sh)))
def unpack():
    j = (pk & 0x7FFFFFFF).to(torch.int32)
    k = pk >> 31
    s = torch.stack([k // 1048576 - 512, (k // 1024) % 1024 - 512, k % 1024 - 512], 1).to(torch.int32)
    return j, s
T("unpack int64 (torch)", unpack)
j, s = unpack(); print("   unpacked equals:", bool(torch.equal(j, nbr) and torch.equal(s, sh)))
def dec():
    k = code.long()
    return torch.stack([k // 1048576 - 512, (k // 1024) % 1024 - 512, k % 1024 - 512], 1).to(torch.int32)
T("decode int32 code (torch)", dec)
print("   decoded equals:", bool(torch.equal(dec(), sh)))
