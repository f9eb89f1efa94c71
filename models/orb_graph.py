"""ORB's capped graph on any number of domains, and the ORB terms that need it outside the
network (the ZBL pair repulsion, the net-torque removal of direct forces).

ORB's graph (orb-models ``compute_pbc_radius_graph``): every atom, as a *sender*, is joined to
its ``max_neighbors`` nearest atoms (periodic images included, itself excluded) closer than the
radius; the edge vector is ``x_receiver - x_sender`` (Å).  The graph is directed and not
symmetric: ``j`` can be among ``i``'s nearest without ``i`` being among ``j``'s.  A layer
updates every edge from its two end atoms and every atom from the sums over *both* its out-edges
and its in-edges, so an owned atom needs

- its out-edges: its own K nearest, chosen from its full candidate set, which the engine's
  receiver-owned list of one cutoff holds on its rank;
- its in-edges: the atoms ``j`` within the radius whose own K nearest include it.  Whether they
  do depends on ``j``'s whole neighbourhood, up to two radii from the owned atom.

Route, and why: instead of a halo of two radii (twice as deep: up to 8 times the halo volume) for the second point,
each owner computes for every atom it owns the *key of its K-th nearest candidate* (its
threshold) and one forward halo exchange (``refresh_halo``, a (n, 4) float64 tensor) gives the
ghost rows their owners' thresholds.  The in-edge ``j -> i`` of an owned ``i`` is selected iff
its key is at most ``j``'s threshold, so with one cutoff of ghosts every rank holds exactly the
edges of the whole-system graph that touch its owned atoms: out-edges of owned senders (which
partition the global edge set: whole-system edge sums use only these) plus the in-edges from
ghost senders.

Ordering key, ties included: ``(floor(d Q), floor(r_x Q), floor(r_y Q), floor(r_z Q))`` with
``Q = 2**27 / Å`` (a power of two: the scaling is exact), compared lexicographically, with the
edge vector ``r`` (Å) breaking ties of distance.  The same edge is computed on two ranks from
differently stored copies of the atoms (a ghost is its owner's position plus an image
translation, rounded), so raw distances can differ in the last bit, and a raw comparison of
``j``'s K-th distance with the same distance recomputed elsewhere would be decided by the last bit.
Quantised to 7.5e-9 Å the keys agree unless a value lies within rounding (~1e-15 Å) of a
quantum boundary.  Candidates at exactly equal distance (a perfect lattice whose K-th shell is
cut) are ordered by their vectors, which depend on no atom numbering or domain, so the cap is
the same on any number of domains.  orb-models breaks such ties by its k-d tree's traversal
order instead (not reproducible outside its own code); away from exact ties (distances
differing by more than 7.5e-9 Å at the cap) the graph is orb-models' graph.  Candidates are
the list's pairs closer than ``radius + 1e-8`` Å, orb-models' ``knn_scipy`` bound.

Shapes: positions (n_padded, 3) Å, owned rows first; senders, receivers (n_edges,) int64 local
rows; vectors (n_edges, 3) Å; ``n_out``: the first n_out edges are the owned senders' out-edges.
"""
from __future__ import annotations

import torch

from shardmd.domain.api import current_scope, refresh_halo, system_sum

Q = float(2 ** 27)   # 1/Å: quantum of the ordering key (module docstring)
RADIUS_SLACK = 1e-8  # Å: orb-models' knn_scipy distance bound is radius + 1e-8


def _keys(d: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """(n, 4) float64 ordering keys of distances d (n,) Å and vectors r (n, 3) Å."""
    return torch.floor(torch.cat([d[:, None], r], 1).double() * Q)


def _not_after(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise lexicographic ``a <= b`` of (n, 4) keys."""
    out = a[:, 3] <= b[:, 3]
    for c in (2, 1, 0):
        out = (a[:, c] < b[:, c]) | ((a[:, c] == b[:, c]) & out)
    return out


def n_owned_rows(n_padded: int) -> int:
    """The owned rows of a per-atom tensor under the active scope (all rows outside one)."""
    scope = current_scope()
    if scope is None or scope.halo is None:
        return n_padded
    return int(scope.n_owned)


def capped_graph(x: torch.Tensor, cell: torch.Tensor, nl, radius: float, max_neighbors: int):
    """ORB's edges touching the owned atoms (module docstring).  x: (n_padded, 3) Å, plain
    tensor attached to autograd; cell (3, 3) Å.  Returns senders, receivers (n_edges,) int64,
    vectors (n_edges, 3) Å (differentiable) and n_out."""
    n = int(x.shape[0])
    n_owned = n_owned_rows(n)
    i, j = nl.centers().long(), nl.neighbors.long()
    shift = nl.shifts.to(x.dtype) @ cell
    with torch.no_grad():
        r = x[j] + shift - x[i]
        d = torch.linalg.vector_norm(r, dim=1)
        keep = torch.nonzero(d < radius + RADIUS_SLACK).squeeze(1)
        i, j, r, d = i[keep], j[keep], r[keep], d[keep]
        key = _keys(d, r)
        order = torch.arange(len(i), device=x.device)
        for c in (3, 2, 1, 0):   # lexicographic: (sender, key 0..3), the last sort the primary one
            order = order[torch.argsort(key[order, c], stable=True)]
        order = order[torch.argsort(i[order], stable=True)]
        counts = torch.bincount(i, minlength=n)
        start = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=x.device) - start[i[order]]
        chosen = rank < max_neighbors
        # each owned sender's threshold: the key of its K-th nearest (no cap below K candidates)
        threshold = torch.full((n, 4), float("inf"), dtype=torch.float64, device=x.device)
        full = torch.nonzero(counts[:n_owned] > max_neighbors).squeeze(1)
        threshold[full] = key[order[start[full] + max_neighbors - 1]]
        threshold = refresh_halo(threshold).as_subclass(torch.Tensor)   # ghost rows: their owners'
        ghost = j >= n_owned
        back = ghost & _not_after(_keys(d, -r), threshold[j])   # in-edge j -> i, j a ghost sender
        out, inn = torch.nonzero(chosen).squeeze(1), torch.nonzero(back).squeeze(1)
    shift = shift[keep]   # outside no_grad: the strained cell's derivative flows through the shifts
    vec_out = x[j[out]] + shift[out] - x[i[out]]
    vec_in = x[i[inn]] - (x[j[inn]] + shift[inn])
    senders = torch.cat([i[out], j[inn]])
    receivers = torch.cat([j[out], i[inn]])
    return senders, receivers, torch.cat([vec_out, vec_in]), int(out.numel())


def zbl_edges(zbl, z: torch.Tensor, senders, receivers, vectors, gradients: bool):
    """orb-models' ``ZBLBasis`` per edge (its buffers, its expressions; its atom index is
    ``Z + 1``, as its ``argmax`` of a one-hot indexed by Z gives).  Returns the edge energies
    (n_edges,) eV (half the pair term, summed onto senders) and, with ``gradients``, the force
    vectors (n_edges, 3) eV/Å that orb-models adds to receivers and subtracts from senders."""
    i_u, i_v = z[senders] + 1, z[receivers] + 1
    # in the edges' dtype: orb-models' integer products follow the default dtype, which it sets to
    # the model's; this process's default may differ
    Z_u, Z_v = i_u.to(vectors.dtype), i_v.to(vectors.dtype)
    a = zbl.a_prefactor * 0.529 / (torch.pow(Z_u, zbl.a_exp) + torch.pow(Z_v, zbl.a_exp))
    x = vectors.norm(dim=1)
    r_hat = vectors / x.unsqueeze(1)
    r_over_a = x / a
    exp_term = torch.exp(-zbl.d * r_over_a.unsqueeze(0))
    phi = torch.sum(zbl.c * exp_term, dim=0)
    coulomb_term = 14.3996 * Z_u * Z_v / x
    v_edges_raw = coulomb_term * phi
    r_max = zbl.covalent_radii[i_u] + zbl.covalent_radii[i_v]
    envelope, denvelope_dr = zbl._polynomial_cutoff_with_derivative(x, r_max, zbl.p)
    v_edges = 0.5 * v_edges_raw * envelope
    if not gradients:
        return v_edges, None
    dphi_dr = torch.sum(-zbl.d * zbl.c * exp_term, dim=0) / a
    dv_dr_raw = -coulomb_term / x * phi + coulomb_term * dphi_dr
    dv_dr = 0.5 * (dv_dr_raw * envelope + v_edges_raw * denvelope_dr)
    return v_edges, (-dv_dr).unsqueeze(1) * r_hat


def remove_net_torque(x: torch.Tensor, forces: torch.Tensor, n_atoms: torch.Tensor) -> torch.Tensor:
    """orb-models' ``_remove_net_torque`` for one system spread over ranks: every sum over atoms
    is a ``system_sum`` (owned rows, summed over ranks).  x, forces: (n_padded, 3) Å, eV/Å;
    n_atoms: (1,) the system's atom count."""
    system = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    com = system_sum(x, system) / n_atoms
    r = x - com
    tau = system_sum(torch.linalg.cross(r, forces), system)
    s = system_sum(torch.sum(r ** 2, dim=1), system)
    S = system_sum(r.unsqueeze(2) @ r.unsqueeze(1), system)
    M = S - s.view(-1, 1, 1) * torch.eye(3, dtype=x.dtype, device=x.device).unsqueeze(0)
    try:
        mu = torch.linalg.solve(M, (-tau).unsqueeze(2)).squeeze(2)
    except RuntimeError:   # a singular M (atoms on a line), as orb-models
        mu = torch.bmm(torch.linalg.pinv(M), (-tau).unsqueeze(2)).squeeze(2)
    return forces + torch.linalg.cross(r, mu.expand_as(r))


__all__ = ["Q", "capped_graph", "n_owned_rows", "remove_net_torque", "zbl_edges"]
