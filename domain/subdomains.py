"""A domain's model call made in parts (sub-domains), one part at a time, so that the peak
memory of a call is one part's activations plus the domain's per-point arrays.

The points a domain owns are split by a grid over the cell (fractional coordinates, the
grid chosen as for domains: :func:`shardmd.domain.grid_shape.grid_shape`). A part's
structure is its own points plus every point within the model's reach of them, found by
walking the neighbour list ``layers`` times (``layers``: message-passing steps; a pair
model has 1). A point reached through a lattice image is a point of its own in the part,
placed at its image (the part's list has no shifts): the part is an open cluster whose
own points see exactly the neighbourhood they have in the whole system.

The part's list has query rows for the points fewer than ``layers`` steps out (their
neighbourhoods are complete); the last shell only carries its input features. The model
counts the energies of the first ``n_counted`` rows, the part's own points
(:class:`CountedList`); forces come back on every row of the part and are added to their
points, virials add up. For a model whose energy is a sum of site energies that depend on
points at most ``layers`` list edges away, the sums over parts are the one-piece call's
(to round-off): the test is tests/test_subdomains.py.

Why a walk of the list, not a geometric halo: the list already holds every pair within
cutoff + skin, so the part stays valid until the next rebuild (ownership and images are
fixed between rebuilds; positions and the cell are read at every call), and no second
search is needed. A part narrower than the reach mostly repeats its neighbours' work:
:func:`part_grid` refuses it and names the largest count that fits.

Units: positions (n, 3) Å, cell (3, 3) Å (rows), energies eV, forces eV/Å, virial eV.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cell import perpendicular_widths, to_fractional
from .derivatives import apply_strain, fill_derivative_outputs, strain_leaf
from .grid_shape import DecompositionError, grid_shape, max_domains_of
from .neighbors import NeighborList

_BITS = 10                      # per image component: images within +-511 cells
_MID = 1 << (_BITS - 1)


class CountedList(NeighborList):
    """A part's list: query rows are the points fewer than ``layers`` steps from the part's
    own points; ``n_counted``: the part's own points (the first rows), whose energies count."""

    def __init__(self, *, n_counted: int, **fields):
        super().__init__(**fields)
        self.n_counted = int(n_counted)


@dataclass(frozen=True)
class Part:
    """ids: (m,) int64 the domain row of each point of the part; images: (m, 3) lattice image
    of each (float, the positions' dtype); nl: its :class:`CountedList`."""

    ids: torch.Tensor
    images: torch.Tensor
    nl: CountedList

    @property
    def n_counted(self) -> int:
        return self.nl.n_counted


def part_grid(count: int, cell: torch.Tensor, pbc, reach: float) -> tuple[int, int, int]:
    """The (Px, Py, Pz) grid of ``count`` parts with the least halo volume, every split part at
    least ``reach`` (Å) wide; else ValueError naming the largest count that fits."""
    widths = [float(w) for w in perpendicular_widths(cell.detach().to(torch.float64).cpu())]
    try:
        return grid_shape(int(count), widths, [bool(p) for p in pbc], float(reach))
    except DecompositionError:
        best = max_domains_of(widths, float(reach), int(count))
        raise ValueError(f"subdomains={count} makes parts narrower than the model's reach {reach:.2f} Å "
                         "(cutoff + skin, times the layers a part is called with at once); use at most "
                         f"subdomains={best} for this system") from None


def owner_parts(positions: torch.Tensor, cell: torch.Tensor, pbc, grid) -> torch.Tensor:
    """(n,) int64 part of each point: the grid box its fractional coordinates fall in
    (wrapped along periodic axes, clamped along open ones)."""
    f = to_fractional(positions.detach(), cell.detach())
    shape = torch.tensor(grid, dtype=torch.int64, device=positions.device)
    per = torch.tensor([bool(p) for p in pbc], device=positions.device)
    f = torch.where(per, f - torch.floor(f), f)
    box = torch.minimum(torch.clamp(torch.floor(f * shape).long(), min=0), shape - 1)
    return (box[:, 0] * grid[1] + box[:, 1]) * grid[2] + box[:, 2]


def _key(atom: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    img = image.long() + _MID
    return (((atom << _BITS) | img[:, 0]) << _BITS | img[:, 1]) << _BITS | img[:, 2]


def _edges_of(offsets: torch.Tensor, rows: torch.Tensor):
    """(edge ids, the position in ``rows`` of each edge's centre) of the edges of ``rows``."""
    start, count = offsets[rows], offsets[rows + 1] - offsets[rows]
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), count)
    first = torch.cumsum(count, 0) - count
    edge = start[owner] + torch.arange(owner.numel(), device=rows.device) - first[owner]
    return edge, owner


def build_part(nl: NeighborList, own: torch.Tensor, layers: int, dtype: torch.dtype) -> Part:
    """The part whose own points are the rows ``own`` (int64) of a domain with no ghost rows
    (every neighbour of the list is a query point), walked ``layers`` (>= 1) times."""
    if nl.n_query != nl.n_points:
        raise ValueError("a domain evaluated in parts must have no ghost rows (one domain per rank)")
    dev = own.device
    offsets = nl.offsets.long()
    nbr, sh = nl.neighbors.long(), nl.shifts.long()
    atoms, images = [own], [torch.zeros(own.numel(), 3, dtype=torch.int64, device=dev)]
    seen = torch.sort(_key(own, images[0])).values
    for _ in range(int(layers)):
        edge, owner = _edges_of(offsets, atoms[-1])
        cand = torch.unique(_key(nbr[edge], images[-1][owner] + sh[edge]))
        pos = torch.searchsorted(seen, cand).clamp(max=max(seen.numel() - 1, 0))
        new = cand[seen[pos] != cand] if seen.numel() else cand
        atoms.append(new >> (3 * _BITS))
        mask = (1 << _BITS) - 1
        images.append(torch.stack([(new >> (2 * _BITS)) & mask, (new >> _BITS) & mask, new & mask], 1) - _MID)
        seen = torch.sort(torch.cat([seen, new])).values
    ids, img = torch.cat(atoms), torch.cat(images)
    n_query = int(sum(a.numel() for a in atoms[:-1]))
    # the part's edges: every edge of a query point, to the point (neighbour, image) it reaches
    edge, owner = _edges_of(offsets, ids[:n_query])
    keys = _key(ids, img)
    order = torch.argsort(keys)
    target = _key(nbr[edge], img[owner] + sh[edge])
    at = torch.searchsorted(keys[order], target)
    local = order[at.clamp(max=keys.numel() - 1)]
    if not bool((keys[local] == target).all()):
        raise RuntimeError("a part's walk missed a neighbour of one of its query points")
    count = offsets[ids[:n_query] + 1] - offsets[ids[:n_query]]
    part_offsets = torch.zeros(n_query + 1, dtype=torch.int32, device=dev)
    part_offsets[1:] = torch.cumsum(count, 0).to(torch.int32)
    cl = CountedList(offsets=part_offsets, neighbors=local.to(torch.int32),
                     shifts=torch.zeros(local.numel(), 3, dtype=torch.int32, device=dev), cutoff=nl.cutoff,
                     n_points=int(ids.numel()), n_counted=int(own.numel()))
    return Part(ids=ids, images=img.to(dtype), nl=cl)


def evaluate_parts(model, parts: list[Part], positions: torch.Tensor, cell: torch.Tensor, pbc,
                   numbers: torch.Tensor) -> dict:
    """The model's outputs over the whole domain, one part at a time: energy () eV, forces
    (n, 3) eV/Å, virial (3, 3) eV (when the model gives one), energies (n,) eV."""
    n = int(positions.shape[0])
    energy = None
    forces = torch.zeros(n, 3, dtype=positions.dtype, device=positions.device)
    energies = torch.zeros(n, dtype=positions.dtype, device=positions.device)
    virial = fill = None
    for part in parts:
        x = positions[part.ids] + part.images @ cell
        out = _part_outputs(model, x, cell, pbc, numbers[part.ids], part.nl)
        e = out["energy"].detach().to(torch.float64)
        energy = e if energy is None else energy + e
        forces.index_add_(0, part.ids, out["forces"].detach()[: part.ids.numel()].to(forces.dtype))
        if out.get("energies") is not None:
            k = part.n_counted
            energies[part.ids[:k]] = out["energies"].detach()[:k].to(energies.dtype)
        if out.get("capacity_fill") is not None:   # a list's edge capacity: the fullest part's
            f = out["capacity_fill"]
            fill = f if fill is None else torch.maximum(fill, f)
        if out.get("virial") is not None:
            v = out["virial"].detach().to(torch.float64)
            virial = v if virial is None else virial + v
        del out, x   # one part's activations at a time
    result = {"energy": energy.to(positions.dtype), "forces": forces, "energies": energies}
    if virial is not None:
        result["virial"] = virial.to(positions.dtype)
    if fill is not None:
        result["capacity_fill"] = fill
    return result


def _part_outputs(model, x: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl) -> dict:
    """One part's outputs. A model that returns its forces calls plainly; one whose contract
    derives them (``model_config.autograd_outputs`` / ``strain_outputs``, e.g. forces from
    the energy) gets them here by autograd through the part's positions and a strain, as the
    spec path does for a whole domain (a part is one process's open cluster: no exchange)."""
    cfg = getattr(model, "model_config", None)
    auto = dict(getattr(cfg, "autograd_outputs", None) or {})
    strain = dict(getattr(cfg, "strain_outputs", None) or {})
    if not auto and not strain:
        return model.compute(x, cell, pbc, numbers, nl)
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        eps = strain_leaf(leaf.dtype, leaf.device) if strain else None
        pos, c = apply_strain(leaf, cell, eps) if strain else (leaf, cell)
        out = dict(model.compute(pos, c, pbc, numbers, nl))
        fill_derivative_outputs(out, leaf, auto, eps, strain, cell)
    return out


class PartedModel:
    """A :class:`~shardmd.domain.distributed_model.DistributedModel`'s call (``compute(ctx,
    positions, numbers, nl, extras)``) made in parts on a one-domain rank. ``dmodel``: the
    wrapped call (its attributes are this one's); ``count``: parts; ``layers``: the model's
    message-passing steps; ``skin``: Å added to the cutoff in the reach; ``by_layer``: made
    layer by layer over the parts (domain/layered_parts.py: the model's ``call_layer``), each
    part with one cutoff + skin of halo, else each part whole with ``layers`` of them.

    The model must count the energies of ``nl.n_counted`` rows only and give forces on every
    row, itself or through its contract's autograd outputs (attribute ``counts_rows = True``,
    as models/mace.py, nequip.py, sevennet.py, allegro.py and mattersim.py do)."""

    def __init__(self, dmodel, count: int, layers: int, skin: float, by_layer: bool = False):
        self.dmodel, self.count, self.layers, self.skin = dmodel, int(count), int(layers), float(skin)
        self.by_layer = bool(by_layer)
        self._cache = None   # (nl, grid, parts)

    def __getattr__(self, name):
        return getattr(self.dmodel, name)

    @property
    def walk(self) -> int:
        """List steps a part's halo reaches: one per layer the part is called with at once."""
        return 1 if self.by_layer else self.layers

    @property
    def reach(self) -> float:
        return self.walk * (float(self.dmodel.cutoff) + self.skin)

    def parts(self, ctx, positions: torch.Tensor, nl) -> list[Part]:
        c = self._cache
        if c is not None and c[0] is nl:
            return c[1]
        grid = part_grid(self.count, ctx.cell, ctx.pbc, self.reach)
        owner = owner_parts(positions[: ctx.n_owned], ctx.cell, ctx.pbc, grid)
        parts = [build_part(nl, torch.nonzero(owner == p).squeeze(1), self.walk, positions.dtype)
                 for p in range(grid[0] * grid[1] * grid[2])]
        self._cache = (nl, [p for p in parts if p.n_counted])
        return self._cache[1]

    def compute(self, ctx, positions: torch.Tensor, numbers: torch.Tensor, nl, extras=None) -> dict:
        if ctx.comm.size != 1 or ctx.plan.n_ghost:
            raise ValueError("subdomains > 1 runs on one domain per process; use domains=1 with subdomains, "
                             "or domains without subdomains")
        if self.count == 1:   # one piece (subdomains=0 chose it): the call as it is
            return self.dmodel.compute(ctx, positions, numbers, nl, extras)
        if extras:
            raise ValueError(f"subdomains > 1 does not pass the model's inputs {sorted(extras)}; use subdomains=1")
        parts = self.parts(ctx, positions, nl)
        if self.by_layer:
            from .layered_parts import evaluate_by_layer

            return evaluate_by_layer(self.dmodel.model, parts, positions, ctx.cell, numbers, self.layers)
        return evaluate_parts(self.dmodel.model, parts, positions, ctx.cell, ctx.pbc, numbers)


__all__ = ["CountedList", "Part", "PartedModel", "build_part", "evaluate_parts", "owner_parts", "part_grid"]
