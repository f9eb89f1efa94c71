"""One MACE call over many independent systems (``MaceModel.compute_batch``).

The systems' graphs are joined into one: nodes concatenated, each system's edges offset by the
nodes before it, each edge's vector ``x_i - x_j - shift @ cell`` taken with its own system's
cell. MACE's layers are local (messages run along edges only), so one forward pass gives every
node the energy it has in its own system's call; sums over a system's nodes (energy) and edges
(virial) are then taken per system. One call instead of one per system is what keeps a GPU
busy with many small systems (docs/batch.md).

    item:   (positions (n_i, 3) Å, cell (3, 3) Å, pbc (3,), numbers (n_i,), nl) of one whole
            system (one domain, no ghosts: the list's query rows are all its points)
    result: per item {"energy": () eV, "forces": (n_i, 3) eV/Å, "virial": (3, 3) eV,
            "energies": (n_i,) eV}, as :meth:`MaceModel.compute` returns for that item alone
"""
from __future__ import annotations

import torch


def _joined(mm, items):
    """(x (N, 3), numbers (N,), receivers, senders, vectors (E, 3) Å, node system (N,), edge
    system (E,)) of the joined graph, edges past r_max dropped (the exact selection)."""
    xs, zs, rs, ss, shifts, node_sys, edge_sys = [], [], [], [], [], [], []
    offset = 0
    for k, (x, _cell, _pbc, z, nl) in enumerate(items):
        n = int(x.shape[0])
        if nl.n_query != n:
            raise ValueError("compute_batch takes whole systems (one domain, no ghost rows)")
        xs.append(x.as_subclass(torch.Tensor).to(mm.dtype))
        zs.append(z.as_subclass(torch.Tensor))
        rs.append(nl.centers() + offset)
        ss.append(nl.neighbors.long() + offset)
        shifts.append(nl.shifts)
        node_sys.append(torch.full((n,), k, dtype=torch.int64, device=mm.device))
        edge_sys.append(torch.full((int(nl.n_edges),), k, dtype=torch.int64, device=mm.device))
        offset += n
    cells = torch.stack([c.as_subclass(torch.Tensor).to(mm.dtype) for _, c, _, _, _ in items])
    x, edge_k = torch.cat(xs), torch.cat(edge_sys)
    receivers, senders = torch.cat(rs), torch.cat(ss)
    shift = torch.einsum("ei,eij->ej", torch.cat(shifts).to(mm.dtype), cells[edge_k])
    vectors = x[receivers] - x[senders] - shift
    keep = torch.nonzero(torch.linalg.vector_norm(vectors, dim=1) < mm.cutoff).squeeze(1)
    return (x, torch.cat(zs), receivers[keep], senders[keep], vectors[keep], torch.cat(node_sys),
            edge_k[keep])


def compute_batch(mm, items, exchange, executor) -> list[dict[str, torch.Tensor]]:
    """``mm``: a :class:`~shardmd.models.mace.MaceModel`; ``items``: see the module docstring;
    ``exchange``, ``executor``: models/mace.py's ``_Exchange`` and ``_fixed_jit_executor`` (given,
    so this module imports nothing of mace.py's)."""
    if not items:
        return []
    x, numbers, receivers, senders, vectors, node_k, edge_k = _joined(mm, items)
    n, s = int(x.shape[0]), len(items)
    node_attrs = torch.nn.functional.one_hot(mm._lut[numbers.long()], len(mm.atomic_numbers)).to(mm.dtype)
    with torch.enable_grad(), executor():
        vectors = vectors.detach().requires_grad_(True)
        data = {
            "node_attrs": node_attrs,
            "edge_index": torch.stack([senders, receivers]),
            "vectors": vectors,
            "batch": torch.zeros(n, dtype=torch.int64, device=x.device),
            "natoms": torch.tensor([n, 0]),
            "lammps_class": exchange(None, n),
            "ptr": torch.arange(2, device=x.device) * n,
            "head": mm._head,
        }
        out = mm.model(data, compute_force=False, lammps_mliap=True)
        nodes = out["node_energy"][:n]
        (grad,) = torch.autograd.grad(nodes.sum(), vectors, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(vectors)
    nodes = nodes.detach()
    forces = torch.zeros(n, 3, dtype=mm.dtype, device=x.device)
    forces.index_add_(0, receivers, -grad)
    forces.index_add_(0, senders, grad)
    # per system: energies summed in float64 (as the single call does), virials over its edges
    energy = torch.zeros(s, dtype=torch.float64, device=x.device).index_add_(0, node_k, nodes.to(torch.float64))
    outer = -(vectors.detach()[:, :, None] * grad[:, None, :])
    virial = torch.zeros(s, 3, 3, dtype=mm.dtype, device=x.device).index_add_(0, edge_k, outer)
    virial = 0.5 * (virial + virial.transpose(1, 2))
    results, start = [], 0
    for k, item in enumerate(items):
        stop = start + int(item[0].shape[0])
        results.append({"energy": energy[k].to(mm.dtype), "forces": forces[start:stop], "virial": virial[k],
                        "energies": nodes[start:stop].to(mm.dtype)})
        start = stop
    return results
