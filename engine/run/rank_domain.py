"""The engine's side of the decomposition: which atoms a rank owns, its ghosts, its list.

One code path for one domain and for many: with a 1x1x1 grid there are no split axes, no
ghosts and no messages, and the rank's neighbour search applies the cell's periodicity
itself.  Every collective here is called by all ranks at the same step.
"""
from __future__ import annotations

import math
import time

import torch

from shardmd.domain.cell import perpendicular_widths, to_fractional
from shardmd.domain.comm import Comm
from shardmd.domain.context import DomainContext
from shardmd.domain.decomposition import DecompositionError, choose_grid
from shardmd.domain.halo import build_halo, ghost_positions, local_pbc
from shardmd.domain.migration import MigrationError, id_checksum, migrate, verify
from shardmd.domain.neighbors import SkinNeighborList, build_neighbor_list
from shardmd.domain.spatial_sort import spatial_order, spatial_sort
from shardmd.engine.errors import CollectiveError
from shardmd.engine.run.health import step_measure
from shardmd.engine.run.state import State
from shardmd.integrators import fused
from shardmd.integrators.mat3 import inv3, matmul3

#: memory orders of a rank's atoms, set at every neighbour rebuild (``neighbor.sort``):
#: spatial = (bin, id) on the neighbour grid (fast kernels), id = ascending id, none = as arrived
SORTS = ("spatial", "id", "none")


class RankDomain:
    """comm: the job's Comm; cutoff, skin: Å; sort: the atoms' memory order set at every
    rebuild (one of :data:`SORTS`); grid: [Px, Py, Pz] or None (chosen)."""

    def __init__(self, comm: Comm, cutoff: float, skin: float, sort: str = "spatial", grid=None,
                 box_check: bool = False):
        if sort not in SORTS:
            raise ValueError(f"neighbor.sort={sort!r}: use one of {', '.join(SORTS)}")
        self.comm = comm
        self.nl = SkinNeighborList(cutoff, skin, box_check=box_check)
        self.ghost_width = cutoff + skin
        self.sort = sort
        self.grid_shape = tuple(grid) if grid is not None else None
        self.grid = None
        self.plan = None
        self.ctx: DomainContext | None = None
        self.padded_positions: torch.Tensor | None = None
        self.padded_numbers: torch.Tensor | None = None
        self.padded_ids: torch.Tensor | None = None
        self.expected = None
        self.timers = {"neighbor": 0.0, "comm": 0.0}
        self.n_global = 0
        self.id_bound: int | None = None
        self.stats = {"received": 0}
        #: (n_owned, 3) Å: a restart's positions of the last rebuild, kept from :meth:`distribute`
        #: until :meth:`restore` rebuilds the lists from them (None: a fresh start)
        self.restart_reference: torch.Tensor | None = None
        #: (3, 3) Å: the cell of that rebuild when it differs from the state's (a barostat)
        self.restart_cell: torch.Tensor | None = None
        self._work: torch.Tensor | None = None   # (rows, 3): the box check's per-atom array, kept
        self._inverse: list | None = None        # [build cell, its version, h0^-1, its rows]: _build_cache()
        self._check_part: torch.Tensor | None = None   # (chunks, 2): the fused check's per-chunk maxima, kept
        #: what the one-line error of a cell that shrank below the grid advises (a relaxation has no checkpoints)
        self.shrink_fix = "restart from the last checkpoint with fewer domains"

    # -- set-up ----------------------------------------------------------------------
    def distribute(self, full: State, reference: torch.Tensor | None = None,
                   reference_cell: torch.Tensor | None = None) -> State:
        """Choose the grid and keep this rank's atoms of the (identical on all ranks) full state.

        reference: (n, 3) positions of the last rebuild (restarts): atoms go to the domain of
        their reference position and nothing is wrapped, as at that rebuild; this rank's rows
        are kept in :attr:`restart_reference` for :meth:`restore`.  reference_cell: (3, 3) Å,
        the cell of that rebuild when the cell has changed since (a barostat; default: the
        state's cell): the grid, the domains and the lists are those of that rebuild."""
        cell0 = full.cell if reference_cell is None else reference_cell.to(full.cell)
        try:
            self.grid = choose_grid(self.comm.size, cell0, full.pbc.tolist(), self.ghost_width,
                                    shape=self.grid_shape)
        except DecompositionError as exc:
            raise CollectiveError(str(exc)) from None
        if reference is None:
            full.wrap()
        self.n_global = full.n_atoms
        # one sort key for the spatial order: a bound above every id (ids never change in a run)
        lo, hi = torch.stack([full.ids.min(), full.ids.max()]).tolist() if full.n_atoms else (0, 0)
        self.id_bound = hi + 1 if lo >= 0 else None
        if self.comm.size > 1:
            where = full.positions if reference is None else reference
            mine = torch.nonzero(self.grid.owner(to_fractional(where, cell0)) == self.comm.rank).flatten()
            full.permute(mine)
            if reference is not None:
                reference = reference[mine].contiguous()
        self.restart_reference = reference
        self.restart_cell = None if reference is None or reference_cell is None else cell0
        self.expected = id_checksum(self.comm, full.ids)
        return full

    # -- per rebuild -----------------------------------------------------------------
    def rebuild(self, s: State) -> None:
        t = time.perf_counter()
        if self.nl.box_check and self.nl.cell_changed(s.cell):
            self._check_grid(s.cell)
        s.wrap()
        pbc = s.pbc.tolist()
        if self.comm.size > 1:
            s.set_per_atom(migrate(self.comm, self.grid, s.cell, pbc, s.per_atom(), stats=self.stats))
            try:
                verify(self.comm, s.ids, self.expected)
            except MigrationError as exc:
                raise CollectiveError(str(exc)) from None
        # one domain: the points sorted are the points searched, so the sort's binning serves the build
        order, binning = self._order(s, s.positions, binning=self.comm.size == 1)
        if order is not None:
            s.permute(order)
        self.padded_positions = self._build_lists(s, s.positions, binning=binning)
        self.timers["neighbor"] += time.perf_counter() - t

    def restore(self, s: State) -> None:
        """Rebuild ghosts and lists from :attr:`restart_reference`, the positions of the last
        rebuild (a restart), then refresh ghosts to the current positions: the uninterrupted
        run's lists, exactly."""
        t = time.perf_counter()
        reference, self.restart_reference = self.restart_reference, None
        cell, self.restart_cell = self.restart_cell, None
        order, _ = self._order(s, reference, cell)   # the order that rebuild gave these very positions
        if order is not None:
            s.permute(order)
            reference = reference[order].contiguous()
        self._build_lists(s, reference, cell)
        self.timers["neighbor"] += time.perf_counter() - t
        self.refresh(s)

    def _build_lists(self, s: State, points: torch.Tensor, cell: torch.Tensor | None = None,
                     binning=None) -> torch.Tensor:
        """Ghosts, domain context and neighbour list from the owned ``points`` (n, 3) Å (the
        atoms' positions, or a restart's positions of the last rebuild, with that rebuild's
        ``cell``: default the state's; ``binning``: their spatial sort's, handed to the
        build); returns the padded points (owned, then ghosts)."""
        cell = s.cell if cell is None else cell
        labels = torch.stack([s.ids, s.numbers], dim=1)
        pbc = s.pbc.tolist()
        self.plan, gpos, glab = build_halo(self.comm, self.grid, cell, pbc, points, labels, self.ghost_width)
        padded = torch.cat([points, gpos]) if gpos.shape[0] else points   # no ghosts: the points themselves
        self.padded_ids = torch.cat([s.ids, glab[:, 0]])
        self.padded_numbers = torch.cat([s.numbers, glab[:, 1]])
        lp = local_pbc(self.grid, pbc)
        self.ctx = DomainContext(self.comm, self.grid, self.plan, cell, tuple(pbc), lp)
        self.nl.build(padded, cell, torch.tensor(lp), ids=self.padded_ids, n_query=s.n_atoms, binning=binning)
        return padded

    def _check_grid(self, cell: torch.Tensor) -> None:
        """A cell that changed (a barostat): the grid must still fit it (every split domain at
        least the ghost width thick); refused in one line, collectively, when the box shrank."""
        shape = self.grid.shape
        if all(k == 1 for k in shape):   # one domain: nothing to fit
            return
        widths = perpendicular_widths(cell).tolist()
        thin = [widths[k] / shape[k] for k in range(3) if shape[k] > 1]
        if thin and min(thin) < self.ghost_width:
            raise CollectiveError(
                f"the cell shrank: domains are now {min(thin):.2f} Å thin, less than the ghost width "
                f"{self.ghost_width:.2f} Å (cutoff + skin); {self.shrink_fix} "
                f"(grid {list(shape)} no longer fits this cell)")

    def _order(self, s: State, where: torch.Tensor, cell: torch.Tensor | None = None,
               binning: bool = False) -> tuple[torch.Tensor | None, object]:
        """(permutation of ``s``'s atoms for the memory order ``self.sort`` asks, from the
        positions ``where`` (n, 3) Å (wrapped, as at a rebuild, in ``cell``: default the
        state's), None when nothing moves; with ``binning`` and the spatial sort, the sorted
        points' ``spatial_sort.Binning`` for the build, else None)."""
        if self.sort == "spatial":
            args = (where, s.cell if cell is None else cell, s.pbc, self.nl.radius)
            if binning:
                return spatial_sort(*args, ids=s.ids, id_bound=self.id_bound)
            return spatial_order(*args, ids=s.ids, id_bound=self.id_bound), None
        if self.sort == "id" and s.n_atoms and not bool((s.ids[1:] > s.ids[:-1]).all()):
            return torch.argsort(s.ids), None
        return None, None

    def reference_positions(self) -> torch.Tensor:
        """(n_owned, 3) positions of this rank's atoms at the last rebuild (memory order)."""
        return self.nl.reference

    def refresh(self, s: State) -> None:
        """Ghost positions from their owners' current positions (every step without rebuild)."""
        t = time.perf_counter()
        if self.plan.n_ghost == 0 and not self.plan.steps:  # one domain: the points are the atoms
            self.padded_positions = s.positions
        else:
            self.padded_positions = ghost_positions(self.comm, self.plan, s.positions, s.cell)
        self.ctx.cell = s.cell
        self.timers["comm"] += time.perf_counter() - t

    def needs_rebuild(self, s: State) -> bool:
        """Skin criterion on owned atoms, decided together by all ranks (one small all-reduce)."""
        return self.check(s)[0]

    def check(self, s: State, dt: float = 0.0) -> tuple[bool, float]:
        """Skin criterion and the health measure of engine/run/health.py (max ``|v| dt``, inf for
        a non-finite velocity or position), reduced together in one small all-reduce:
        (rebuild needed on any rank, the largest measure on any rank)."""
        need, worst, _ = self.check_and_stop(s, dt, None)
        return need, worst

    def check_and_stop(self, s: State, dt: float, stop: bool | None) -> tuple[bool, float, bool]:
        """:meth:`check` with this rank's stop request carried in the same all-reduce (the
        step loop's; engine/run/rebuild.py ``stop_agreed``): (rebuild needed on any rank, the
        largest measure on any rank, a stop requested on any rank). stop=None: nothing
        carried (the third value is False)."""
        t = time.perf_counter()
        fast = self._fused_check(s, dt)
        if fast is not None and self.comm.size == 1:   # floats, nothing to agree on
            self.timers["neighbor"] += time.perf_counter() - t
            return fast[0], fast[1], bool(stop)
        if fast is not None:
            need, h = torch.tensor([float(fast[0]), fast[1]], dtype=torch.float64, device=s.positions.device)
        else:
            d, trigger = self.displacement(s) if s.n_atoms else (None, 0.0)
            h = step_measure(s.velocities, dt, d)   # 0-d float64 on the atoms' device
            need = torch.full_like(h, float(bool(s.n_atoms))) if d is None else (d > trigger).to(h.dtype)
        parts = [need, h] if stop is None else [need, h, torch.full_like(h, float(bool(stop)))]
        out = self.comm.all_reduce(torch.stack(parts), "max").tolist()   # the one host read
        self.timers["neighbor"] += time.perf_counter() - t
        return bool(out[0]), out[1], stop is not None and bool(out[2])

    def _fused_check(self, s: State, dt: float) -> tuple[bool, float] | None:
        """(a rebuild is due here, the step measure max |v| dt in Å) from one CPU pass over the
        rows (integrators/fused.py ``check_measure``) where it serves (CPU, float64, a list
        that serves these atoms), else None (:meth:`displacement` and health.step_measure then).
        Same rule as theirs (:meth:`_strain`); the measure +inf when a velocity or the
        displacement is not finite."""
        nl, x, v = self.nl, s.positions, s.velocities
        if not s.n_atoms or not nl.serves(x) or not fused.usable(x, nl.reference, v):
            return None
        strain = self._strain(s)
        if strain is None:
            return None
        t, trigger = strain
        part = self._check_part
        if part is None or part.shape[0] != fused.chunks(x.shape[0]):
            part = self._check_part = torch.empty(fused.chunks(x.shape[0]), 2, dtype=torch.float64)
        d2, v2 = fused.check_measure(x, nl.reference, IDENTITY if t is None else t, v, part)
        d, h = math.sqrt(d2), math.sqrt(v2) * dt
        if not (math.isfinite(d) and math.isfinite(h)):
            h = math.inf
        return d > trigger, h

    def _strain(self, s: State) -> tuple[list[list[float]] | None, float] | None:
        """(T, trigger) of the list's check: T None for a fixed cell (trigger skin / 2), else the
        cell's deformation since the build, T = h0^-1 h, with its smaller trigger; None when the
        list cannot serve these atoms (a rebuild is due). Why: :meth:`displacement`."""
        nl = self.nl
        rows = _rows(s.cell) if nl.box_check and nl.build_cell is not None and s.cell.is_cpu else None
        if rows is not None:   # the build's cell compared as floats (torch.equal: ~10 us a step in the loop)
            changed = rows != self._build_cache(nl.build_cell)[3]
        else:
            changed = nl.box_check and nl.cell_changed(s.cell)
        if not changed:
            return None if nl.stale(s.positions, s.cell) else (None, 0.5 * nl.skin)
        if not nl.serves(s.positions):
            return None
        try:
            t = matmul3(self._build_inverse(nl.build_cell), rows or _rows(s.cell))
        except ZeroDivisionError:
            return None
        trigger = 0.5 * (nl.skin - strain_norm(t) * nl.radius)
        return (t, trigger) if math.isfinite(trigger) else None

    def _build_inverse(self, cell: torch.Tensor) -> list[list[float]]:
        """h0^-1 of the build's cell (lists of floats), once per build, not per step."""
        kept = self._build_cache(cell)
        if kept[2] is None:
            kept[2] = inv3(kept[3])
        return kept[2]

    def _build_cache(self, cell: torch.Tensor) -> list:
        """[cell, its version, h0^-1 (None until asked), its rows]: the build's cell read once per build."""
        kept = self._inverse
        if kept is None or kept[0] is not cell or kept[1] != cell._version:
            kept = self._inverse = [cell, cell._version, None, _rows(cell)]
        return kept

    def displacement(self, s: State) -> tuple[torch.Tensor | None, float]:
        """(this rank's largest displacement since the last build, 0-d Å; the largest one the
        list stays complete with, Å): a new list is due when the first exceeds the second on
        any rank.  The first is None when the list cannot serve these atoms at all (none built,
        another atom count, another cell without the box check, a singular build cell).

        Fixed cell: |x - x0| against skin / 2.  A changing cell (``box_check``, a barostat):
        the displacement less the cell's homogeneous deformation, |x - x0 T| with
        T = h0^-1 h (build cell h0, current h), against (skin - ||T - I|| (cutoff + skin)) / 2;
        why this keeps every pair within the cutoff: docs/design.md, "NPT under decomposition"."""
        nl = self.nl
        strain = self._strain(s)
        if strain is None:
            return None, 0.5 * nl.skin
        t, trigger = strain
        x0, x = nl.reference, s.positions
        if t is None:
            return nl.max_displacement(x), trigger
        if fused.usable(x, x0):   # one pass (integrators/fused.py): 1.5-2 ms less at 256k atoms, tri
            w = self._work_rows(x)
            return fused.strain_displacement(x, x0, t, w.view(-1)), trigger
        w = self._work_rows(x)
        if t[0][1] == t[0][2] == t[1][0] == t[1][2] == t[2][0] == t[2][1] == 0.0:   # iso, aniso: a scaling
            torch.mul(x0, torch.tensor([t[0][0], t[1][1], t[2][2]], dtype=x.dtype, device=x.device), out=w)
        else:
            torch.mm(x0, torch.tensor(t, dtype=x.dtype, device=x.device), out=w)
        return torch.linalg.vector_norm(w.sub_(x), dim=1).amax(), trigger

    def _work_rows(self, like: torch.Tensor) -> torch.Tensor:
        """A kept (n, 3) work array for ``like`` (n, 3): allocated once with head-room (a rank's atom
        count moves with migrations), not per step (fresh pages are zero-filled on first touch)."""
        n = like.shape[0]
        w = self._work
        if w is None or w.shape[0] < n or w.dtype != like.dtype or w.device != like.device:
            w = self._work = torch.empty((int(1.25 * n) + 1, 3), dtype=like.dtype, device=like.device)
        return w[:n]

    def close_pairs(self, s: State, radius: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(id_i, id_j, distance Å) of every pair closer than ``radius`` with i owned here, from
        a list of that radius over the current points (ghosts included: radius < ghost width)."""
        lp = local_pbc(self.grid, s.pbc.tolist())
        nl = build_neighbor_list(self.padded_positions, s.cell, torch.tensor(lp), radius,
                                 ids=self.padded_ids, n_query=s.n_atoms)
        if nl.n_edges == 0:
            empty = torch.zeros(0, dtype=torch.int64)
            return empty, empty, empty.double()
        i, j = nl.centers(), nl.neighbors.long()
        x = self.padded_positions.double()
        d = torch.linalg.vector_norm(x[j] + nl.shift_vectors(s.cell.double()) - x[i], dim=1)
        return self.padded_ids[i], self.padded_ids[j], d

    # -- reductions and output ----------------------------------------------------------
    def migrated(self) -> int:
        """Atoms moved between domains so far, summed over ranks (collective)."""
        return int(self.comm.all_reduce(torch.tensor([self.stats["received"]]))[0])

    def allgather(self, s: State, fields, extra: dict | None = None) -> dict:
        """Every rank: dict of full arrays in id order (numpy); see :meth:`gather`."""
        return _assemble(self.comm.all_gather_object(_local_arrays(s, fields, extra)))

    def gather(self, s: State, fields=("positions", "images", "velocities", "forces"), extra: dict | None = None):
        """Root: dict of full arrays in id order (numpy); others: None. fields: names of
        per-atom arrays of ``s``; extra: further per-atom arrays by name ((n_owned, ...) in
        ``s``'s memory order, e.g. the reference positions or per-atom energies)."""
        parts = self.comm.gather_object(_local_arrays(s, fields, extra))
        return None if parts is None else _assemble(parts)


IDENTITY = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


def _rows(cell: torch.Tensor) -> list[list[float]]:
    """A (3, 3) tensor's rows as Python floats (``tolist`` of float64 gives ``.double()``'s floats)."""
    return cell.tolist() if cell.dtype == torch.float64 and cell.is_cpu else cell.double().cpu().tolist()


def strain_norm(t: list[list[float]]) -> float:
    """An upper bound on ||T - I||, the spectral norm, for a 3 x 3 ``t`` (lists of floats):
    sqrt(||A||_1 ||A||_inf) with A = T - I (largest column and row sums of |A|); exact when A is
    diagonal (iso and aniso on an orthogonal cell)."""
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = t
    a00, a11, a22 = abs(a00 - 1.0), abs(a11 - 1.0), abs(a22 - 1.0)
    a01, a02, a10, a12, a20, a21 = abs(a01), abs(a02), abs(a10), abs(a12), abs(a20), abs(a21)
    col = max(a00 + a10 + a20, a01 + a11 + a21, a02 + a12 + a22)
    row = max(a00 + a01 + a02, a10 + a11 + a12, a20 + a21 + a22)
    return math.sqrt(col * row)


def _local_arrays(s: State, fields, extra: dict | None) -> dict:
    local = {k: getattr(s, k).detach().cpu() for k in ("ids", *fields)}
    local.update({k: v.detach().cpu() for k, v in (extra or {}).items()})
    return local


def _assemble(parts: list[dict]) -> dict:
    """Ranks' local arrays -> full arrays in id order (numpy)."""
    order = torch.argsort(torch.cat([p["ids"] for p in parts]))
    return {k: torch.cat([p[k] for p in parts])[order].numpy() for k in parts[0]}
