"""Moving points to the domain that owns them, one neighbour hop per split axis.

At a rebuild (points already folded into the cell on periodic axes) each point belongs to
the domain containing it.  Sweeping the split axes in order, points whose slab coordinate
lies in the lower (upper) neighbour's slab are sent there with every per-point array; the
next axis sweeps what arrived too, so corner moves take two or three hops and only face
neighbours talk.  A point that jumped further than one domain since the last rebuild is an
error (it means the time step or skin is far too large).  Hysteresis is 0: points move
only at rebuild steps (docs/design.md, "When to rebuild: the skin check"), so there is no
per-step cost to save, and the ghost width needs no extra margin.

Received points are appended in (from-upper, from-lower) order after the points that stayed:
the layout depends only on the data, never on message arrival.
"""
from __future__ import annotations

import torch

from .cell import to_fractional
from .comm import Comm
from .decomposition import DomainGrid
from .exchange import swap, swap_counts, tag
from .halo import _neighbours, split_axes


class MigrationError(RuntimeError):
    """Points were lost, duplicated or jumped too far (names the ids)."""


def migrate(comm: Comm, grid: DomainGrid, cell: torch.Tensor, pbc, arrays: dict[str, torch.Tensor],
            positions: str = "positions", ids: str = "ids", stats: dict | None = None) -> dict[str, torch.Tensor]:
    """Return the per-point ``arrays`` this rank owns after moving points between neighbours.

    arrays: name -> (n, ...) tensor, all with the same n; ``arrays[positions]`` in Å.
    stats: if given, ``stats["received"]`` is increased by the points this rank received.
    """
    names = sorted(arrays)
    for axis in split_axes(grid):
        lower, upper, _, _ = _neighbours(grid, comm.rank, axis, pbc)
        p = grid.shape[axis]
        c = grid.coords(comm.rank)[axis]
        x = arrays[positions]
        f = to_fractional(x, cell)[:, axis] if x.shape[0] else x[:, 0]
        target = torch.clamp(torch.floor(f * p).to(torch.int64), 0, p - 1)
        d = target - c
        if pbc[axis]:
            d = torch.remainder(d, p)
            go_up = d == 1
            go_down = (d == p - 1) & ~go_up
            too_far = (d != 0) & ~go_up & ~go_down
        else:
            go_up, go_down = d == 1, d == -1
            too_far = d.abs() > 1
        if bool(too_far.any()):
            bad = arrays[ids][too_far][:10].tolist()
            raise MigrationError(f"atoms {bad} moved more than one domain along axis {axis} since the last "
                                 "neighbour rebuild; reduce dt or neighbor.skin / neighbor.every")
        if lower is None and bool(go_down.any()) or upper is None and bool(go_up.any()):
            raise MigrationError("points left an open boundary domain grid")  # clamped above: unreachable
        stay = ~(go_up | go_down)
        moves = [(False, lower, go_down), (True, upper, go_up)]
        sends, recv_from = [], []
        for up, peer, sel in moves:
            if peer is not None:
                sends.append((peer, int(sel.sum()), tag(axis, up, 7)))
        for up, peer in ((False, upper), (True, lower)):
            if peer is not None:
                recv_from.append((peer, up))
        counts = swap_counts(comm, sends, [(pe, tag(axis, up, 7)) for pe, up in recv_from])
        payload, want = [], []
        for up, peer, sel in moves:
            if peer is not None:
                for j, name in enumerate(names):
                    payload.append((peer, arrays[name][sel], tag(axis, up, 8 + j)))
        for (pe, up), n in zip(recv_from, counts):
            for j, name in enumerate(names):
                a = arrays[name]
                want.append((pe, (n, *a.shape[1:]), a.dtype, tag(axis, up, 8 + j)))
        got = swap(comm, payload, want)
        if stats is not None:
            stats["received"] = stats.get("received", 0) + sum(counts)
        new = {name: [arrays[name][stay]] for name in names}
        for k in range(len(recv_from)):
            for j, name in enumerate(names):
                new[name].append(got[k * len(names) + j])
        arrays = {name: torch.cat(parts).contiguous() for name, parts in new.items()}
    return arrays


def id_checksum(comm: Comm, ids: torch.Tensor) -> tuple[int, int, int]:
    """(global count, sum of ids, sum of a mixed hash of ids), reduced over ranks."""
    i = ids.to(torch.int64)
    mixed = (i * 2654435761 + 97) & 0xFFFFFFFF
    local = torch.stack([torch.tensor(i.numel(), dtype=torch.int64), i.sum().cpu(), mixed.sum().cpu()])
    tot = comm.all_reduce(local)
    return tuple(int(v) for v in tot)


def verify(comm: Comm, ids: torch.Tensor, expected: tuple[int, int, int]) -> None:
    """Raise :class:`MigrationError` on every rank when points were lost or duplicated."""
    got = id_checksum(comm, ids)
    if got == tuple(expected):
        return
    all_ids = torch.cat([torch.as_tensor(x) for x in comm.all_gather_object(ids.cpu())])
    uniq, counts = torch.unique(all_ids, return_counts=True)
    dup = uniq[counts > 1][:10].tolist()
    n_expected = expected[0]
    missing = sorted(set(range(n_expected)) - set(uniq.tolist()))[:10] if n_expected < 10_000_000 else []
    raise MigrationError(f"atom bookkeeping broke after migration: {got[0]} atoms instead of {n_expected}; "
                         f"missing ids {missing}, duplicated ids {dup}")
