"""Cell-list neighbour lists with a skin (Warp kernels, CPU and CUDA alike).

``build_neighbor_list`` returns a *full* list in CSR form: for every query point ``i`` the
points ``j`` (and the periodic image ``S`` of ``j``) with ``|x[j] + S @ cell - x[i]| <
cutoff``.  Both ``(i, j, S)`` and ``(j, i, -S)`` appear; a point's own periodic images
appear when the box is smaller than the cutoff.  Triclinic cells, any mix of periodic and
open axes, boxes smaller than the cutoff (many images) and positions outside the cell are
handled.

``SkinNeighborList`` adds the Verlet-skin policy: the list is built with radius
``cutoff + skin`` and is rebuilt when some point has moved more than ``skin / 2`` since the
last build.  The displacement is measured on the positions the caller integrates, which
the engine never wraps between rebuilds, so a fold through a periodic boundary can never
hide a move (a bug other engines shipped: docs/design.md, "State and wrapping").
"""
from __future__ import annotations

import math

import torch

from . import neighbor_kernels as nk
from .cell import inverse_transpose, perpendicular_widths, regularise_open_axes
from .neighbor_scan import candidate_words, prune_args, scan_serial
from .warp_setup import (
    KeptLaunch,
    as_array,
    as_vec3,
    as_vec3i,
    as_views,
    init_warp,
    launch_generic,
    scalar_type,
    wp_device,
)

wp = init_warp()
_BIN_POINTS = KeptLaunch(nk.bin_points)   # the CPU's binning launch, replayed


class NeighborList:
    """A full neighbour list in CSR form.

    offsets:   (n_query + 1,) int32, edges of query point i are ``offsets[i]:offsets[i+1]``
    neighbors: (E,) int32, the neighbour j of each edge
    shifts:    (E, 3) int32, lattice image S of each edge: ``r_ij = x[j] + S @ cell - x[i]``
    cutoff:    the radius the list was built with (Å)
    n_points:  number of points searched (query points are the first ``n_query`` of them)
    packed:    (E,) int64 or None: the same edges, one word each (:func:`unpack_edges`'s
               format in domain/neighbor_kernels.py), kept by the build when the shifts fit.
               A kernel walking a point's edges in one thread reads one word per edge
               instead of four; on a GPU the number of such scattered reads, not their
               bytes, sets the cost (docs/benchmarks.md, "LJ at 4 M atoms").

    half:      True for a half list (``build_neighbor_list(half=True)``): one edge per pair of
               query points, edges to the other points kept; False: full.
    order:     (n_query,) int32 or None: the query points in the build's (bin, id) order, a
               function of the points' positions and ids only, never of their memory order
               (the build sets it). A half list's edge of a pair of query points belongs to the
               point earlier in this order; a kernel that scatters the force on j to j's row
               while visiting the points in this order sums every row in an order that does not
               depend on memory order either (models/lj_kernels.py).

    A list may be given its packed edges alone (the build does this): ``neighbors`` and
    ``shifts`` are then unpacked on first access and kept. A model that reads only the packed
    words (Lennard-Jones) never pays for them: 8 bytes per edge instead of 24, and no unpack
    pass per build. Treat a list as immutable.
    """

    def __init__(self, offsets: torch.Tensor, neighbors: torch.Tensor | None = None,
                 shifts: torch.Tensor | None = None, *, cutoff: float, n_points: int,
                 packed: torch.Tensor | None = None, half: bool = False, order: torch.Tensor | None = None):
        if (neighbors is None or shifts is None) and packed is None:
            raise ValueError("NeighborList needs neighbors and shifts, or packed edges")
        self.offsets = offsets
        self._neighbors = neighbors
        self._shifts = shifts
        self.cutoff = float(cutoff)
        self.n_points = int(n_points)
        self.packed = packed
        self.half = bool(half)
        self.order = order

    @property
    def neighbors(self) -> torch.Tensor:
        if self._neighbors is None:
            self._unpack()
        return self._neighbors

    @property
    def shifts(self) -> torch.Tensor:
        if self._shifts is None:
            self._unpack()
        return self._shifts

    @property
    def has_arrays(self) -> bool:
        """True once ``neighbors`` and ``shifts`` exist (given, or unpacked by a first access)."""
        return self._neighbors is not None

    def _unpack(self) -> None:
        e, device = int(self.packed.shape[0]), self.packed.device
        neighbors = torch.empty(max(e, 1), dtype=torch.int32, device=device)
        shifts = torch.empty(max(e, 1), 3, dtype=torch.int32, device=device)
        if e:
            wp.launch(nk.unpack_edges, dim=e, device=wp_device(self.packed),
                      inputs=[as_array(self.packed), as_array(neighbors), as_vec3i(shifts)])
        self._neighbors, self._shifts = neighbors[:e], shifts[:e]

    def fields(self) -> dict:
        """The constructor's arguments that give this list (arrays not yet unpacked stay None)."""
        return {"offsets": self.offsets, "neighbors": self._neighbors, "shifts": self._shifts,
                "cutoff": self.cutoff, "n_points": self.n_points, "packed": self.packed, "half": self.half,
                "order": self.order}

    def replace(self, **changes) -> "NeighborList":
        """A list of the same type with some constructor arguments changed. Changing the edges
        (``neighbors``, ``shifts``) keeps ``packed`` only if it is changed too: stale packed
        words would describe other edges."""
        fields = {**self.fields(), **changes}
        if ("neighbors" in changes or "shifts" in changes) and "packed" not in changes:
            fields["packed"] = None
            for name in ("neighbors", "shifts"):   # the one not changed, unpacked if need be
                if name not in changes:
                    fields[name] = getattr(self, name)
        return type(self)(**fields)

    def without_packed(self) -> "NeighborList":
        """The same edges as arrays only (``packed`` None)."""
        return self.replace(neighbors=self.neighbors, shifts=self.shifts, packed=None)

    @property
    def n_query(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def n_edges(self) -> int:
        return int((self.packed if self._neighbors is None else self._neighbors).shape[0])

    def centers(self) -> torch.Tensor:
        """(E,) int64 index i of each edge (the centre / receiver)."""
        counts = (self.offsets[1:] - self.offsets[:-1]).long()
        # output_size given: no device->host read of the total (a sync per call on CUDA)
        return torch.repeat_interleave(
            torch.arange(self.n_query, device=self.offsets.device), counts, output_size=self.n_edges
        )

    def edge_index(self) -> torch.Tensor:
        """(2, E) int64: row 0 the centre i, row 1 the neighbour j."""
        return torch.stack([self.centers(), self.neighbors.long()])

    def shift_vectors(self, cell: torch.Tensor) -> torch.Tensor:
        """(E, 3) Cartesian image offsets ``S @ cell`` in Å for the given (current) cell."""
        return self.shifts.to(cell.dtype) @ cell


#: bins per cutoff length: bins of ~cutoff/2 scanned 2 deep (5^3 bins) cover less volume than
#: cutoff-wide bins scanned 1 deep (3^3), and finer bins cost more per bin than they save
#: (docs/benchmarks.md, "The neighbour build").
BINS_PER_CUTOFF = 2


def _bin_grid(cell: torch.Tensor, pbc: tuple[bool, bool, bool], cutoff: float, n: int):
    """Bins per axis (each at least ``cutoff / BINS_PER_CUTOFF`` wide, perpendicular to its
    faces) and the number of bins to scan on each side."""
    widths = perpendicular_widths(cell)
    nb, reach = [], []
    for k in range(3):
        w = float(widths[k])
        nbk = max(1, int(math.floor(w * BINS_PER_CUTOFF / cutoff))) if cutoff > 0 else 1
        # keep the grid small for tiny systems and sparse open axes
        nbk = min(nbk, max(1, int(round(n ** (1.0 / 3.0))) * 2 + 1), 1024)
        nb.append(nbk)
        bin_width = w / nbk
        reach.append(max(1, int(math.ceil(cutoff / bin_width))))
        if not pbc[k]:
            reach[k] = min(reach[k], nbk - 1) if nbk > 1 else 0
    return nb, reach


def bin_points(positions: torch.Tensor, cell: torch.Tensor, pbc: tuple[bool, bool, bool], nb):
    """Bin points on the grid of ``nb`` (3,) bins per axis (one Warp kernel).

    positions: (n, 3) Å; cell: (3, 3) Å, a usable frame (domain/cell.py :func:`regularise_open_axes`).
    Returns the positions wrapped on periodic axes (n, 3) Å, their bin images (n, 3) int32
    (``positions = wrapped + images @ cell``) and linear bins (n,) int32,
    ``(b0 * nb1 + b1) * nb2 + b2`` (clamped to the grid on open axes)."""
    n, device = int(positions.shape[0]), positions.device
    cell = cell.to(dtype=positions.dtype, device=device).contiguous()
    x = positions.contiguous()
    xw = torch.empty_like(x)
    img = torch.empty(n, 3, dtype=torch.int32, device=device)
    bin_of = torch.empty(n, dtype=torch.int32, device=device)
    if n:
        args = [x, inverse_transpose(cell)[None], cell[None], wp.vec3i(*[int(p) for p in pbc]), wp.vec3i(*nb), xw, img,
                bin_of]
        if device.type == "cpu":
            _BIN_POINTS(x.dtype, n, "cpu", args)
        else:
            launch_generic(nk.bin_points, x.dtype, n, wp_device(positions), as_views(args))
    return xw, img, bin_of


#: the CPU's one-pass search (``scan_serial``: edges written at a running cursor); False: the
#: two passes every device runs (tests compare the two lists)
ONE_PASS_ON_CPU = True


def build_neighbor_list(
    positions: torch.Tensor,
    cell: torch.Tensor,
    pbc,
    cutoff: float,
    ids: torch.Tensor | None = None,
    n_query: int | None = None,
    half: bool = False,
    capacity: int | None = None,
    binning=None,
) -> NeighborList:
    """Build a full neighbour list.

    positions: (n, 3) Å, float32 or float64, any values (need not be wrapped)
    cell:      (3, 3) Å, rows are lattice vectors; ignored on open axes except as a frame
    pbc:       three bools (tensor or sequence): periodic axes
    cutoff:    search radius in Å (the model cutoff plus any skin)
    ids:       (n,) int64 global ids: points in a bin are visited in id order, so the
               edge order of a point never depends on memory order (default: index)
    n_query:   build lists for the first ``n_query`` points only (default: all)
    half:      one edge per pair of query points (Newton's third law; edges to the other
               points all kept): see ``scan_neighbors`` in domain/neighbor_kernels.py
    capacity:  on the CPU, the edges expected (e.g. the last build's, scaled): the search
               writes up to that many in its one pass over the candidates; more cost a second
               pass, a larger reserve only untouched memory. None: a third of the candidates
               (a sphere fills ~27 % of the scanned cube of bins)
    binning:   these points' ``spatial_sort.Binning`` (they are in its order: (bin, id)) on
               this search's grid: taken instead of binning and sorting them again (ignored
               for a list with other points than the query points, or another grid)

    Two steps: the points binned and sorted by (bin, id) (:class:`_Bins`), then the scan
    (:func:`_scan`): on the CPU one serial pass that writes packed edges at a running cursor,
    visiting only the bins within reach of each point; elsewhere one mask bit per candidate
    pair (:func:`~.neighbor_scan.candidate_words`), a pass that counts and one that emits
    packed edges, or neighbour and shift arrays when an image is too far for the packed form.
    """
    n = int(positions.shape[0])
    device = positions.device
    pbc_t = tuple(bool(p) for p in (pbc.tolist() if torch.is_tensor(pbc) else pbc))
    nq = n if n_query is None else int(n_query)
    if n == 0 or nq == 0:
        return NeighborList(
            offsets=torch.zeros(nq + 1, dtype=torch.int32, device=device),
            neighbors=torch.zeros(0, dtype=torch.int32, device=device),
            shifts=torch.zeros(0, 3, dtype=torch.int32, device=device),
            cutoff=float(cutoff),
            n_points=n,
            half=half,
            order=torch.arange(nq, dtype=torch.int32, device=device),
        )
    cell = cell.to(dtype=positions.dtype, device=device).contiguous()
    # An open axis needs a usable frame vector even if the user gave a zero one.
    cell = regularise_open_axes(cell, pbc_t, positions, cutoff)
    b = _Bins(positions, cell, pbc_t, cutoff, ids, nq, split=half, binning=binning)
    return _scan(b, cell, pbc_t, cutoff, half, nq, capacity)


class _Bins:
    """The points binned and sorted by (bin, id): what the scan kernel reads.

    nb, reach: bins per axis and bins searched each way; xs (n, 3): wrapped positions in
    sorted order (bins read contiguously); img (n, 3): bin images of the wrap; bin_of (n,):
    each point's bin; order (n,): sorted slot -> point; rank: point -> slot; start (n_bins + 1,):
    the first slot of each bin; per_bin: points per bin; visit: the query points in sorted
    order (a half list's visit order).

    ``split`` (a half list with ghosts, ``nq < n``): the query points first, sorted by (bin,
    id), then the others, sorted the same way; ``start`` is (2 (n_bins + 1),), the query part's
    bin starts and then the others'. A row of bins is then two contiguous runs, and the scan
    skips the query points before ``i``'s slot as it does for ``half == 2`` (half the
    candidates) instead of testing every one (the ghosts are all kept)."""

    def __init__(self, positions, cell, pbc_t, cutoff, ids, nq, split=False, binning=None):
        n, device = int(positions.shape[0]), positions.device
        self.nb, self.reach = _bin_grid(cell, pbc_t, cutoff, n)
        self.n, self.dtype = n, positions.dtype
        if binning is not None and nq == n and tuple(binning.nb) == tuple(self.nb) and binning.bin_of.shape[0] == n:
            self._presorted(binning)
            return
        xw, self.img, self.bin_of = bin_points(positions, cell, pbc_t, self.nb)
        # points sorted by (bin, id): a stable sort by id, then a stable sort by bin
        if ids is None:
            order = torch.argsort(self.bin_of, stable=True)
        else:
            by_id = torch.argsort(ids, stable=True)
            order = by_id[torch.argsort(self.bin_of[by_id], stable=True)]
        n_bins = self.nb[0] * self.nb[1] * self.nb[2]
        self.per_bin = torch.bincount(self.bin_of.long(), minlength=n_bins)
        split = split and 0 < nq < n
        if split:   # then by part (query points first), stable: each part stays in (bin, id) order
            order = order[torch.argsort((order >= nq).to(torch.int8), stable=True)]
            owned = torch.bincount(self.bin_of[:nq].long(), minlength=n_bins)
            bin_start = torch.zeros(2, n_bins + 1, dtype=torch.int64, device=device)
            bin_start[0, 1:] = torch.cumsum(owned, 0)
            bin_start[1, 1:] = torch.cumsum(self.per_bin - owned, 0)
            bin_start[1] += nq
            bin_start = bin_start.reshape(-1)
        else:
            bin_start = torch.zeros(n_bins + 1, dtype=torch.int64, device=device)
            bin_start[1:] = torch.cumsum(self.per_bin, 0)
        self.order, self.start = order.to(torch.int32).contiguous(), bin_start.to(torch.int32).contiguous()
        self.rank = torch.empty_like(self.order)
        self.rank[order] = torch.arange(n, dtype=torch.int32, device=device)
        # the query points in sorted order: all, the first part, or those among the others
        self.visit = self.order if nq == n else self.order[:nq] if split else self.order[self.order < nq].contiguous()
        self.xs = torch.index_select(xw, 0, order)
        self.identity = False   # slot p holds point order[p]

    def _presorted(self, binning) -> None:
        """The points are in (bin, id) order already, binned on this grid: slot p is point p."""
        self.img, self.bin_of, self.xs = binning.img, binning.bin_of, binning.wrapped
        n_bins = self.nb[0] * self.nb[1] * self.nb[2]
        self.per_bin = torch.bincount(self.bin_of.long(), minlength=n_bins)
        self.start = torch.zeros(n_bins + 1, dtype=torch.int32, device=self.xs.device)
        self.start[1:] = torch.cumsum(self.per_bin, 0)
        self.order = torch.arange(self.n, dtype=torch.int32, device=self.xs.device)
        self.rank = self.visit = self.order
        self.identity = True


def _scan(b: _Bins, cell, pbc_t, cutoff, half, nq, capacity) -> NeighborList:
    """The search over the binned points and its list: :func:`~.neighbor_scan.scan_serial` on the
    CPU, else the scan kernel's passes (0: count; 2: emit packed edges; 1: emit neighbour and
    shift arrays)."""
    n, device = b.n, b.xs.device
    half_mode = (2 if nq == n else 1) if half else 0
    # a shift component is (bin periods folded, at most ceil(reach / nb)) + img_i - img_j
    fold = max((-(-b.reach[k] // b.nb[k]) for k in range(3) if pbc_t[k]), default=0)

    def packable(max_img: int) -> bool:   # every edge's shift fits the packed word
        return fold + 2 * max_img < nk.PACK_LIMIT

    def made(offsets, **edges) -> NeighborList:
        return NeighborList(offsets=offsets, cutoff=float(cutoff), n_points=n, half=half, order=b.visit, **edges)

    bins = [b.rank, b.start, b.bin_of, b.img, cell[None], wp.vec3i(*[int(p) for p in pbc_t]), wp.vec3i(*b.nb),
            wp.vec3i(*b.reach), scalar_type(b.dtype)(float(cutoff) ** 2)]   # tensors: viewed at the launch
    if device.type == "cpu" and ONE_PASS_ON_CPU and packable(max_img := int(b.img.abs().max())):
        prune = prune_args(cell, b, cutoff, max_img)
        offsets, packed = scan_serial(b, [b.xs, *bins, half_mode], prune, pbc_t, nq, capacity)
        return made(offsets, packed=packed)
    bins = as_views(bins)
    word_start, n_words, max_img = candidate_words(b, pbc_t, nq)
    i32 = dict(dtype=torch.int32, device=device)
    mask, counts, offsets = torch.empty(max(n_words, 1), **i32), torch.zeros(nq, **i32), torch.zeros(nq + 1, **i32)
    common = [as_vec3(b.xs), as_array(b.order), *bins, as_array(word_start.to(torch.int32)), half_mode]
    mask_w = wp.from_torch(mask, dtype=wp.uint32)

    def launch(mode, neighbors=None, shifts=None, packed=None):   # None: a dummy of one element
        launch_generic(nk.scan_neighbors, b.dtype, nq, wp_device(b.xs),
                       common + [mode, mask_w, as_array(offsets), as_array(counts),
                                 as_array(torch.zeros(1, **i32) if neighbors is None else neighbors),
                                 as_vec3i(torch.zeros(1, 3, **i32) if shifts is None else shifts),
                                 as_array(torch.zeros(1, dtype=torch.int64, device=device) if packed is None
                                          else packed)])

    launch(0)
    offsets[1:] = torch.cumsum(counts, 0)
    n_edges = int(offsets[-1])
    if packable(max_img):   # packed edges only: arrays unpacked when asked for
        packed = torch.empty(max(n_edges, 1), dtype=torch.int64, device=device)
        launch(2, packed=packed)
        return made(offsets, packed=packed[:n_edges])
    # points many cells away from the cell (unwrapped input): write the edges directly
    neighbors = torch.empty(max(n_edges, 1), dtype=torch.int32, device=device)
    shifts = torch.empty(max(n_edges, 1), 3, dtype=torch.int32, device=device)
    launch(1, neighbors=neighbors, shifts=shifts)
    return made(offsets, neighbors=neighbors[:n_edges], shifts=shifts[:n_edges])


class SkinNeighborList:
    """Verlet-skin bookkeeping around :func:`build_neighbor_list`.

    cutoff: model cutoff (Å); skin: extra radius (Å). The list radius is ``cutoff + skin``.
    ``needs_rebuild`` is true when any point moved more than ``skin / 2`` (on the positions
    the caller integrates, never wrapped between builds) or the cell changed.

    box_check: the cell changes every step (a barostat) and the caller measures displacements
    against the cell's deformation since the build (the engine's ``RankDomain.displacement``;
    the bound is derived in docs/design.md, "NPT under decomposition"): this list then only
    keeps the build's positions and cell for it. Without it another cell means a new list.
    """

    def __init__(self, cutoff: float, skin: float, box_check: bool = False):
        if skin < 0:
            raise ValueError("neighbor.skin must be >= 0 Å")
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        self.box_check = bool(box_check)
        self.current: NeighborList | None = None
        self._x0: torch.Tensor | None = None
        self._cell0: torch.Tensor | None = None
        self._cell_seen: tuple = (None, -1)   # (the build's cell tensor, its version then)
        self.n_builds = 0
        #: build half lists (``build_neighbor_list(half=True)``), for a model that asks for them
        self.half = False

    @property
    def radius(self) -> float:
        return self.cutoff + self.skin

    @property
    def reference(self) -> torch.Tensor | None:
        """(n_query, 3) the query points' positions at the last build (what displacements are
        measured from); None before the first build."""
        return self._x0

    @property
    def build_cell(self) -> torch.Tensor | None:
        """(3, 3) Å: the cell of the last build (None before it)."""
        return self._cell0

    def max_displacement(self, positions: torch.Tensor) -> torch.Tensor:
        """0-d tensor: largest displacement (Å) of any point since the last build."""
        if self._x0 is None or self._x0.shape != positions.shape:
            return torch.tensor(float("inf"), dtype=positions.dtype)
        if not positions.shape[0]:
            return torch.zeros((), dtype=positions.dtype)
        # one fused norm, cheaper than square().sum().max(); this runs every step
        # (docs/benchmarks.md, "The neighbour build")
        return torch.linalg.vector_norm(positions - self._x0, dim=1).amax()

    def cell_changed(self, cell: torch.Tensor) -> bool:
        """True when ``cell`` differs from the cell of the last build (or there was none).
        The very tensor of the build, not written since (its version counter), is answered
        without comparing values: on a GPU that comparison is a device->host read."""
        if self._cell0 is None:
            return True
        if cell is self._cell_seen[0] and cell._version == self._cell_seen[1]:
            return False
        return not torch.equal(cell, self._cell0)

    def serves(self, positions: torch.Tensor) -> bool:
        """True when a list was built for as many points as ``positions`` holds."""
        return self.current is not None and self._x0 is not None and self._x0.shape == positions.shape

    def stale(self, positions: torch.Tensor, cell: torch.Tensor) -> bool:
        """True when the list cannot serve these points at all: none built, another number of
        points, or another cell (a changing cell is the caller's to measure: ``box_check``)."""
        return not self.serves(positions) or self.cell_changed(cell)

    def needs_rebuild(self, positions: torch.Tensor, cell: torch.Tensor) -> bool:
        """The fixed-cell rule: stale, or a point moved more than skin / 2 since the build."""
        if self.stale(positions, cell):
            return True
        return bool(self.max_displacement(positions) > 0.5 * self.skin)

    def build(self, positions, cell, pbc, ids=None, n_query=None, binning=None) -> NeighborList:
        last = self.current
        nq = int(positions.shape[0] if n_query is None else n_query)
        # the last build's edges per query point, 10 % more: the CPU search's one-pass reserve
        cap = (None if last is None or last.n_query == 0 or last.half != self.half
               else int(1.1 * last.n_edges * nq / last.n_query) + 64)
        self.current = build_neighbor_list(positions, cell, pbc, self.radius, ids=ids, n_query=n_query,
                                           half=self.half, capacity=cap, binning=binning)
        # displacements are checked on the query (owned) points; ghosts mirror their owners
        self._x0 = positions[: self.current.n_query].detach().clone()
        self._cell0 = cell.detach().clone()
        self._cell_seen = (cell, cell._version)
        self.n_builds += 1
        return self.current
