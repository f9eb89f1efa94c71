"""Learned charges with long-range electrostatics: charge equilibration over the whole system plus Ewald/PME.

The route of AIMNet2- or MACE-LES-like models, in a small random-weight model.  Per atom i (element Z_i),
from its neighbours j within the local cutoff r_loc (Å):

    g_i[k, c] = sum_j fc(r_ij) exp(-((r_ij - mu_k) / w)^2) e_c(Z_j)      environment features (n, n_basis * 2)
    fc(r)     = (1 - (r / r_loc)^2)^2 for r < r_loc, else 0              smooth to zero at the cutoff

(mu_k evenly spaced from 1 Å to r_loc, w = r_loc / n_basis, e(Z) a random 2-vector per element), then a
one-layer network with random weights W, b, w_chi, w_J:

    h_i       = tanh(g_i W + b)
    chi_i     = chi0(Z_i) + h_i . w_chi                                 electronegativity, eV/e
    J_i       = J0(Z_i) exp(h_i . w_J) > 0                              hardness, eV/e^2

The charges minimise sum_i (chi_i q_i + J_i q_i^2 / 2) under the total-charge constraint sum_i q_i = Q:

    q_i = (lambda - chi_i) / J_i,    lambda = (Q + sum_j chi_j / J_j) / sum_j 1 / J_j      (e)

(the site terms alone: a closed form, where equilibrating with the Coulomb term too would be a linear solve).
The two sums run over every atom of the system: on N domains they are global sums (``system_sum``: owned
rows, summed over the ranks), so every charge depends on every atom's position.  The energy (eV)

    E = sum_i (chi_i q_i + J_i q_i^2 / 2)                 site terms
      + 1/2 sum_{i != j} fc(r_ij) A exp(-r_ij / rho)      a short-range (Born-Mayer) repulsion
      + E_Coulomb(q)                                      Ewald or PME of the predicted charges (models/coulomb.py)

Forces -dE/dx (eV/Å) and the virial -dE/d(strain) (eV) by autograd, through the charges and the
reciprocal sums, on any number of domains (docs/distributed.md, "Gradients through collectives"), so NPT
works.  One neighbour list (the larger cutoff, Coulomb's real-space r_c) serves both parts; each masks
its own range.  Outputs: energy (), energies (n,) eV, charges (n,) e, forces (n, 3), virial (3, 3).  The
total charge Q is the per-system input ``charge`` (``system.charge``, else the structure's, else 0).

    cd examples && python -m engine run model=py:learned_charges:make model.cutoff=6.0 model.method=pme \\
        system.file=nacl.extxyz system.charge=0 domains=2
"""
from __future__ import annotations

import math

import torch

from shardmd.domain.api import ModelConfig, NeighborConfig, OutputKind, system_sum
from shardmd.models.coulomb import SPEC_COULOMB, Coulomb

#: how the model runs on N domains: Coulomb's spec (halo pair terms, reduced energy) plus the charges, a
#: per-atom output complete on the owned rows
SPEC_LEARNED_CHARGES = SPEC_COULOMB.replace(
    name="learned-charges", description="learned charges equilibrated over the whole system, Ewald/PME",
    output_kinds={**SPEC_COULOMB.output_kinds, "charges": OutputKind.PER_NODE},
    owned_only_outputs={"energies", "forces", "charges"})

ELECTRONEGATIVITY = {"Na": -2.0, "Cl": 2.0}   # chi0 per element, eV/e
HARDNESS = {"Na": 2.5, "Cl": 2.5}             # J0 per element, eV/e^2
REPULSION = (3000.0, 0.3)                     # Born-Mayer A (eV), rho (Å): about zero pressure at a = 5.64 Å
N_BASIS, N_EMBED, HIDDEN = 4, 2, 16


def element_table(values: dict, what: str) -> torch.Tensor:
    """(119,) float64 by atomic number from {element: value}; NaN where no value is given."""
    from ase.data import atomic_numbers

    table = torch.full((119,), float("nan"), dtype=torch.float64)
    for el, v in values.items():
        if el not in atomic_numbers:
            raise ValueError(f"model.{what}.{el}: {el!r} is not an element symbol")
        table[atomic_numbers[el]] = float(v)
    return table


class LearnedCharges:
    """Charges from a small network and charge equilibration, energy = site terms + repulsion + Coulomb.

    cutoff:        Coulomb's real-space cutoff r_c, Å (the neighbour list's radius; >= local_cutoff)
    local_cutoff:  r_loc, Å, the range of the environment features and the repulsion
    method:        "ewald" or "pme";  accuracy: Coulomb's relative force accuracy
    electronegativity, hardness: {element: chi0 in eV/e}, {element: J0 in eV/e^2}
    seed:          the random weights' seed
    """

    distribution_spec = SPEC_LEARNED_CHARGES

    def __init__(self, cutoff=8.0, local_cutoff=4.5, method="ewald", accuracy=1e-6, electronegativity=None,
                 hardness=None, seed=0):
        if not 0 < local_cutoff <= cutoff:
            raise ValueError(f"model.local_cutoff={local_cutoff} must be > 0 and <= model.cutoff={cutoff}")
        chi0, j0 = electronegativity or ELECTRONEGATIVITY, hardness or HARDNESS
        if set(chi0) != set(j0):
            raise ValueError("model.electronegativity and model.hardness must name the same elements")
        self.cutoff, self.local_cutoff = float(cutoff), float(local_cutoff)
        self.chi0, self.j0 = element_table(chi0, "electronegativity"), element_table(j0, "hardness")
        # Coulomb's element table is not used: compute() always passes the predicted charges
        self.coulomb = Coulomb({el: 0.0 for el in chi0}, cutoff=self.cutoff, method=method, accuracy=accuracy)
        self.notes = self.coulomb.notes   # Coulomb's log lines (a net charge's background), read by the engine
        g = torch.Generator().manual_seed(seed)
        f64 = dict(dtype=torch.float64)
        self.weights = {
            "embed": torch.randn(119, N_EMBED, generator=g, **f64),
            "w1": torch.randn(N_BASIS * N_EMBED, HIDDEN, generator=g, **f64) / math.sqrt(N_BASIS * N_EMBED),
            "b1": 0.1 * torch.randn(HIDDEN, generator=g, **f64),
            "w_chi": 0.3 * torch.randn(HIDDEN, generator=g, **f64),
            "w_j": 0.1 * torch.randn(HIDDEN, generator=g, **f64),
            "mu": torch.linspace(1.0, self.local_cutoff, N_BASIS, **f64),
        }
        self.model_config = ModelConfig(outputs=("energy", "energies", "charges", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff), system_inputs=("charge",))

    def check_species(self, numbers) -> None:
        from ase.data import chemical_symbols

        missing = [chemical_symbols[int(z)] for z in torch.as_tensor(numbers).long().unique()
                   if torch.isnan(self.chi0[int(z)])]
        if missing:
            raise ValueError(f"model=learned_charges has no electronegativity or hardness for {', '.join(missing)}; "
                             f"give model.electronegativity.{missing[0]}=... and model.hardness.{missing[0]}=...")

    def fc(self, r: torch.Tensor) -> torch.Tensor:
        """(E,) the smooth cutoff function of distances r (Å), zero from r_loc on."""
        x = torch.clamp(r / self.local_cutoff, max=1.0)
        return torch.where(r < self.local_cutoff, (1 - x * x) ** 2, torch.zeros_like(r))

    def site_parameters(self, positions, cell, numbers, nl) -> tuple:
        """(chi (n,) eV/e, J (n,) eV/e^2, r (E,) Å, fc (E,)) of the atoms (ghost rows included) and edges."""
        w = {k: v.to(dtype=positions.dtype, device=positions.device)
             for k, v in {**self.weights, "chi0": self.chi0, "j0": self.j0}.items()}
        z = numbers.long()
        i, j = nl.edge_index()
        r = (positions.index_select(0, j) + nl.shift_vectors(cell) - positions.index_select(0, i)).norm(dim=1)
        fc = self.fc(r)
        radial = torch.exp(-(((r[:, None] - w["mu"]) * (N_BASIS / self.local_cutoff)) ** 2)) * fc[:, None]
        edge_feat = (radial[:, :, None] * w["embed"][z[j]][:, None, :]).reshape(r.shape[0], -1)
        feat = positions.new_zeros((positions.shape[0], N_BASIS * N_EMBED))   # a scatter target: halo-corrected
        feat.index_add_(0, i, edge_feat)
        h = torch.tanh(feat @ w["w1"] + w["b1"])
        chi = w["chi0"][z] + h @ w["w_chi"]
        hard = w["j0"][z] * torch.exp(h @ w["w_j"])
        return chi, hard, r, fc

    def compute(self, positions, cell, pbc, numbers, nl, charge=None) -> dict:
        """positions (n, 3) Å, cell (3, 3) Å, pbc (3,) (all True), numbers (n,), nl the neighbour list
        (radius >= cutoff); charge: (1,) e, the total charge Q (0 when not given)."""
        n = positions.shape[0]
        chi, hard, r, fc = self.site_parameters(positions, cell, numbers, nl)
        # charge equilibration: lambda from two sums over the whole system (one all-reduce on N domains)
        batch = torch.zeros(n, dtype=torch.int64, device=positions.device)
        sums = system_sum(torch.stack([1.0 / hard, chi / hard], dim=1), batch, 1)[0]
        total = 0.0 if charge is None else charge.to(sums)[0]
        lam = (total + sums[1]) / sums[0]
        q = (lam - chi) / hard
        # local energy: site terms and the repulsion, half of each pair to each end
        a, rho = REPULSION
        i, _ = nl.edge_index()
        local = chi * q + 0.5 * hard * q * q
        local = local + positions.new_zeros(n).index_add_(0, i, 0.5 * a * fc * torch.exp(-r / rho))
        # long range: Coulomb (Ewald/PME) of the predicted charges, on the same list (it masks r >= r_c)
        coul = self.coulomb.compute(positions, cell, pbc, numbers, nl, charges=q)
        energies = local + coul["energies"]
        energy = positions.new_zeros(1).index_add_(0, batch, local)[0] + coul["energy"]   # summed over ranks
        return {"energy": energy, "energies": energies, "charges": q}


def make(cutoff=8.0, local_cutoff=4.5, method="ewald", accuracy=1e-6, electronegativity=None, hardness=None,
         seed=0):
    """The factory: ``model=py:learned_charges:make model.cutoff=6.0 model.method=pme ...``; each
    ``model.<key>=`` is one of these arguments (the total charge is ``system.charge``, an input)."""
    return LearnedCharges(cutoff=cutoff, local_cutoff=local_cutoff, method=method, accuracy=accuracy,
                          electronegativity=dict(electronegativity) if electronegativity else None,
                          hardness=dict(hardness) if hardness else None, seed=seed)
