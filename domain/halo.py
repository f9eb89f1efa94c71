"""Ghost (halo) points: which owned points each neighbour needs, and the exchanges.

A rank's points are laid out ``[owned | ghosts]``.  Ghosts are found in one sweep per split
axis (LAMMPS's staged scheme): along axis k, the points (owned, and ghosts received along
earlier axes) within the ghost width of the lower face go to the lower neighbour, those
near the upper face to the upper neighbour.  Corners and edges arrive in two or three
hops, so only the six face neighbours are ever contacted.  Crossing the periodic boundary
adds an integer lattice image to the ghost; a ghost's position is always
``owner position + shift @ cell`` with the *current* cell.

Exchanges (all out of place and differentiable):

- :func:`halo_forward`  ``(n_owned, F) -> (n_padded, F)``: ghosts copy their owners' rows;
- :func:`halo_reverse`  ``(n_padded, F) -> (n_owned, F)``: ghost rows are added to their
  owners' rows, sweep by sweep in reverse, in plan order (never arrival order).

Each is the other's adjoint, and each one's autograd backward is the other.  A single
domain (grid 1x1x1) has no ghosts: both are identities.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cell import perpendicular_widths, to_fractional
from .comm import Comm
from .decomposition import DomainGrid
from .exchange import swap, swap_counts, swap_into, tag


@dataclass
class HaloStep:
    """One direction of one sweep: rows sent to a peer and the slots its rows fill here."""

    axis: int
    toward_upper: bool
    send_peer: int
    send_idx: torch.Tensor     # (m,) int64 local rows sent
    recv_peer: int
    recv_start: int            # first local row filled by the peer's rows
    recv_count: int


@dataclass
class HaloPlan:
    """Who sends what to whom; built at every neighbour rebuild."""

    n_owned: int
    steps: list[HaloStep] = field(default_factory=list)
    ghost_shift: torch.Tensor | None = None   # (n_ghost, 3) int32 lattice image of each ghost
    n_filler: int = 0   # rows after the ghosts of no point (graph padding): zero forward, dropped in reverse

    @property
    def n_ghost(self) -> int:
        return 0 if self.ghost_shift is None else int(self.ghost_shift.shape[0])

    @property
    def n_padded(self) -> int:
        return self.n_owned + self.n_ghost + self.n_filler


def split_axes(grid: DomainGrid) -> list[int]:
    return [k for k in range(3) if grid.shape[k] > 1]


def local_pbc(grid: DomainGrid, pbc) -> tuple[bool, bool, bool]:
    """Periodicity a rank's neighbour search must apply itself: unsplit periodic axes."""
    return tuple(bool(pbc[k]) and grid.shape[k] == 1 for k in range(3))


def _neighbours(grid: DomainGrid, rank: int, axis: int, pbc) -> tuple[int | None, int | None, int, int]:
    """(lower peer, upper peer, image added when sending down, image added when sending up)."""
    c = list(grid.coords(rank))
    p = grid.shape[axis]
    lower = upper = None
    wrap_down = wrap_up = 0
    if c[axis] > 0 or pbc[axis]:
        cc = list(c)
        cc[axis] = (c[axis] - 1) % p
        lower = grid.rank_of(cc)
        wrap_down = 1 if c[axis] == 0 else 0
    if c[axis] < p - 1 or pbc[axis]:
        cc = list(c)
        cc[axis] = (c[axis] + 1) % p
        upper = grid.rank_of(cc)
        wrap_up = -1 if c[axis] == p - 1 else 0
    return lower, upper, wrap_down, wrap_up


def build_halo(comm: Comm, grid: DomainGrid, cell: torch.Tensor, pbc, positions: torch.Tensor,
               labels: torch.Tensor, ghost_width: float):
    """Plan the ghosts of this rank and fetch their positions and integer labels.

    positions: (n_owned, 3) Å of the owned points (wrapped into the cell);
    labels: (n_owned, L) int64 per-point integers that ghosts carry (e.g. id, species).
    Returns (plan, ghost positions (n_ghost, 3), ghost labels (n_ghost, L)).
    """
    n_owned = int(positions.shape[0])
    dtype, device = positions.dtype, positions.device
    pos = positions.detach()
    if not split_axes(grid):   # one domain: no ghosts (its search applies the periodicity itself)
        none = torch.zeros(0, 3, dtype=torch.int32, device=device)
        return HaloPlan(n_owned=n_owned, ghost_shift=none), pos[n_owned:].clone(), labels[n_owned:].clone()
    shift = torch.zeros(n_owned, 3, dtype=torch.int32, device=device)
    lab = labels
    widths = perpendicular_widths(cell)
    plan = HaloPlan(n_owned=n_owned)
    for axis in split_axes(grid):
        lower, upper, wrap_down, wrap_up = _neighbours(grid, comm.rank, axis, pbc)
        c = grid.coords(comm.rank)[axis]
        p = grid.shape[axis]
        lo, hi = c / p, (c + 1) / p
        g = float(ghost_width / widths[axis])
        seen = pos + shift.to(dtype) @ cell
        f = to_fractional(seen, cell)[:, axis] if seen.shape[0] else seen[:, 0]
        # one step per direction of travel: down (send to lower, receive from upper), then up
        steps = []
        for up in (False, True):
            send_peer, wrap = (upper, wrap_up) if up else (lower, wrap_down)
            recv_peer = lower if up else upper
            if send_peer is not None:
                idx = torch.nonzero((f >= hi - g) if up else (f < lo + g)).flatten()
            else:
                idx = torch.zeros(0, dtype=torch.int64, device=device)
            new_shift = shift[idx].clone()
            new_shift[:, axis] += wrap
            steps.append((up, -1 if send_peer is None else send_peer, idx, new_shift,
                          -1 if recv_peer is None else recv_peer))
        counts = swap_counts(comm, [(sp, int(idx.numel()), tag(axis, up, 3)) for up, sp, idx, _, _ in steps if sp >= 0],
                             [(rp, tag(axis, up, 3)) for up, _, _, _, rp in steps if rp >= 0])
        counts = iter(counts)
        recv_counts = [next(counts) if rp >= 0 else 0 for _, _, _, _, rp in steps]
        sends, recvs = [], []
        for (up, sp, idx, sh, rp), n in zip(steps, recv_counts):
            if sp >= 0:
                sends += [(sp, pos[idx], tag(axis, up, 4)), (sp, sh.to(torch.int64), tag(axis, up, 5)),
                          (sp, lab[idx], tag(axis, up, 6))]
            if rp >= 0:
                recvs += [(rp, (n, 3), dtype, tag(axis, up, 4)), (rp, (n, 3), torch.int64, tag(axis, up, 5)),
                          (rp, (n, lab.shape[1]), torch.int64, tag(axis, up, 6))]
        got = iter(swap(comm, sends, recvs))
        start = pos.shape[0]
        parts = []
        for (up, sp, idx, _, rp), n in zip(steps, recv_counts):
            plan.steps.append(HaloStep(axis=axis, toward_upper=up, send_peer=sp, send_idx=idx,
                                       recv_peer=rp, recv_start=start, recv_count=n))
            if rp >= 0:
                parts.append((next(got), next(got), next(got)))
                start += n
        for gp, gs, gl in parts:
            pos = torch.cat([pos, gp])
            shift = torch.cat([shift, gs.to(torch.int32)])
            lab = torch.cat([lab, gl])
    plan.ghost_shift = shift[n_owned:].contiguous()
    ghost_pos = pos[n_owned:] + plan.ghost_shift.to(dtype) @ cell
    return plan, ghost_pos, lab[n_owned:]


# -- exchanges ----------------------------------------------------------------------------
def _axis_groups(plan: HaloPlan) -> list[list[HaloStep]]:
    """The plan's steps grouped by sweep (axis), in sweep order."""
    groups: list[list[HaloStep]] = []
    for s in plan.steps:
        if groups and groups[-1][0].axis == s.axis:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def _forward(comm: Comm, plan: HaloPlan, x: torch.Tensor) -> torch.Tensor:
    """One output buffer of n_padded rows: owned rows copied in, each sweep's sends packed
    (gathered rows), its receives landing in place in their planned slots (no concatenation)."""
    n_own, n_ghost = plan.n_owned, plan.n_ghost
    out = x.new_empty((plan.n_padded, *x.shape[1:]))
    out[:n_own] = x[:n_own]
    if plan.n_filler:
        out[n_own + n_ghost:] = 0
    for group in _axis_groups(plan):
        sends = [(s.send_peer, out[s.send_idx], tag(s.axis, s.toward_upper, 1)) for s in group if s.send_peer >= 0]
        recvs = [(s.recv_peer, out[s.recv_start:s.recv_start + s.recv_count], tag(s.axis, s.toward_upper, 1))
                 for s in group if s.recv_peer >= 0]
        swap_into(comm, sends, recvs)
    return out


def _reverse(comm: Comm, plan: HaloPlan, g: torch.Tensor) -> torch.Tensor:
    """One working copy of ``g``: sweeps in reverse; each sends its ghost rows (contiguous
    slices) back to their owners and adds what it receives into its own rows, in plan order."""
    buf = g.clone(memory_format=torch.contiguous_format)
    for group in reversed(_axis_groups(plan)):
        sends = [(s.recv_peer, buf[s.recv_start:s.recv_start + s.recv_count], tag(s.axis, s.toward_upper, 2))
                 for s in group if s.recv_peer >= 0]
        back = [s for s in group if s.send_peer >= 0]
        recvs = [(s.send_peer, (int(s.send_idx.numel()), *g.shape[1:]), g.dtype, tag(s.axis, s.toward_upper, 2))
                 for s in back]
        got = swap(comm, sends, recvs)
        # the rows a sweep adds into (its senders' rows) all precede the rows it sent back
        for s, contrib in zip(back, got):
            if contrib.numel():
                buf.index_add_(0, s.send_idx, contrib)
    return buf[: plan.n_owned]


class _HaloForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, plan):
        ctx.comm, ctx.plan = comm, plan
        with torch.no_grad():
            return _forward(comm, plan, x)

    @staticmethod
    def backward(ctx, grad):
        return _HaloReverse.apply(grad.contiguous(), ctx.comm, ctx.plan), None, None


class _HaloReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, comm, plan):
        ctx.comm, ctx.plan = comm, plan
        with torch.no_grad():
            return _reverse(comm, plan, g)

    @staticmethod
    def backward(ctx, grad):
        return _HaloForward.apply(grad.contiguous(), ctx.comm, ctx.plan), None, None


def halo_forward(comm: Comm, plan: HaloPlan, x: torch.Tensor) -> torch.Tensor:
    """(n_owned or more, *F) -> (n_padded, *F): owned rows kept, ghost rows copied from owners."""
    if plan.n_ghost == 0 and not plan.steps and not plan.n_filler:
        return x[: plan.n_owned]
    return _HaloForward.apply(x, comm, plan)


def halo_reverse(comm: Comm, plan: HaloPlan, g: torch.Tensor) -> torch.Tensor:
    """(n_padded, *F) -> (n_owned, *F): each owned row plus its ghosts' rows on every rank."""
    if plan.n_ghost == 0 and not plan.steps and not plan.n_filler:
        return g[: plan.n_owned]
    return _HaloReverse.apply(g, comm, plan)


def ghost_positions(comm: Comm, plan: HaloPlan, owned_positions: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """(n_padded, 3) Å: owned positions followed by ghost positions at their images."""
    padded = halo_forward(comm, plan, owned_positions)
    if plan.n_ghost == 0:
        return padded
    shift = torch.cat([torch.zeros(plan.n_owned, 3, dtype=owned_positions.dtype, device=owned_positions.device),
                       plan.ghost_shift.to(owned_positions.dtype) @ cell])
    return padded + shift
