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

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class JoinedGraph:
    """The joined list of many whole systems, kept between their lists' rebuilds (the step of
    a batch computes only the edge vectors from it: engine/batch/joined.py).

        node_attrs: (N, species) one-hot rows of the nodes, all systems' concatenated
        receivers, senders: (E,) int64 node rows of the edges (each system's offset)
        shift: (E, 3) Å, each edge's image shift ``shifts @ cell`` with its own system's cell
        node_k: (N,) int64 system of each node; edge_k: (E,) system of each edge
        sizes: nodes per system, in order
    """

    node_attrs: torch.Tensor
    receivers: torch.Tensor
    senders: torch.Tensor
    shift: torch.Tensor
    node_k: torch.Tensor
    edge_k: torch.Tensor
    sizes: tuple[int, ...]


def join(mm, items) -> JoinedGraph:
    """The :class:`JoinedGraph` of ``items`` (module docstring), in ``mm``'s dtype and device."""
    return merge([_one(mm, item) for item in items])


def _one(mm, item) -> JoinedGraph:
    """One system's graph: its shifts taken as three products summed per edge (not a matrix
    product), so an edge's shift has the same bits whichever systems it is joined with."""
    x, cell, _pbc, z, nl = item
    n = int(x.shape[0])
    if nl.n_query != n:
        raise ValueError("compute_batch takes whole systems (one domain, no ghost rows)")
    h = cell.as_subclass(torch.Tensor).to(mm.dtype)
    s = nl.shifts.to(mm.dtype)
    shift = s[:, 0:1] * h[0] + s[:, 1:2] * h[1] + s[:, 2:3] * h[2]
    numbers = z.as_subclass(torch.Tensor)
    node_attrs = torch.nn.functional.one_hot(mm._lut[numbers.long()], len(mm.atomic_numbers)).to(mm.dtype)
    dev = x.device
    return JoinedGraph(node_attrs, nl.centers().long(), nl.neighbors.long(), shift,
                       torch.zeros(n, dtype=torch.int64, device=dev),
                       torch.zeros(int(nl.n_edges), dtype=torch.int64, device=dev), (n,))


def merge(parts: list[JoinedGraph]) -> JoinedGraph:
    """One graph of one-system graphs ``parts`` (their nodes and edges in order, each system's
    node rows offset by the nodes before it): a caller replaces one system's part after its
    rebuild and merges again, without redoing the others."""
    dev = parts[0].receivers.device
    s = len(parts)
    n_nodes, n_edges = [g.sizes[0] for g in parts], [int(g.receivers.shape[0]) for g in parts]
    nodes = torch.tensor(n_nodes, dtype=torch.int64, device=dev)
    edges = torch.tensor(n_edges, dtype=torch.int64, device=dev)
    systems = torch.arange(s, dtype=torch.int64, device=dev)
    node_k = torch.repeat_interleave(systems, nodes, output_size=sum(n_nodes))   # sizes known: no device read
    edge_k = torch.repeat_interleave(systems, edges, output_size=sum(n_edges))
    offset = (torch.cumsum(nodes, 0) - nodes)[edge_k]
    return JoinedGraph(torch.cat([g.node_attrs for g in parts]), torch.cat([g.receivers for g in parts]) + offset,
                       torch.cat([g.senders for g in parts]) + offset, torch.cat([g.shift for g in parts]),
                       node_k, edge_k, tuple(g.sizes[0] for g in parts))


def pad_edges(graph: JoinedGraph, rows: int, cutoff: float) -> JoinedGraph:
    """``graph`` with ``rows`` edges: the added ones are self-edges of nodes spread over the
    graph with a shift of length 2 ``cutoff`` (never selected), so that graphs of several lists
    have one shape (a CUDA graph replays over them; models/edge_filter.py says why spread)."""
    extra = rows - int(graph.receivers.shape[0])
    if extra <= 0:
        return graph
    dev, n = graph.receivers.device, int(graph.node_attrs.shape[0])
    spread = torch.arange(extra, device=dev) % max(n, 1)
    far = torch.zeros(extra, 3, dtype=graph.shift.dtype, device=dev)
    far[:, 0] = 2.0 * cutoff
    return JoinedGraph(graph.node_attrs, torch.cat([graph.receivers, spread]), torch.cat([graph.senders, spread]),
                       torch.cat([graph.shift, far]), graph.node_k,
                       torch.cat([graph.edge_k, torch.zeros(extra, dtype=torch.int64, device=dev)]), graph.sizes)


def compute_joined(mm, graph: JoinedGraph, x: torch.Tensor, executor, capacity: int | None = None,
                   graphed=None, owner=None) -> dict:
    """One forward and backward pass over the joined graph at node positions ``x`` (N, 3) Å:
    {"energy": (S,) float64 eV, "forces": (N, 3) eV/Å, "virial": (S, 3, 3) eV, "energies":
    (N,) eV}; edges past r_max dropped. ``capacity`` None: the exact selection each system's
    own call makes (and "selected", the count kept, an int); else sync-free, into ``capacity``
    rows (models/edge_filter.py), with "capacity_fill" (count / capacity, > 1: incomplete,
    discard), and replayed by ``graphed`` (domain/graphed_call.py's GraphedCall, for ``owner``)
    where given."""
    x = x.as_subclass(torch.Tensor).to(mm.dtype)
    inputs = (x, graph.node_attrs, graph.receivers, graph.senders, graph.shift, graph.node_k, graph.edge_k)

    def call(*t):
        return _call(mm, *t, len(graph.sizes), executor, capacity)

    if graphed is None or capacity is None:
        return call(*inputs)
    signature = (int(x.shape[0]), int(graph.receivers.shape[0]), capacity, len(graph.sizes), x.dtype)
    return graphed(call, owner, signature, inputs)


def _call(mm, x, node_attrs, receivers, senders, shift, node_k, edge_k, s: int, executor, capacity: int | None) -> dict:
    n = int(x.shape[0])
    vectors = x[receivers] - x[senders] - shift
    inside = torch.linalg.vector_norm(vectors, dim=1) < mm.cutoff
    valid = fill = None
    if capacity is None:
        keep = torch.nonzero(inside).squeeze(1)
    else:   # no host read: a fixed number of rows, the tail padding (self-edges at 2 r_max)
        count = inside.sum()
        keep = torch.nonzero_static(inside, size=capacity, fill_value=0).squeeze(1)
        valid = torch.arange(capacity, device=x.device) < count
        fill = count.to(torch.float64) / capacity
    receivers, senders, vectors, edge_k = receivers[keep], senders[keep], vectors[keep], edge_k[keep]
    if valid is not None:
        spread = torch.arange(capacity, device=x.device) % max(n, 1)
        # (2 r_max, 0, 0) made on the device: a host scalar written into it is a copy a graph cannot hold
        far = (torch.arange(3, device=x.device) == 0).to(vectors.dtype) * (2.0 * mm.cutoff)
        receivers, senders = torch.where(valid, receivers, spread), torch.where(valid, senders, spread)
        vectors = torch.where(valid[:, None], vectors, far)
    with torch.enable_grad(), executor():
        vectors = vectors.detach().requires_grad_(True)
        data = {
            "node_attrs": node_attrs,
            "edge_index": torch.stack([senders, receivers]),
            "vectors": vectors,
            "batch": torch.zeros(n, dtype=torch.int64, device=x.device),
            "natoms": torch.tensor([n, 0]),
            "lammps_class": None,   # whole systems: no ghost rows, no per-layer exchange
            "ptr": torch.arange(2, device=x.device) * n,
            "head": mm._head,
        }
        out = mm.model(data, compute_force=False, lammps_mliap=True)
        nodes = out["node_energy"][:n]
        (grad,) = torch.autograd.grad(nodes.sum(), vectors, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(vectors)
    if valid is not None:   # padding edges: exactly zero already; never let them carry a NaN
        grad = torch.where(valid[:, None], grad, 0.0)
    nodes = nodes.detach()
    forces = torch.zeros(n, 3, dtype=mm.dtype, device=x.device)
    forces.index_add_(0, receivers, -grad)
    forces.index_add_(0, senders, grad)
    # per system: energies summed in float64 (as the single call does), virials over its edges
    energy = torch.zeros(s, dtype=torch.float64, device=x.device).index_add_(0, node_k, nodes.to(torch.float64))
    outer = -(vectors.detach()[:, :, None] * grad[:, None, :])
    virial = torch.zeros(s, 3, 3, dtype=mm.dtype, device=x.device).index_add_(0, edge_k, outer)
    virial = 0.5 * (virial + virial.transpose(1, 2))
    result = {"energy": energy, "forces": forces, "virial": virial, "energies": nodes.to(mm.dtype)}
    if fill is None:
        result["selected"] = int(keep.shape[0])
    else:
        result["capacity_fill"] = fill
    return result


def split(joined: dict[str, torch.Tensor], sizes, k: int, start: int, dtype) -> dict[str, torch.Tensor]:
    """System ``k``'s outputs (its nodes from row ``start``) of :func:`compute_joined`'s, as
    :meth:`MaceModel.compute` gives them for it alone."""
    stop = start + sizes[k]
    return {"energy": joined["energy"][k].to(dtype), "forces": joined["forces"][start:stop],
            "virial": joined["virial"][k], "energies": joined["energies"][start:stop]}


def compute_batch(mm, items, executor) -> list[dict[str, torch.Tensor]]:
    """``mm``: a :class:`~shardmd.models.mace.MaceModel`; ``items``: see the module docstring;
    ``executor``: models/mace.py's ``_fixed_jit_executor`` (given, so this module imports nothing
    of mace.py's)."""
    if not items:
        return []
    graph = join(mm, items)
    x = torch.cat([item[0].as_subclass(torch.Tensor).to(mm.dtype) for item in items])
    joined = compute_joined(mm, graph, x, executor)
    results, start = [], 0
    for k in range(len(items)):
        results.append(split(joined, graph.sizes, k, start, mm.dtype))
        start += graph.sizes[k]
    return results
