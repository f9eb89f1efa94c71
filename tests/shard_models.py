"""Models with deliberately wrong (or deliberately unusual) distribution specs, one per
documented failure mode of trace_and_validate, plus their corrected specs.  Module-scope
factories: the validator's workers import them by name."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    GatherInputs,
    ModelConfig,
    NeighborConfig,
    OpAdapter,
    OutputKind,
    PythonAdapter,
    current_scope,
    system_sum,
)
from shardmd.domain.neighbors import build_neighbor_list

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import byo_mpnn
import byo_warp_op


def sample():
    return byo_mpnn.sample_system()


def small_sample():
    return byo_mpnn.sample_system((4, 4, 4), seed=5)


# -- correct models ---------------------------------------------------------------------------------
def mpnn():
    return byo_mpnn.ToyMPNN()


def mpnn_sharded():
    return byo_mpnn.make_sharded_model()


def warp_pair():
    return byo_warp_op.WarpPairModel()


def lj_op():
    from shardmd.models.lj import LennardJones
    from shardmd.models.lj_op import LennardJonesOp

    return LennardJonesOp(LennardJones({"Ar": 0.0104, "Kr": 0.014}, {"Ar": 3.40, "Kr": 3.65}, cutoff=4.5))


# -- failure modes -----------------------------------------------------------------------------------
def mpnn_duplicate_all_reduce():
    """energy is summed by the per-system handler AND listed in all_reduce_outputs."""
    return byo_mpnn.ToyMPNN(spec=SPEC_MPNN_HALO.replace(name="dup", all_reduce_outputs={"energy"}))


def lj_duplicate_all_reduce():
    """the LJ adapter sums energy and virial; the spec lists both again."""
    from shardmd.models.lj_op import SPEC_LJ

    m = lj_op()
    m.distribution_spec = SPEC_LJ.replace(all_reduce_outputs={"energy", "virial"})
    return m


def warp_missing_scatter_outputs():
    spec = SPEC_MPNN_HALO.replace(name="no-scatter").with_custom_ops(OpAdapter(byo_warp_op.OP))
    return byo_warp_op.WarpPairModel(spec=spec)


def warp_extra_gather_inputs():
    spec = byo_warp_op.SPEC_WARP_PAIR.replace(name="extra-gather")
    ad = spec.distribution.custom_ops[0]
    spec = spec.replace(distribution=type(spec.distribution)(
        storage=spec.distribution.storage, custom_ops=(OpAdapter(ad.op, arg_transforms={0: GatherInputs()},
                                                                  output_transforms=ad.output_transforms),)))
    return byo_warp_op.WarpPairModel(spec=spec)


def mol_sum(values, index):
    """A third-party style per-system helper: sizes its output from the index and allocates
    with torch.zeros (so no ShardTensor ever reaches it)."""
    out = torch.zeros(int(index.max()) + 1, *values.shape[1:], dtype=values.dtype)
    return out.index_add_(0, index, values)


def dist_mol_sum(values, index):
    """Distribution-aware replacement for :func:`mol_sum`."""
    return system_sum(values, index, 1)


class HelperModel:
    """Site energies of the query points only (plain tensors), summed by :func:`mol_sum`
    looked up at call time (so an adapter can swap it)."""

    def __init__(self, spec=None, cutoff: float = 4.5):
        self.rc = cutoff
        self.model_config = ModelConfig(outputs=("energy", "forces"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff))
        self.distribution_spec = spec or SPEC_MPNN_HALO.replace(name="helper")

    @property
    def cutoff(self):
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        i, j = nl.edge_index()
        r = (positions[j] + nl.shift_vectors(cell) - positions[i]).norm(dim=1)
        w = torch.where(r < self.rc, (1 - (r / self.rc) ** 2) ** 2, torch.zeros_like(r))
        site = torch.zeros(nl.n_query, dtype=r.dtype).index_add(0, i, torch.exp(-r) * w)
        energy = sys.modules[__name__].mol_sum(site ** 2, torch.zeros(nl.n_query, dtype=torch.int64))
        return {"energy": energy[0]}


def helper_undeclared():
    return HelperModel()


def helper_declared():
    spec = SPEC_MPNN_HALO.replace(name="helper-fixed").with_helpers(
        PythonAdapter(__name__, "mol_sum", dist_mol_sum))
    return HelperModel(spec)


class SelfListModel:
    """Builds its own full neighbour list over every point it is given (ghosts included),
    so its owned rows are complete without help; the halo correction then double counts."""

    def __init__(self, spec=None, cutoff: float = 4.5):
        self.rc = cutoff
        self.model_config = ModelConfig(outputs=("energy", "forces", "energies"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff))
        self.distribution_spec = spec or SPEC_MPNN_HALO.replace(name="self-list")

    @property
    def cutoff(self):
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        # a list over the rank's own points (ghosts are images already) is periodic along the
        # axes the rank's search treats so; pbc is the system's
        scope = current_scope()
        own = build_neighbor_list(positions.detach(), cell, scope.ctx.local_pbc if scope is not None else pbc,
                                  self.rc)
        i, j = own.edge_index()
        r = (positions.index_select(0, j) + own.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        w = torch.where(r < self.rc, (1 - (r / self.rc) ** 2) ** 2, torch.zeros_like(r))
        coord = positions.new_zeros(positions.shape[0]).index_add_(0, i, w * torch.exp(-r))
        energies = torch.sqrt(coord + 1.0)
        system = torch.zeros(positions.shape[0], dtype=torch.int64)
        energy = positions.new_zeros(1).index_add_(0, system, energies)
        return {"energy": energy[0], "energies": energies}


def self_list():
    return SelfListModel()


def mpnn_unknown_kind():
    """energies not declared in output_kinds: warns, classified by shape."""
    kinds = {"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE}
    return byo_mpnn.ToyMPNN(spec=SPEC_MPNN_HALO.replace(name="undeclared", output_kinds=kinds,
                                                        owned_only_outputs={"forces"}))
