"""ShardTensor handlers, transforms and adapters on K ranks (or in-process on one).

Usage: mpiexec -n K python tests/mpi/shard_cases.py OUT.json
Every check compares this rank's rows with a single-process reference computed on every
rank over the whole (small) system, reduces the largest error over ranks and records
{"err": .., "ok": ..}; rank 0 writes the dict.  ``run_checks(comm)`` runs in-process too.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

from shardmd.domain.api import (  # noqa: E402  # noqa: E402
    SPEC_MPNN_HALO,
    AdapterScope,
    AllReduceSum,
    DistributedModel,
    DistributionSpec,
    GatherInputs,
    GatherInputsFull,
    HaloMeta,
    HaloStorage,
    MLIPSpec,
    OpAdapter,
    ReverseOutputs,
    ScatterOutputs,
    ShardedStorage,
    ShardMeta,
    ShardTensor,
    SliceOutputsOwned,
    SliceOwned,
    all_reduce_sum,
    dispatch_trace,
)
from shardmd.domain.collectives import seed_once  # noqa: E402
from shardmd.domain.halo import halo_forward, halo_reverse  # noqa: E402
from shardmd.domain.neighbors import build_neighbor_list  # noqa: E402
from shardmd.domain.validate_worker import rank_domain  # noqa: E402

F64 = torch.float64


# -- test ops (plain torch inside, autograd formulas where the checks need gradients) --------------
@torch.library.custom_op("shardmd_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


double.register_autograd(lambda ctx, g: 2 * g, setup_context=lambda ctx, inputs, output: None)


@torch.library.custom_op("shardmd_test::edge_sums", mutates_args=())
def edge_sums(x: torch.Tensor, edge_index: torch.Tensor, shifts: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(n_rows,) sum over edges of exp(-r) into both ends (a 'kernel' writing halo rows)."""
    r = (x[edge_index[1]] + shifts - x[edge_index[0]]).norm(dim=1)
    w = torch.exp(-r)
    out = torch.zeros(n_rows, dtype=x.dtype)
    return out.index_add(0, edge_index[0], w).index_add(0, edge_index[1], w)


@torch.library.custom_op("shardmd_test::row_total", mutates_args=())
def row_total(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def feat(ids: torch.Tensor, k: int = 2) -> torch.Tensor:
    a = ids.to(F64)[:, None] * 0.37 + torch.arange(k, dtype=F64)
    return torch.sin(a)


def weight(r: torch.Tensor, rc: float = 4.5) -> torch.Tensor:
    x = torch.where(r < rc, r / rc, torch.ones_like(r))
    return (1 - x * x) ** 2


class Checks:
    def __init__(self, comm):
        self.comm = comm
        self.res: dict = {}

    def close(self, name: str, err, tol: float = 1e-12):
        e = torch.tensor([float(err)], dtype=F64)
        g = float(self.comm.all_reduce(e, "max")[0])
        self.res[name] = {"err": g, "ok": bool(g <= tol)}


def _maxabs(a, b) -> float:
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def run_checks(comm) -> dict:
    import byo_mpnn

    torch.set_num_threads(1)
    C = Checks(comm)
    atoms = byo_mpnn.sample_system((4, 4, 4), seed=3)
    s = {"positions": atoms.positions, "cell": atoms.cell.array, "pbc": atoms.pbc, "numbers": atoms.numbers}
    d = rank_domain(comm, s, 5.0, 5.0)
    ctx, padded, pids, nl, cell = d["ctx"], d["padded"], d["ids"], d["nl"], d["cell"]
    P, pbc = d["wrapped"], d["pbc"]
    n, npad = ctx.n_owned, ctx.n_padded
    ids_o = pids[:n]
    plan = ctx.plan
    halo = HaloMeta(n, npad, plan)
    full = build_neighbor_list(P, cell, pbc, 5.0, ids=torch.arange(P.shape[0]))
    c_w = feat(torch.arange(P.shape[0]) * 7 + 1)       # loss weights per id

    def edges(x, lst):
        i, j = lst.edge_index()
        r = (x[j] + lst.shift_vectors(cell) - x[i]).norm(dim=1)
        return i, j, r

    # -- halo correction: receivers (scheme a) and senders (scheme b), every op form, gradients --
    def scatter_forms(out, idx, src):
        return {
            "index_add_": lambda: out.index_add_(0, idx, src),
            "scatter_add_": lambda: out.scatter_add_(0, idx[:, None].expand_as(src), src),
            "torch.index_add": lambda: torch.index_add(out, 0, idx, src),
            "Tensor.scatter_add": lambda: out.scatter_add(0, idx[:, None].expand_as(src), src),
            "torch.scatter_add": lambda: torch.scatter_add(out, 0, idx[:, None].expand_as(src), src),
        }

    for scheme in ("receiver", "sender"):
        for form in scatter_forms(None, None, None):
            for mode in ("scatter", "gather", "local"):
                if scheme == "sender" and mode != "scatter":
                    continue
                # reference on the whole system
                xr = P.clone().requires_grad_(True)
                i, j, r = edges(xr, full)
                dst, srcid = (i, j) if scheme == "receiver" else (j, i)
                ref = torch.zeros(P.shape[0], 2, dtype=F64).index_add(0, dst, weight(r)[:, None] * feat(srcid))
                (gref,) = torch.autograd.grad((ref * c_w).sum(), xr)
                # distributed
                leaf = padded.clone().requires_grad_(True)
                spec = SPEC_MPNN_HALO.with_storage(HaloStorage(mode))
                S = ShardTensor.wrap(leaf, spec=spec, halo=halo, group=comm)
                i, j, r = edges(S, nl)
                dst, srcid = (i, j) if scheme == "receiver" else (j, i)
                out = S.new_zeros(npad, 2)
                with dispatch_trace() as tr:
                    res = scatter_forms(out, dst, weight(r)[:, None] * feat(pids[srcid]))[form]()
                fired = [e["handler"] for e in tr]
                res = res.to_plain() if isinstance(res, ShardTensor) else res
                own_err = _maxabs(res[:n], ref.detach()[ids_o])
                ghost_err = _maxabs(res[n:], ref.detach()[pids[n:]])
                name = f"halo_{scheme}_{form}_{mode}"
                if mode == "local":
                    C.close(name + "_owned", own_err)
                    C.close(name + "_not_fired", 0.0 if "halo_correction" not in fired else 1.0, 0.0)
                    continue
                C.close(name + "_owned", own_err)
                C.close(name + "_ghosts_refreshed", ghost_err)
                C.close(name + "_fired", 0.0 if fired == ["halo_correction"] else 1.0, 0.0)
                l_local = (res[:n] * c_w[ids_o]).sum()
                (g,) = torch.autograd.grad(l_local, leaf)
                g = halo_reverse(comm, plan, g)
                C.close(name + "_grad", _maxabs(g, gref[ids_o]))

    # -- per-system reduction (in-place and out-of-place), gradients, switch ---------------------------
    for form in ("index_add_", "torch.scatter_add"):
        for on in (True, False):
            xr = P.clone().requires_grad_(True)
            i, j, r = edges(xr, full)
            site = torch.zeros(P.shape[0], dtype=F64).index_add(0, i, weight(r) * torch.exp(-r))
            e_ref = (site ** 2 * c_w[:, 0]).sum()
            (gref,) = torch.autograd.grad(e_ref, xr)
            leaf = padded.clone().requires_grad_(True)
            spec = SPEC_MPNN_HALO.replace(distribution=DistributionSpec(HaloStorage("scatter"), system_reductions=on))
            S = ShardTensor.wrap(leaf, spec=spec, halo=halo, group=comm)
            i, j, r = edges(S, nl)
            site = S.new_zeros(npad).index_add_(0, i, weight(r) * torch.exp(-r))
            vals = site ** 2 * c_w[pids, 0]
            sys_idx = torch.zeros(npad, dtype=torch.int64)
            with dispatch_trace() as tr:
                if form == "index_add_":
                    E = S.new_zeros(1).index_add_(0, sys_idx, vals)
                else:
                    E = torch.scatter_add(S.new_zeros(1), 0, sys_idx, vals)
            fired = [e["handler"] for e in tr]
            name = f"system_{form}_{'on' if on else 'off'}"
            if on:
                C.close(name + "_value", abs(float(E[0].detach()) - float(e_ref.detach())),
                        1e-12 * abs(float(e_ref.detach())))
                C.close(name + "_fired", 0.0 if fired == ["system_reduce"] else 1.0, 0.0)
                # E is identical on every rank: seeded once (a backward differentiates the sum of the seeds)
                (g,) = torch.autograd.grad(seed_once(comm, E.to_plain().sum()), leaf)
                C.close(name + "_grad", _maxabs(halo_reverse(comm, plan, g), gref[ids_o]))
            else:
                C.close(name + "_not_fired", 0.0 if "system_reduce" not in fired else 1.0, 0.0)

    # -- sharded storage: gather (index_select and x[idx]) with padding, scatter with padding ---------
    meta = ShardMeta.contiguous(comm, n)
    sid_pad = halo_forward(comm, plan, meta.global_ids)          # storage id of every padded row
    sid_to_id = torch.zeros(meta.n_global, dtype=torch.int64)
    allpairs = comm.all_gather_object((meta.global_ids, ids_o))
    for a, b in allpairs:
        sid_to_id[a] = b
    req = torch.cat([sid_pad, torch.tensor([meta.n_global, 0])])   # remote rows, a padding slot, id 0
    cq = feat(torch.arange(req.shape[0]) + 100 * comm.rank, 3)
    all_req = comm.all_gather_object((req, cq))
    gref = torch.zeros(meta.n_global, 3, dtype=F64)
    for rq, cc in all_req:
        ok = rq < meta.n_global
        gref.index_add_(0, rq[ok], cc[ok])
    for form in ("index_select", "getitem"):
        leaf = P[sid_to_id[meta.global_ids]].clone().requires_grad_(True)
        X = ShardTensor.wrap(leaf, spec=SPEC_MPNN_HALO.with_storage(ShardedStorage()), shard=meta, group=comm)
        with dispatch_trace() as tr:
            got = X.index_select(0, req) if form == "index_select" else X[req]
        want = torch.cat([P[sid_to_id[sid_pad]], torch.zeros(1, 3, dtype=F64), P[sid_to_id[0:1]]])
        C.close(f"sharded_gather_{form}", _maxabs(got, want))
        C.close(f"sharded_gather_{form}_fired", 0.0 if [e["handler"] for e in tr] == ["sharded_gather"] else 1.0, 0.0)
        (g,) = torch.autograd.grad((got * cq).sum(), leaf)
        C.close(f"sharded_gather_{form}_grad", _maxabs(g, gref[meta.global_ids]))
    for form in ("index_add_", "scatter_add_", "torch.index_add"):
        src0 = feat(torch.arange(req.shape[0]) * 3 + 11 * comm.rank, 3)
        src = src0.clone().requires_grad_(True)
        X = ShardTensor.wrap(P[sid_to_id[meta.global_ids]].clone(), shard=meta, group=comm)
        T = X.new_zeros(n, 3)
        with dispatch_trace() as tr:
            if form == "index_add_":
                res = T.index_add_(0, req, src)
            elif form == "scatter_add_":
                res = T.scatter_add_(0, req[:, None].expand(-1, 3), src)
            else:
                res = torch.index_add(T, 0, req, src)
        want = torch.zeros(meta.n_global, 3, dtype=F64)
        for rank_, (rq, _) in enumerate(all_req):
            sc = feat(torch.arange(rq.shape[0]) * 3 + 11 * rank_, 3)
            ok = rq < meta.n_global
            want.index_add_(0, rq[ok], sc[ok])
        C.close(f"sharded_scatter_{form}", _maxabs(res.to_plain(), want[meta.global_ids]))
        C.close(f"sharded_scatter_{form}_fired", 0.0 if [e["handler"] for e in tr] == ["sharded_scatter"] else 1.0, 0.0)
        cw = feat(meta.global_ids * 5, 3)
        (g,) = torch.autograd.grad((res.to_plain() * cw).sum(), src)
        cw_all = torch.zeros(meta.n_global, 3, dtype=F64)
        for a, _ in allpairs:
            cw_all[a] = feat(a * 5,
                             3)
        gwant = torch.where((req < meta.n_global)[:, None], cw_all[req.clamp(max=meta.n_global - 1)],
                            torch.zeros(1, dtype=F64))
        C.close(f"sharded_scatter_{form}_grad", _maxabs(g, gwant))

    # -- transforms through OpAdapters ---------------------------------------------------------------
    owner_pos = padded - torch.cat([torch.zeros(n, 3, dtype=F64),
                                    plan.ghost_shift.to(F64) @ cell if plan.n_ghost else torch.zeros(0, 3, dtype=F64)])
    D = torch.ops.shardmd_test.double.default
    ES = torch.ops.shardmd_test.edge_sums.default
    RT = torch.ops.shardmd_test.row_total.default

    def halo_shard(x, rows_spec=SPEC_MPNN_HALO):
        return ShardTensor.wrap(x, spec=rows_spec, halo=halo, group=comm)

    # GatherInputs: owned rows -> padded rows (owner positions), gradient = reverse exchange
    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(D, arg_transforms={0: GatherInputs()}))
    leaf = padded[:n].clone().requires_grad_(True)
    with AdapterScope(spec):
        y = D(halo_shard(leaf, spec))
    C.close("transform_GatherInputs", _maxabs(y.to_plain(), 2 * owner_pos))
    wts = feat(pids * 3, 3)
    (g,) = torch.autograd.grad((y.to_plain() * wts).sum(), leaf)
    C.close("transform_GatherInputs_grad", _maxabs(g, halo_reverse(comm, plan, 2 * wts)))
    # SliceOwned
    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(D, arg_transforms={0: SliceOwned()}))
    with AdapterScope(spec):
        y = D(halo_shard(padded.clone(), spec))
    C.close("transform_SliceOwned", _maxabs(y, 2 * padded[:n]))
    # ScatterOutputs / ReverseOutputs on a kernel writing both ends of every edge
    xr = P.clone().requires_grad_(True)
    ref_es = edge_sums(xr, full.edge_index(), full.shift_vectors(cell), P.shape[0])
    for tname, tr_ in (("ScatterOutputs", ScatterOutputs()), ("ReverseOutputs", ReverseOutputs())):
        spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(ES, output_transforms={0: tr_}))
        with AdapterScope(spec):
            y = ES(halo_shard(padded.clone(), spec), nl.edge_index(), nl.shift_vectors(cell), npad)
        y = y.to_plain() if isinstance(y, ShardTensor) else y
        C.close(f"transform_{tname}_owned", _maxabs(y[:n], ref_es.detach()[ids_o]))
        if tname == "ScatterOutputs":
            C.close("transform_ScatterOutputs_ghosts", _maxabs(y[n:], ref_es.detach()[pids[n:]]))
        else:
            C.close("transform_ReverseOutputs_rows", 0.0 if y.shape[0] == n else 1.0, 0.0)
    # without the transform the owned rows are wrong on K > 1 ranks (the documented failure)
    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(ES))
    with AdapterScope(spec):
        y = ES(halo_shard(padded.clone(), spec), nl.edge_index(), nl.shift_vectors(cell), npad)
    wrong = _maxabs(y.to_plain()[:n], ref_es.detach()[ids_o])
    C.res["transform_missing_ScatterOutputs_err"] = {"err": float(comm.all_reduce(torch.tensor([wrong]), "max")[0]),
                                                     "ok": True}
    # AllReduceSum: a per-rank total over owned rows
    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(RT, arg_transforms={0: SliceOwned()},
                                                    output_transforms={0: AllReduceSum()}))
    with AdapterScope(spec):
        y = RT(halo_shard(padded.clone(), spec))
    C.close("transform_AllReduceSum", _maxabs(y, P.sum(0)), 1e-11)
    # the all-reduce's backward is its adjoint: every rank seeds its sum(y) = sum_s 2 z_s, so
    # the objective sum_r sum(y) = K * sum_s 2 z_s and d/dz = 2K on every rank
    z = torch.ones(3, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(all_reduce_sum(comm, z * 2).sum(), z)
    C.close("all_reduce_adjoint_backward", _maxabs(g, 2 * comm.size * torch.ones(3, dtype=F64)))
    # sharded: GatherInputsFull + SliceOutputsOwned, and ScatterOutputs as a reduce to owners
    spec_sh = MLIPSpec(distribution=DistributionSpec(ShardedStorage())).with_custom_ops(
        OpAdapter(D, arg_transforms={0: GatherInputsFull()}, output_transforms={0: SliceOutputsOwned()}))
    leaf = P[sid_to_id[meta.global_ids]].clone().requires_grad_(True)
    with AdapterScope(spec_sh):
        y = D(ShardTensor.wrap(leaf, spec=spec_sh, shard=meta, group=comm))
    C.close("transform_GatherInputsFull_SliceOutputsOwned", _maxabs(y.to_plain(), 2 * leaf.detach()))
    (g,) = torch.autograd.grad((y.to_plain() * feat(meta.global_ids, 3)).sum(), leaf)
    C.close("transform_GatherInputsFull_grad", _maxabs(g, 2 * feat(meta.global_ids, 3)))
    from shardmd.domain.adapters import _full_gather  # the transform itself, to see the padding row
    fullx = _full_gather(ShardTensor.wrap(leaf.detach(), shard=meta, group=comm), leaf.detach())
    C.close("transform_GatherInputsFull_rows", _maxabs(fullx[:-1], P[sid_to_id]) + float(fullx[-1].abs().max()))
    spec_sc = MLIPSpec(distribution=DistributionSpec(ShardedStorage())).with_custom_ops(
        OpAdapter(ES, output_transforms={0: ScatterOutputs()}))
    i_s, j_s = meta.global_ids[nl.centers()], sid_pad[nl.neighbors.long()]
    gshift = torch.zeros(npad, 3, dtype=torch.int32)
    if plan.n_ghost:
        gshift[n:] = plan.ghost_shift
    sh = (nl.shifts + gshift[nl.neighbors.long()]).to(F64) @ cell
    fullpos = torch.zeros(meta.n_global + 1, 3, dtype=F64)
    fullpos[:-1] = P[sid_to_id]
    with AdapterScope(spec_sc):
        # only the centre rows' edges half-weighted: each directed edge exists once globally
        y = ES(ShardTensor.wrap(fullpos, spec=spec_sc, shard=meta, group=comm), torch.stack([i_s, j_s]), sh,
               meta.n_global + 1)
    C.close("transform_ScatterOutputs_sharded", _maxabs(y, ref_es.detach()[sid_to_id[meta.global_ids]]))

    # -- LJ through its custom op and the pair preset == the direct model, bit for bit ------------------
    from shardmd.models.lj import LennardJones
    from shardmd.models.lj_op import LennardJonesOp

    lj = LennardJones({"Ar": 0.0104, "Kr": 0.014}, {"Ar": 3.40, "Kr": 3.65}, cutoff=4.5)
    a = DistributedModel(lj).compute(ctx, padded, d["numbers"], nl)
    b = DistributedModel(LennardJonesOp(lj)).compute(ctx, padded, d["numbers"], nl)
    err = max(float((a[k] - b[k]).abs().max()) for k in ("energy", "forces", "virial", "energies"))
    C.close("lj_op_equals_direct_bitwise", err, 0.0)
    C.close("lj_op_keys", 0.0 if set(a) == set(b) else 1.0, 0.0)
    # the engine's direct call (LennardJonesOp(direct=True): the op's body without the op) == the op,
    # bit for bit, for each sum the engine asks for (all; forces alone; forces and virial)
    for flags in ((False, False), (True, False), (False, True)):
        outs = []
        for direct in (False, True):
            m = LennardJonesOp(lj, direct=direct)
            dm = DistributedModel(m)
            C.close(f"lj_direct_taken_{direct}", 0.0 if (dm.direct is not None) == direct else 1.0, 0.0)
            m.forces_only, m.virial_only = flags
            try:
                outs.append(dm.compute(ctx, padded, d["numbers"], nl))
            finally:
                m.forces_only = m.virial_only = False
        p_, q_ = outs
        err = max(_nan_same(p_[k], q_[k]) for k in ("energy", "forces", "virial", "energies"))
        C.close(f"lj_direct_equals_op_bitwise_{flags[0]}_{flags[1]}", err + (0.0 if set(p_) == set(q_) else 1.0), 0.0)
    return C.res


def _nan_same(x: torch.Tensor, y: torch.Tensor) -> float:
    """0 when ``x`` and ``y`` are equal bit for bit with NaN in the same places, else the largest
    difference (inf for NaN in different places)."""
    if x.shape != y.shape or not torch.equal(x.isnan(), y.isnan()):
        return float("inf")
    keep = ~x.isnan()
    return float((x[keep] - y[keep]).abs().max()) if bool(keep.any()) else 0.0


def run(comm, argv):
    """:func:`run_checks` on ``comm``; rank 0 writes ``argv[0]`` (JSON). tests/mpi/world.py runs it too."""
    res = run_checks(comm)
    if comm.is_root:
        Path(argv[0]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    from launch import main

    main(run)
