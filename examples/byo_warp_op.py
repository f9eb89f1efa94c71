"""Bring your own model (2): a Warp kernel behind a ``torch.library.custom_op``.

The op ``shardmd_examples::pair_site_energies`` runs a Warp kernel over the edges of a
neighbour list and accumulates a smooth pair energy into BOTH ends of every edge (a quarter
each: the list is full, so every pair appears twice).  Its gradient is a second Warp
kernel, attached with ``register_autograd``, so autograd forces flow through it.

Kernels read raw buffers: ShardTensor metadata cannot reach them.  Under decomposition an
edge whose far end is a halo copy writes a partial site energy into a halo row; the
owner's row must receive it.  The spec says so with one OpAdapter:

    OpAdapter(torch.ops.shardmd_examples.pair_site_energies.default,
              output_transforms={0: ScatterOutputs()})

(no input transform: DistributedModel hands the model halo-padded positions already).
Run ``python examples/byo_warp_op.py [world_size ...]`` to validate it on real ranks.
"""
from __future__ import annotations

import sys

import torch
import warp as wp

from shardmd.domain.api import SPEC_MPNN_HALO, ModelConfig, NeighborConfig, OpAdapter, ScatterOutputs

wp.config.quiet = True
wp.init()


@wp.func
def _pair(r: wp.float64, a: wp.float64, rho: wp.float64, rc: wp.float64):
    """(u, du/dr) of u = a exp(-r / rho) (1 - (r/rc)^2)^2 inside rc, 0 beyond."""
    zero = wp.float64(0.0)
    one = wp.float64(1.0)
    if r >= rc:
        return zero, zero
    x = r / rc
    s = one - x * x
    env = s * s
    denv = wp.float64(-4.0) * s * x / rc
    e = a * wp.exp(-r / rho)
    return e * env, e * (denv - env / rho)


@wp.kernel
def _site_energy_kernel(x: wp.array(dtype=wp.vec3d), ei: wp.array(dtype=wp.int32), ej: wp.array(dtype=wp.int32),
                        shift: wp.array(dtype=wp.vec3d), p: wp.array(dtype=wp.float64),
                        out: wp.array(dtype=wp.float64)):
    t = wp.tid()
    i = ei[t]
    j = ej[t]
    d = x[j] + shift[t] - x[i]
    u, du = _pair(wp.length(d), p[0], p[1], p[2])
    q = wp.float64(0.25) * u
    wp.atomic_add(out, i, q)
    wp.atomic_add(out, j, q)


@wp.kernel
def _site_energy_grad_kernel(x: wp.array(dtype=wp.vec3d), ei: wp.array(dtype=wp.int32),
                             ej: wp.array(dtype=wp.int32), shift: wp.array(dtype=wp.vec3d),
                             p: wp.array(dtype=wp.float64), g: wp.array(dtype=wp.float64),
                             gx: wp.array(dtype=wp.vec3d)):
    t = wp.tid()
    i = ei[t]
    j = ej[t]
    d = x[j] + shift[t] - x[i]
    r = wp.length(d)
    u, du = _pair(r, p[0], p[1], p[2])
    c = wp.float64(0.25) * (g[i] + g[j]) * du / r
    wp.atomic_add(gx, j, c * d)
    wp.atomic_sub(gx, i, c * d)


def _launch(kernel, n_edges, device, *arrays):
    wp.launch(kernel, dim=n_edges, inputs=list(arrays), device=device)


def _wp(t, dtype):
    return wp.from_torch(t.detach().contiguous(), dtype=dtype, requires_grad=False)


@torch.library.custom_op("shardmd_examples::pair_site_energies", mutates_args=())
def pair_site_energies(positions: torch.Tensor, edge_index: torch.Tensor, shifts: torch.Tensor,
                       params: torch.Tensor) -> torch.Tensor:
    """(n,) site energies of the points of ``positions`` (n, 3) from the edges (2, E)."""
    out = torch.zeros(positions.shape[0], dtype=positions.dtype, device=positions.device)
    ei, ej = edge_index[0].to(torch.int32), edge_index[1].to(torch.int32)
    if ei.numel():
        dev = "cpu" if positions.device.type == "cpu" else f"cuda:{positions.device.index or 0}"
        _launch(_site_energy_kernel, ei.numel(), dev, _wp(positions, wp.vec3d), _wp(ei, wp.int32), _wp(ej, wp.int32),
                _wp(shifts, wp.vec3d), _wp(params, wp.float64), _wp(out, wp.float64))
    return out


@torch.library.custom_op("shardmd_examples::pair_site_energies_grad", mutates_args=())
def pair_site_energies_grad(positions: torch.Tensor, edge_index: torch.Tensor, shifts: torch.Tensor,
                            params: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(n, 3) gradient of sum(grad * site energies) with respect to the positions."""
    gx = torch.zeros_like(positions)
    ei, ej = edge_index[0].to(torch.int32), edge_index[1].to(torch.int32)
    if ei.numel():
        dev = "cpu" if positions.device.type == "cpu" else f"cuda:{positions.device.index or 0}"
        _launch(_site_energy_grad_kernel, ei.numel(), dev, _wp(positions, wp.vec3d), _wp(ei, wp.int32),
                _wp(ej, wp.int32), _wp(shifts, wp.vec3d), _wp(params, wp.float64), _wp(grad, wp.float64),
                _wp(gx, wp.vec3d))
    return gx


@pair_site_energies.register_fake
def _(positions, edge_index, shifts, params):
    return positions.new_empty(positions.shape[0])


@pair_site_energies_grad.register_fake
def _(positions, edge_index, shifts, params, grad):
    return torch.empty_like(positions)


def _setup_context(ctx, inputs, output):
    positions, edge_index, shifts, params = inputs
    ctx.save_for_backward(positions, edge_index, shifts, params)


def _backward(ctx, grad):
    positions, edge_index, shifts, params = ctx.saved_tensors
    return pair_site_energies_grad(positions, edge_index, shifts, params, grad.contiguous()), None, None, None


pair_site_energies.register_autograd(_backward, setup_context=_setup_context)

OP = torch.ops.shardmd_examples.pair_site_energies.default
SPEC_WARP_PAIR = SPEC_MPNN_HALO.replace(name="warp-pair-sites").with_custom_ops(
    OpAdapter(OP, output_transforms={0: ScatterOutputs()}))


class WarpPairModel:
    """Energy = sum of Warp-computed site energies; forces by autograd through the op."""

    def __init__(self, a: float = 2.0, rho: float = 0.8, cutoff: float = 4.5, spec=SPEC_WARP_PAIR):
        self.params = torch.tensor([a, rho, cutoff], dtype=torch.float64)
        self.rc = float(cutoff)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces"), autograd_outputs={"forces": "energy"},
                                        neighbors=NeighborConfig(cutoff))
        self.distribution_spec = spec

    @property
    def cutoff(self) -> float:
        return self.rc

    def compute(self, positions, cell, pbc, numbers, nl):
        energies = pair_site_energies(positions, nl.edge_index(), nl.shift_vectors(cell),
                                      self.params.to(positions.device))
        system = torch.zeros(positions.shape[0], dtype=torch.int64, device=positions.device)
        energy = positions.new_zeros(1).index_add_(0, system, energies)
        return {"energy": energy[0], "energies": energies}


def make_model():
    return WarpPairModel()


def sample_system(repeat=(4, 4, 4), seed: int = 2):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from byo_mpnn import sample_system as s

    return s(repeat, seed)


if __name__ == "__main__":
    from shardmd.domain.api import trace_and_validate

    for k in [int(a) for a in sys.argv[1:]] or [2, 3, 4]:
        rep = trace_and_validate(make_model, sample_system(), world_size=k, atol=0.0, rtol=1e-10)
        print(rep.summary())
        if not rep.ok:
            print("next:", rep.next_action)
