"""Models for the ShardTensor extras (charges, virial, intent helpers, JitAdapter, compile).

Module-scope factories: trace_and_validate's workers import them by name.  Also runnable
as a worker: ``mpiexec -n K python tests/mpi/shard_extras.py OUT.json`` runs
:func:`run_checks` (direct checks of the intent helpers on K ranks; in-process on one).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

import byo_mpnn  # noqa: E402

from shardmd.domain.api import (  # noqa: E402
    SPEC_MPNN_HALO,
    SPEC_MPNN_SHARDED,
    CompilePolicy,
    GraphPadder,
    JitAdapter,
    ModelConfig,
    NeighborConfig,
    all_reduce_sum,
    autograd_target,
    current_dd_context,
    refresh_neighbors,
    seed_once,
    system_sum,
    to_local,
)

F64 = torch.float64


# -- samples -------------------------------------------------------------------------------------------
def triclinic_sample(repeat=(4, 4, 4), seed: int = 7):
    """The MPNN example's rattled Ar/Kr fcc, sheared into a triclinic cell, with charges."""
    atoms = byo_mpnn.sample_system(repeat, seed=seed)
    c = atoms.cell.array.copy()
    c[1, 0] += 2.5
    c[2, 0] += 1.5
    c[2, 1] -= 2.0
    atoms.set_cell(c, scale_atoms=True)
    rng = np.random.default_rng(seed)
    q = rng.normal(0.0, 0.4, len(atoms))
    atoms.set_initial_charges(q - q.mean())
    return atoms


# -- 1. charges + virial (autograd forces, strain virial) --------------------------------------------
class ChargedMPNN(byo_mpnn.ToyMPNN):
    """The MPNN example plus a screened charge-charge pair term; charges are a per-point
    input (``ModelConfig.point_inputs``); virial and stress by strain."""

    def __init__(self, spec=SPEC_MPNN_HALO, **kw):
        super().__init__(spec=spec, **kw)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial", "stress"),
                                        autograd_outputs={"forces": "energy"},
                                        strain_outputs={"virial": "energy", "stress": "energy"},
                                        neighbors=NeighborConfig(self.rc), point_inputs=("charges",))

    def compute(self, positions, cell, pbc, numbers, nl, charges=None):
        out = super().compute(positions, cell, pbc, numbers, nl)
        if charges is None:
            return out
        i, j = nl.edge_index()
        r = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        inside = r < self.rc
        x = torch.where(inside, r / self.rc, torch.zeros_like(r))
        env = torch.where(inside, (1 - x * x) ** 2, torch.zeros_like(r))
        pair = 0.5 * charges.index_select(0, i) * charges.index_select(0, j) * torch.exp(-0.5 * r) * env
        site = positions.new_zeros(positions.shape[0]).index_add_(0, i, pair)
        system = torch.zeros(positions.shape[0], dtype=torch.int64, device=positions.device)
        e = positions.new_zeros(1).index_add_(0, system, site)
        return {"energy": out["energy"] + e[0], "energies": out["energies"] + site}


def charged():
    return ChargedMPNN()


def charged_sharded():
    return ChargedMPNN(spec=SPEC_MPNN_SHARDED)


def charged_compiled():
    """Compiled (aot_eager) and padded to buckets."""
    pol = CompilePolicy(enabled=True, backend="aot_eager", padder=GraphPadder(point_multiple=32, edge_multiple=256))
    return ChargedMPNN(spec=SPEC_MPNN_HALO.replace(name="compiled").with_compile(pol))


def charged_padded_eager():
    """Padding without compilation: the policy's backend is eager dynamo."""
    pol = CompilePolicy(enabled=True, backend="eager", padder=GraphPadder(point_multiple=64, edge_multiple=1000))
    return ChargedMPNN(spec=SPEC_MPNN_HALO.replace(name="padded").with_compile(pol))


# -- 2. a model that differentiates itself and refreshes a per-point quantity ------------------------
SPEC_SELF_FORCES = SPEC_MPNN_HALO.replace(name="self-forces", owned_only_outputs={"energies"},
                                          reverse_outputs={"forces"})


class SelfForceModel:
    """Coordination numbers of the query points (complete on owned rows, zero on halo rows)
    are refreshed with ``refresh_neighbors`` and used by a second pass; forces come from
    ``torch.autograd.grad`` with respect to ``autograd_target(positions)`` (halo rows are
    partial sums: ``reverse_outputs``)."""

    def __init__(self, cutoff: float = 4.5, spec=SPEC_SELF_FORCES):
        self.rc = cutoff
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces"), neighbors=NeighborConfig(cutoff),
                                        autograd_inputs={"positions"})
        self.distribution_spec = spec
        self.scopes = []

    @property
    def cutoff(self):
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        ctx = current_dd_context()
        self.scopes.append(None if ctx is None else (ctx.n_owned, ctx.n_padded, nl.n_query))
        i, j = nl.edge_index()
        r = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        inside = r < self.rc
        x = torch.where(inside, r / self.rc, torch.zeros_like(r))
        w = torch.where(inside, (1 - x * x) ** 2 * torch.exp(-r), torch.zeros_like(r))
        coord = torch.zeros(positions.shape[0], dtype=r.dtype).index_add(0, i, w)   # plain: halo rows stay 0
        coord = refresh_neighbors(coord)                                            # halo rows = owners' values
        site = 0.5 * torch.zeros(positions.shape[0], dtype=r.dtype).index_add(0, i, w * coord.index_select(0, j))
        energies = site + 0.1 * torch.sqrt(1.0 + coord)
        energy = system_sum(energies, torch.zeros(positions.shape[0], dtype=torch.int64), 1)[0]
        (g,) = torch.autograd.grad(seed_once(energy), autograd_target(positions))   # replicated: seeded once
        return {"energy": energy.detach(), "energies": energies.detach(), "forces": -g}


def self_forces():
    return SelfForceModel()


# -- 3. an opaque (TorchScript) per-system helper swapped by a JitAdapter ----------------------------
@torch.jit.script
def jit_mol_sum(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.zeros([int(index.max()) + 1], dtype=values.dtype)
    return out.index_add(0, index, values)


def dist_mol_sum(values, index):
    return system_sum(values, index, 1)


def make_reduced_mol_sum(scope, original):
    """JitAdapter factory: the original on this rank's owned rows, summed over ranks."""
    def reduced(values, index):
        return all_reduce_sum(scope.comm, original(to_local(values), to_local(index)))
    return reduced


class JitHelperModel:
    """Site energies of the query points summed by the scripted ``jit_mol_sum`` (looked up at
    call time)."""

    def __init__(self, spec=None, cutoff: float = 4.5):
        self.rc = cutoff
        self.model_config = ModelConfig(outputs=("energy", "forces"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff), strain_outputs={"virial": "energy"})
        self.distribution_spec = spec or SPEC_MPNN_HALO.replace(name="jit-undeclared")

    @property
    def cutoff(self):
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        i, j = nl.edge_index()
        r = (positions[j] + nl.shift_vectors(cell) - positions[i]).norm(dim=1)
        w = torch.where(r < self.rc, (1 - (r / self.rc) ** 2) ** 2, torch.zeros_like(r))
        site = torch.zeros(nl.n_query, dtype=r.dtype).index_add(0, i, torch.exp(-r) * w)
        energy = sys.modules[__name__].jit_mol_sum(site ** 2, torch.zeros(nl.n_query, dtype=torch.int64))
        return {"energy": energy[0]}


def jit_undeclared():
    return JitHelperModel()


def jit_declared():
    return JitHelperModel(SPEC_MPNN_HALO.replace(name="jit").with_helpers(
        JitAdapter(f"{__name__}:jit_mol_sum", make_reduced_mol_sum, factory=True)))


def jit_declared_plain():
    return JitHelperModel(SPEC_MPNN_HALO.replace(name="jit-plain").with_helpers(
        JitAdapter(f"{__name__}:jit_mol_sum", dist_mol_sum)))


# -- direct checks of the intent helpers on K ranks ---------------------------------------------------
def run_checks(comm) -> dict:
    from shardmd.domain.api import DistributedModel, ShardTensor, scatter_to_owners
    from shardmd.domain.validate_worker import rank_domain

    torch.set_num_threads(1)
    res = {}

    def close(name, err, tol=1e-12):
        g = float(comm.all_reduce(torch.tensor([float(err)], dtype=F64), "max")[0])
        res[name] = {"err": g, "ok": bool(g <= tol)}

    atoms = triclinic_sample()
    s = {"positions": atoms.positions, "cell": atoms.cell.array, "pbc": atoms.pbc, "numbers": atoms.numbers}
    d = rank_domain(comm, s, 5.0, 5.0)
    ctx, pids = d["ctx"], d["ids"]
    n, npad = ctx.n_owned, ctx.n_padded
    feat = torch.sin(pids.to(F64)[:, None] * 0.37 + torch.arange(2, dtype=F64))

    class Probe:
        """Runs ``fn`` inside DistributedModel's scope."""
        cutoff = 4.5
        model_config = ModelConfig(outputs=("energy",), neighbors=NeighborConfig(4.5), autograd_inputs={"positions"})
        distribution_spec = SPEC_MPNN_HALO

        def __init__(self, fn):
            self.fn = fn

        def compute(self, positions, cell, pbc, numbers, nl):
            return self.fn(positions)

    def probe(fn):
        DistributedModel(Probe(fn)).compute(ctx, d["padded"], d["numbers"], d["nl"])

    seen = {}

    def refresh(positions):
        x = feat.clone()
        x[n:] = 0.0
        y = refresh_neighbors(x)
        seen["padded_in"] = float((y - feat).abs().max())
        seen["is_shard"] = isinstance(y, ShardTensor) and y.n_owned == n
        y2 = refresh_neighbors(feat[:n])
        seen["owned_in"] = float((y2 - feat).abs().max())
        # backward of the refresh = halo partial sums added to the owners
        leaf = feat[:n].clone().requires_grad_(True)
        wts = torch.cos(pids.to(F64))[:, None].expand(npad, 2)
        (g,) = torch.autograd.grad((refresh_neighbors(leaf) * wts).sum(), leaf)
        seen["grad"] = float((g - scatter_to_owners(wts)).abs().max())
        seen["leaf"] = autograd_target(positions) is autograd_target() and autograd_target(positions).is_leaf
        seen["ctx"] = current_dd_context().n_padded == npad
        return {"energy": positions.new_zeros(())}

    probe(refresh)
    close("refresh_padded_rows", seen["padded_in"])
    close("refresh_owned_rows", seen["owned_in"])
    close("refresh_result_is_shardtensor", 0.0 if seen["is_shard"] else 1.0, 0.0)
    close("refresh_backward_is_reverse", seen["grad"])
    close("autograd_target_is_the_leaf", 0.0 if seen["leaf"] else 1.0, 0.0)
    close("current_dd_context_counts", 0.0 if seen["ctx"] else 1.0, 0.0)
    outside = refresh_neighbors(feat) is feat and current_dd_context() is None
    close("outside_scope_identity", 0.0 if outside else 1.0, 0.0)
    return res


def run(comm, argv):
    """:func:`run_checks` on ``comm``; rank 0 writes ``argv[0]`` (JSON). tests/mpi/world.py runs it too."""
    res = run_checks(comm)
    if comm.is_root:
        Path(argv[0]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    from launch import main

    main(run)
