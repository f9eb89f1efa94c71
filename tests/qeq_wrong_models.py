"""The charge-equilibration model of tests/qeq_model.py made multi-domain wrongly, one way per
validator diagnosis, with its controls.

- ``identity_backward``: the global sum of 1/J goes through an all-reduce whose backward is
  the identity (energies right, forces wrong): ``collective_backward``;
- ``seeded_per_rank``: the model differentiates the replicated energy itself without
  ``seed_once``: ``replicated_objective_seeded_per_rank``;
- ``helper_sum``: the sum of 1/J by a helper scattering into ``torch.zeros(1)``, reused in the
  charges: ``helper_sum_reused``;
- ``op_plain``: the environment features by a custom op called on plain tensors, its
  OpAdapter never fires: ``adapter_never_fired``;
- ``op_no_scatter``: the same op (a sender-side sum) reached by the positions but declared
  without ``ScatterOutputs``: ``missing_scatter_outputs``; ``op_ok`` declares it (control).
"""
from __future__ import annotations

import qeq_model as Q
import torch

from shardmd.domain.api import (
    ModelConfig,
    NeighborConfig,
    OpAdapter,
    ScatterOutputs,
    autograd_target,
    current_scope,
    system_sum,
)

F64 = torch.float64


@torch.library.custom_op("shardmd_qeq::sender_sum", mutates_args=())
def sender_sum(template: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(rows of template, F): values summed onto the rows ``index`` (a sender-side scatter)."""
    return values.new_zeros((template.shape[0], values.shape[1])).index_add(0, index, values)


@sender_sum.register_fake
def _(template, index, values):
    return values.new_empty((template.shape[0], values.shape[1]))


def _sender_backward(ctx, grad):
    return None, None, grad.index_select(0, ctx.index)


def _sender_setup(ctx, inputs, output):
    ctx.index = inputs[1]


sender_sum.register_autograd(_sender_backward, setup_context=_sender_setup)
OP = torch.ops.shardmd_qeq.sender_sum.default


class _IdentityBackwardSum(torch.autograd.Function):
    """A sum over ranks whose backward hands each rank its own cotangent back."""

    @staticmethod
    def forward(ctx, x):
        s = current_scope()
        return s.comm.all_reduce(x.detach()) if s is not None and s.comm.size > 1 else x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def mol_sum(values, index):
    """A per-system sum written for one process."""
    return torch.zeros(1, dtype=values.dtype).index_add(0, index, values)


class Variant(Q.QEqModel):
    def __init__(self, how: str, spec=Q.SPEC_QEQ):
        super().__init__(spec)
        self.how = how

    def features(self, positions, i, j, r):
        fc = Q.cutoff_fn(r)
        vals = torch.stack([fc, fc * torch.exp(-r)], dim=1)
        if self.how.startswith("op"):
            template = positions.as_subclass(torch.Tensor) if self.how == "op_plain" else positions
            return sender_sum(template, j, vals)   # by symmetry of the full list, the receiver sums
        return positions.new_zeros((positions.shape[0], 2)).index_add_(0, i, vals)

    def inv_hardness_sum(self, positions, hard, batch):
        if self.how == "identity_backward":
            n = current_scope().n_owned if current_scope() is not None else hard.shape[0]
            return _IdentityBackwardSum.apply((1.0 / hard[:n]).sum().reshape(1))
        if self.how == "helper_sum":
            return mol_sum(1.0 / hard, batch)
        return positions.new_zeros(1).index_add_(0, batch, 1.0 / hard)

    def compute(self, positions, cell, pbc, numbers, nl):
        n = positions.shape[0]
        i, j = nl.edge_index()
        r = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        chi, hard = Q.site_params(self.features(positions, i, j, r), numbers, self.w)
        batch = torch.zeros(n, dtype=torch.int64)
        lam = (Q.TOTAL_CHARGE + system_sum(chi / hard, batch, 1)) / self.inv_hardness_sum(positions, hard, batch)
        q = (lam[0] - chi) / hard
        pair = 0.5 * positions.new_zeros(n).index_add_(0, i, Q.pair_energy(r, q[i], q[j]))
        q2 = q * q
        s2 = system_sum(q2, batch, 1)
        energies = chi * q + 0.5 * hard * q2 + pair + Q.KAPPA * s2[0] * q2
        energy = positions.new_zeros(1).index_add_(0, batch, energies)
        out = {"energy": energy, "energies": energies, "charges": q}
        if self.how == "seeded_per_rank":
            (g,) = torch.autograd.grad(energy.sum(), autograd_target(positions))
            out = {k: v.detach() for k, v in out.items()} | {"forces": -g}
        return out


SPEC_OP_OK = Q.SPEC_QEQ.replace(name="qeq-op").with_custom_ops(OpAdapter(OP, output_transforms={0: ScatterOutputs()}))
SPEC_OP_NO_SCATTER = Q.SPEC_QEQ.replace(name="qeq-op-no-scatter").with_custom_ops(OpAdapter(OP))
SPEC_SELF = Q.SPEC_QEQ.replace(name="qeq-self", reverse_outputs={"forces"}, owned_only_outputs={"energies", "charges"})


def identity_backward():
    return Variant("identity_backward")


def seeded_per_rank():
    m = Variant("seeded_per_rank", SPEC_SELF)
    m.model_config = ModelConfig(outputs=("energy", "energies", "charges", "forces"),
                                 neighbors=NeighborConfig(Q.CUTOFF), autograd_inputs={"positions"})
    return m


def helper_sum():
    return Variant("helper_sum")


def op_plain():
    return Variant("op_plain", SPEC_OP_OK)


def op_no_scatter():
    return Variant("op_no_scatter", SPEC_OP_NO_SCATTER)


def op_ok():
    return Variant("op_ok", SPEC_OP_OK)


def small_sample():
    """32 points in a 10.5 Å box: on two ranks every rank holds every point."""
    return Q.sample((2, 2, 2))
