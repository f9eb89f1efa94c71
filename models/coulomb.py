"""Coulomb electrostatics of point charges in a periodic cell: Ewald or particle-mesh Ewald (PME).

    E = K/2 sum_i sum_j sum'_n q_i q_j / |x_j + n - x_i|,   K = e^2/(4 pi eps0) = 14.399645 eV·Å

(the primed sum leaves out j = i in the home cell).  With the splitting parameter alpha (1/Å):

    ============ ====================================================================
    real space   E_r = K/2 sum over edges r_ij < r_c of q_i q_j erfc(alpha r_ij) / r_ij
    reciprocal   E_k = K 2 pi/V sum_{k != 0} exp(-k^2 / (4 alpha^2)) / k^2 |S(k)|^2,
                 S(k) = sum_i q_i exp(i k·x_i)   (Ewald: an explicit k sum; PME: on a mesh)
    self         E_s = -K alpha / sqrt(pi) sum_i q_i^2
    background   E_b = -K pi Q^2 / (2 V alpha^2),  Q = sum_i q_i   (a neutralising background:
                 zero for a neutral cell; the run's log says so once when Q != 0)
    ============ ====================================================================

Outputs: ``energy`` () eV, ``energies`` (n,) eV (e_i = q_i phi_i / 2 with the self and background
terms split as q_i q_i and q_i Q), ``forces`` (n, 3) eV/Å and ``virial`` (3, 3) eV by autograd
(forces -dE/dx, the virial -dE/d(strain) of positions and cell together: DistributedModel's
``autograd_outputs`` and ``strain_outputs``), so NPT works.

Parameters from ``accuracy`` (a target relative force error, default 1e-6) and the real-space
cutoff r_c (docs/coulomb.md):

    s = sqrt(-ln accuracy),  alpha = s / r_c            erfc(alpha r_c) ~ exp(-s^2) = accuracy
    Ewald: k_max = 2 alpha s                            exp(-k_max^2 / (4 alpha^2)) = accuracy
           |n_a| <= ceil(k_max d_a / (2 pi)) per axis, d_a the spacing of the cell's lattice planes
    PME:   torch-pme's Lagrange interpolation with 7 nodes per axis (the most it has), mesh
           spacing h = 0.45 / (alpha s) (0.12 / alpha at 1e-6), each axis's point count rounded up
           to a product of 2, 3 and 5
           (measured on rattled NaCl, r_c 8 Å, accuracy 1e-6, 215-512 ions: forces within 2-5e-6
           of the largest force from a 1e-13 Ewald sum, energies within 6e-8; Ewald: the same)

Charges: ``charges`` per element (e), turned into one (n,) tensor in :meth:`Coulomb.charges_of`;
``compute`` also takes a per-atom ``charges=`` tensor (``ModelConfig.point_inputs``), which then
replaces the table.

Under domain decomposition (docs/distributed.md): the real-space sum is a pair term over the
engine's receiver-owned list (ghost atoms in the halo, as models/morse.py).  The reciprocal
part needs every charge: Ewald's S(k) and PME's charge mesh are sums over atoms, so each rank
sums its owned atoms (``to_local``) and ``all_reduce_sum`` adds the ranks' parts; every rank then
evaluates the potential at its owned atoms only (a ghost's per-atom energy is its owner's).
The all-reduce's backward sums the cotangents over ranks, so autograd forces and the virial
are exact on any number of domains. Per-rank cost: Ewald O(n_owned n_k) work and 2 n_k numbers
all-reduced; PME O(n_owned p^3) spreading and interpolation, one FFT of the whole mesh on every
rank and the mesh (n_mesh numbers) all-reduced.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    ModelConfig,
    NeighborConfig,
    OutputKind,
    all_reduce_sum,
    current_scope,
    to_local,
)

#: e^2 / (4 pi eps0) in eV·Å (CODATA 2018)
COULOMB_K = 14.399645
METHODS = ("ewald", "pme")
#: k vectors per block of the Ewald sum (bounds the (n, block) cos/sin temporaries)
K_BLOCK = 2048

SPEC_COULOMB = SPEC_MPNN_HALO.replace(
    name="coulomb", description="Ewald/PME: real-space pair term in the halo, reciprocal sums all-reduced, "
                                "autograd forces and virial",
    output_kinds={"energy": OutputKind.PER_GRAPH, "energies": OutputKind.PER_NODE, "forces": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
    owned_only_outputs={"energies", "forces"})


def ewald_parameters(cutoff: float, accuracy: float) -> dict:
    """alpha (1/Å), Ewald k_max (1/Å), PME mesh spacing (Å) and interpolation nodes from the
    real-space cutoff (Å) and the target relative accuracy (the rule of the module docstring)."""
    s = math.sqrt(-math.log(accuracy))
    alpha = s / cutoff
    k_max = 2 * alpha * s
    return {"alpha": alpha, "k_max": k_max, "mesh_spacing": 0.45 / (alpha * s), "nodes": 7}


def _smooth(n: int) -> int:
    """The smallest integer >= n with no prime factor above 5 (fast FFT sizes)."""
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1


def mesh_shape(cell: torch.Tensor, spacing: float) -> torch.Tensor:
    """(3,) PME mesh points per cell vector: |a_i| / spacing rounded up to an FFT-friendly size
    (torch-pme's own ``get_ns_mesh`` rounds up to a power of two, up to 8x the points)."""
    lengths = torch.linalg.norm(cell, dim=1)
    return torch.tensor([_smooth(max(int(math.ceil(float(v) / spacing)), 1)) for v in lengths], device=cell.device)


def _global_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks of a per-rank partial (differentiable both ways); identity on one process."""
    s = current_scope()
    return x if s is None or s.comm is None or s.comm.size == 1 else all_reduce_sum(s.comm, x)


def _owned(x: torch.Tensor) -> torch.Tensor:
    """The rows of the atoms this rank owns (every row outside a decomposition)."""
    return to_local(x) if current_scope() is not None else x


class Coulomb:
    """Ewald or PME electrostatics of fixed charges (see the module docstring).

    charges:  {element: charge in e}, e.g. {"Na": 1.0, "Cl": -1.0}
    cutoff:   real-space cutoff r_c, Å (> 0; the halo is r_c + neighbor.skin deep)
    method:   "ewald" or "pme"
    accuracy: target relative force accuracy (0 < accuracy < 1); sets alpha, k_max and the mesh
    """

    distribution_spec = SPEC_COULOMB

    def __init__(self, charges: Mapping[str, float], cutoff: float = 10.0, method: str = "ewald",
                 accuracy: float = 1e-6):
        from ase.data import atomic_numbers

        if method not in METHODS:
            raise ValueError(f"model.method={method!r} is not a method: use ewald or pme")
        if method == "pme":
            try:
                import torchpme  # noqa: F401 - PME's mesh parts
            except ImportError:
                raise ValueError("model.method=pme needs torch-pme: pip install 'torch-pme>=0.5' (or "
                                 "shardmd[coulomb]), or use model.method=ewald") from None
        if not (isinstance(cutoff, (int, float)) and math.isfinite(cutoff) and cutoff > 0):
            raise ValueError(f"model.cutoff={cutoff!r} is invalid: give a real-space cutoff > 0 in Å")
        if not (isinstance(accuracy, (int, float)) and math.isfinite(accuracy) and 0 < accuracy < 1):
            raise ValueError(f"model.accuracy={accuracy!r} is invalid: give a relative accuracy between 0 and 1, "
                             "e.g. 1e-6")
        if not isinstance(charges, Mapping) or not charges:
            raise ValueError("model.charges is empty: give a charge per element in e, e.g. "
                             "model.charges={Na: 1.0, Cl: -1.0}")
        self.table = torch.full((119,), float("nan"), dtype=torch.float64)
        for el, q in charges.items():
            if el not in atomic_numbers:
                raise ValueError(f"model.charges.{el}: {el!r} is not an element symbol; use one like Na or Cl")
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q):
                raise ValueError(f"model.charges.{el}={q!r} is not a finite charge: give a number in e, "
                                 f"e.g. model.charges.{el}=1.0")
            self.table[atomic_numbers[el]] = float(q)
        self.charges = {str(k): float(v) for k, v in charges.items()}
        self.cutoff, self.method, self.accuracy = float(cutoff), method, float(accuracy)
        self.params = ewald_parameters(self.cutoff, self.accuracy)
        self.alpha = self.params["alpha"]
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff), point_inputs=("charges",))
        #: lines for the run's log, each written once by the engine (the net-charge note)
        self.notes: list[str] = []
        self._mesh = None

    # -- charges: the one place per-atom charges are made ----------------------------------------
    def charges_of(self, numbers: torch.Tensor) -> torch.Tensor:
        """(n,) charges in e of atoms with atomic numbers ``numbers`` (n,), from the element table."""
        return self.table.to(numbers.device)[numbers.long()]

    def default_input(self, name: str, numbers):
        """The per-atom charges (e) the engine passes when neither ``system.charges`` nor the
        structure's ``initial_charges`` give them: the element table (``model.charges``)."""
        if name != "charges":
            return None
        self.check_species(numbers)
        return self.charges_of(torch.as_tensor(numbers)).numpy()

    def check_species(self, numbers) -> None:
        from ase.data import chemical_symbols

        z = torch.as_tensor(numbers).long().unique()
        missing = [chemical_symbols[int(k)] for k in z if torch.isnan(self.table[int(k)])]
        if missing:
            el = missing[0]
            raise ValueError(f"model.charges has no charge for {', '.join(missing)}; add one in e, e.g. "
                             f"model.charges.{el}=1.0")

    # -- the model call ------------------------------------------------------------------------
    def compute(self, positions, cell, pbc, numbers, nl, charges=None) -> dict[str, torch.Tensor]:
        """positions (n, 3) Å, cell (3, 3) Å (rows), pbc (3,), numbers (n,), nl the neighbour list;
        charges: optional (n,) e replacing the element table."""
        if not bool(torch.as_tensor(pbc).all()):   # the system's pbc, on every domain
            raise ValueError("model=coulomb needs a cell periodic along x, y and z (Ewald sums); give a "
                             "periodic structure or system.pbc=[true,true,true]")
        dtype = positions.dtype
        q = (self.charges_of(numbers) if charges is None else charges).to(dtype)
        n = positions.shape[0]
        k, a = COULOMB_K, self.alpha
        volume = torch.linalg.det(cell).abs()

        # real space: a pair term over the receiver-owned list (halo rows completed by the spec)
        i, j = nl.edge_index()
        d = positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)
        r = d.norm(dim=1)
        inside = (r < self.cutoff) & (r > 0)
        r_safe = torch.where(inside, r, torch.ones_like(r))
        pair = torch.where(inside, q[i] * q[j] * torch.erfc(a * r_safe) / r_safe, torch.zeros_like(r))
        real = positions.new_zeros(n).index_add_(0, i, 0.5 * k * pair)

        # reciprocal space: sums over every atom of every rank
        recip = self._ewald(positions, cell, q, volume) if self.method == "ewald" else self._pme(positions, cell, q,
                                                                                               volume)
        # self and background terms; Q = sum of all charges (zero for a neutral cell)
        total = _global_sum(_owned(q).sum().reshape(1))[0]
        self_e = -k * a / math.sqrt(math.pi) * q * q
        background = -k * math.pi * total * q / (2 * volume * a * a)
        if not self.notes:
            self._note(float(total.detach()), float(volume.detach()))

        energies = real + k * recip + self_e + background
        batch = torch.zeros(n, dtype=torch.int64, device=positions.device)
        energy = positions.new_zeros(1).index_add_(0, batch, energies)   # owned rows summed over ranks
        return {"energy": energy[0], "energies": energies}

    def _note(self, total: float, volume: float) -> None:
        if abs(total) > 1e-8:
            e_b = -COULOMB_K * math.pi * total * total / (2 * volume * self.alpha ** 2)
            self.notes.append(f"Note: the cell has a net charge of {total:+.6g} e: the Coulomb energy includes a "
                              f"neutralising background, -pi Q^2/(2 V alpha^2) = {e_b:.6g} eV")
        else:
            self.notes.append("")   # neutral: nothing to say, and nothing to check again

    # -- Ewald: an explicit sum over k vectors ---------------------------------------------------
    def kvectors(self, cell: torch.Tensor) -> torch.Tensor:
        """(n_k, 3) 1/Å: one of each pair +-k with 0 < |k| < k_max, from the (possibly strained) cell."""
        recip = 2 * math.pi * torch.linalg.inv(cell).T            # rows b_a: a_a · b_b = 2 pi delta_ab
        with torch.no_grad():
            spacing = 2 * math.pi / recip.norm(dim=1)             # lattice-plane spacings d_a, Å
            m = [int(math.ceil(self.params["k_max"] * float(s) / (2 * math.pi))) for s in spacing]
            grid = torch.cartesian_prod(*[torch.arange(-v, v + 1, device=cell.device) for v in m])
            half = (grid[:, 0] > 0) | ((grid[:, 0] == 0) & (grid[:, 1] > 0)) | \
                   ((grid[:, 0] == 0) & (grid[:, 1] == 0) & (grid[:, 2] > 0))
            grid = grid[half].to(cell.dtype)
            kk = grid @ recip.detach()
            grid = grid[(kk * kk).sum(1) < self.params["k_max"] ** 2]
        return grid @ recip

    def _ewald(self, positions, cell, q, volume) -> torch.Tensor:
        """(n,) reciprocal energy per atom / K: q_i (4 pi / V) sum_k G(k) (cos_i C_k + sin_i S_k)
        at the owned rows, zero at ghost rows (their per-atom energies are their owners')."""
        kv = self.kvectors(cell)
        own_q = _owned(q)
        n_own = own_q.shape[0]   # owned rows come first ([owned | ghost]): S(k) and the potential need only them
        x = positions[:n_own]
        out = []
        for s in range(0, kv.shape[0], K_BLOCK):
            kb = kv[s:s + K_BLOCK]
            k2 = (kb * kb).sum(1)
            g = torch.exp(-k2 / (4 * self.alpha ** 2)) / k2
            phase = x @ kb.T
            cos, sin = torch.cos(phase), torch.sin(phase)
            cs = _global_sum(torch.stack([own_q @ cos, own_q @ sin]))   # (2, block)
            out.append(cos @ (g * cs[0]) + sin @ (g * cs[1]))
        own = own_q * (4 * math.pi / volume) * torch.stack(out).sum(0)
        return torch.cat([own, own.new_zeros(q.shape[0] - n_own)])

    # -- PME: torch-pme's mesh interpolation and k-space filter, the mesh all-reduced ----------------
    def _pme(self, positions, cell, q, volume) -> torch.Tensor:
        """(n,) reciprocal energy per atom / K: q_i phi_i / 2 with phi from the mesh, at the owned
        rows (zero at ghost rows, as in :meth:`_ewald`)."""
        mi, kf = self._mesh_parts(positions)
        ns = mesh_shape(cell.detach(), self.params["mesh_spacing"])
        mi.update(cell, ns)
        kf.update(cell, ns)
        own_q = _owned(q)
        mi.compute_weights(_owned(positions))       # one set of weights: spreading and interpolation
        rho = _global_sum(mi.points_to_mesh(own_q[:, None]))
        potential = kf.forward(rho)
        own = 0.5 * own_q * mi.mesh_to_points(potential)[:, 0] / volume
        return torch.cat([own, own.new_zeros(q.shape[0] - own.shape[0])])

    def _mesh_parts(self, positions):
        key = (positions.dtype, positions.device)
        if self._mesh is None or self._mesh[0] != key:
            from torchpme import CoulombPotential
            from torchpme.lib import KSpaceFilter, MeshInterpolator

            eye = torch.eye(3, dtype=positions.dtype, device=positions.device)
            ones = torch.ones(3, dtype=torch.int64, device=positions.device)
            pot = CoulombPotential(smearing=1.0 / (math.sqrt(2.0) * self.alpha)).to(positions.device, positions.dtype)
            mi = MeshInterpolator(cell=eye, ns_mesh=ones, interpolation_nodes=self.params["nodes"], method="Lagrange")
            kf = KSpaceFilter(cell=eye, ns_mesh=ones, kernel=pot, fft_norm="backward", ifft_norm="forward")
            self._mesh = (key, mi, kf)
        return self._mesh[1], self._mesh[2]


__all__ = ["COULOMB_K", "SPEC_COULOMB", "Coulomb", "ewald_parameters"]
