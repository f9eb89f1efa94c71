"""AIMNet2 (the ``aimnet`` package, unmodified) behind the model contract, on any number of domains.

AIMNet2: an AEV of each atom's neighbours within one cutoff (``aev.rc_s``, 5 Å in the released
models: Gaussian radial shells times the unit vectors), then a few passes (``len(mlps)``, 3 in
the released models), each a convolution of the neighbours' features and partial charges over
that basis and an MLP; the passes but the last predict charge updates and weights ``f_i``,
which **charge equilibration** (aimnet's ``ops.nse``) corrects to the total charge Q:

    q_i = q_u,i + f_i / (sum_j f_j + 1e-6) * (Q - sum_j q_u,j)        (sums over the whole system)

The last pass feeds the per-atom energy MLP, plus a per-element shift (float64).  Files of
models trained with Coulomb hold its short-range part (``SRCoulomb``, exp envelope, 4.6 Å),
subtracted here, and the full Coulomb energy of the charges is added outside the network, as
aimnet's calculator does (``needs_coulomb``); aimnet's unit is ``Hartree * Bohr`` (14.3996455 eV Å).

Route to decomposition, and why: **explicit per-pass halo refresh**, not a halo as deep as the
receptive field.  AIMNet2 takes a dense neighbour matrix; every rank gives it the padded local
structure (owned atoms, then its halo copies, then aimnet's trailing dummy atom) in aimnet's
flat layout (``nb_mode`` 1: ``nbmat`` (n_padded + 1, M), padded with the dummy's index) built
from the engine's list, whose query rows are the owned atoms: each owned atom's neighbourhood
is complete, halo rows have none.  After each pass the halo rows of the atom features and the
charges are re-copied from their owners (``refresh_halo``: its backward adds halo-row
gradients to the owners), so one cutoff of halo serves every pass.  The whole-system sums of
charge equilibration are ``system_sum`` (owned rows, summed over ranks, differentiable: its
backward sums the cotangents over ranks).  The wrapper runs ``AIMNet2.forward_prepared``'s
steps on aimnet's own submodules (the convolutions, MLPs, output heads), only its two
whole-system sums replaced.  The energy is this rank's owned atoms' share (summed over ranks by
the spec); forces ``-dE/dx`` and the virial ``-dE/d strain`` by DistributedModel's autograd,
through the charges too (relaxed charges, as aimnet's own).

Coulomb of the charges (``coulomb=``): ``dsf`` (default; aimnet's calculator switches periodic
systems to it: damped shifted force, alpha ``dsf_alpha`` 0.2 1/Å, cutoff ``coulomb_cutoff``
15 Å, pairwise, so a halo term) or ``ewald``/``pme`` (models/coulomb.py: real space in the halo,
reciprocal sums all-reduced; ``ewald_accuracy``), or ``none``.  The engine's list reaches the
largest of the AEV, Coulomb and D3 cutoffs; the AEV edges are those within ``rc_s``.

DFT-D3(BJ) (``dispersion``, default true): a file that needs aimnet's D3 (``needs_dispersion``,
with its ``d3_params`` s6, s8, a1, a2: the released wB97M and B97-3c models, whose DFTD3 output
the exporter strips) gets it here as aimnet's calculator adds it (``aimnet.modules.DFTD3``: BJ
damping, C6 and C8, no three-body term, cutoff ``dispersion_cutoff`` 15 Å with the pair energy
switched off by 1 - S5(t), S5 = 10 t^3 - 15 t^4 + 6 t^5, over the last ``dispersion_smoothing``
20 %, the coordination numbers over every pair within that cutoff): models/d3.py's D3 with the
file's parameters (``cutoff_width`` = 20 % of the cutoff is the same polynomial, ``cn_cutoff``
= the cutoff, or the DSF cutoff where aimnet's calculator shares one list with DSF: longer,
within 20 %), on the same list and local structure, its ghost CNs refreshed from their owners
(one more exchange), its per-atom energies added to the network's.  What differs from aimnet's
kernel (nvalchemiops' ``dftd3``): its tables are float32 copies (``dftd3_data.pt``), ours
tad-dftd3's float64 ones (1e-7 relative apart), its arithmetic is float32, and it drops the
reference pairs whose Gaussian weight is below e^-12 of the largest (81 waters: 6e-7 eV of
-3.56 eV, 1e-6 eV/Å; docs/models.md); ``dispersion=false`` runs the network without D3.

Shapes and units: positions (n_padded, 3) Å, cell (3, 3) Å, numbers (n_padded,); energy () eV,
energies (n_owned,) eV.  Precision: the run's (float64 casts the weights, as aimnet's own
``model.double()``); the element shifts and the energy sums are float64 as in aimnet.
"""
from __future__ import annotations

import math
import warnings

import torch

from shardmd.domain.api import PRESETS, ModelConfig, NeighborConfig, refresh_halo, system_sum, to_local

from .aimnet2_files import INSTALL, import_aimnet, load, resolve
from .contract import refuse_unknown_species
from .edge_memory import edge_bytes
from .files import file_sha256

#: aimnet's Coulomb constant, Hartree * Bohr in eV Å (aimnet.constants: not CODATA's last digits)
HARTREE_BOHR = 27.211386024367243 * 0.5291772105638411
COULOMB = ("dsf", "ewald", "pme", "none")
#: output heads the wrapper evaluates per atom (anything else in a file is refused by name)
HEADS = ("Output", "AtomicShift", "AtomicSum", "SRCoulomb", "Dipole", "Quadrupole")

SPEC_AIMNET2 = PRESETS["wide-halo"].replace(
    name="aimnet2-refresh",
    description="AIMNet2 on the padded local structure (owned atoms, one cutoff of halo, aimnet's dummy atom): "
                "halo rows of features and charges refreshed from their owners after every pass, charge "
                "equilibration by system sums over ranks, owned atoms' energies summed over ranks, autograd forces "
                "(halo rows to owners) and virial")


class AIMNet2Model:
    """An AIMNet2 model through ``SPEC_AIMNET2`` (module docstring).

    checkpoint: an aimnet v2 ``.pt`` file, a legacy ``.jpt`` (with ``trust_code``) or the name
    of a model in aimnet's cache; charge: total charge Q (e); mult: spin multiplicity 2S+1 (NSE
    models); coulomb: dsf|ewald|pme|none; coulomb_cutoff (Å), dsf_alpha (1/Å), ewald_accuracy;
    dtype: the model's float dtype."""

    name = "aimnet2"
    distribution_spec = SPEC_AIMNET2

    def __init__(self, checkpoint, *, charge: float = 0.0, mult: float = 1.0, coulomb: str = "dsf",
                 coulomb_cutoff: float = 15.0, dsf_alpha: float = 0.2, ewald_accuracy: float = 1e-6,
                 trust_code: bool = False, config: str | None = None, dispersion: bool = True,
                 dispersion_cutoff: float = 15.0, dispersion_smoothing: float = 0.2,
                 dtype=torch.float64, device="cpu"):
        import_aimnet()
        if coulomb not in COULOMB:
            raise ValueError(f"model.coulomb={coulomb!r}: give one of {', '.join(COULOMB)}")
        for key, value in (("charge", charge), ("mult", mult), ("coulomb_cutoff", coulomb_cutoff),
                           ("dsf_alpha", dsf_alpha), ("ewald_accuracy", ewald_accuracy),
                           ("dispersion_cutoff", dispersion_cutoff), ("dispersion_smoothing", dispersion_smoothing)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"model.{key}={value!r} is not a finite number")
        if coulomb_cutoff <= 0 or dsf_alpha <= 0 or not 0 < ewald_accuracy < 1 or mult < 1:
            raise ValueError("model.coulomb_cutoff and model.dsf_alpha must be > 0, model.ewald_accuracy between 0 "
                             "and 1, model.mult >= 1")
        if dispersion_cutoff <= 0 or not 0 <= dispersion_smoothing < 1:
            raise ValueError("model.dispersion_cutoff must be > 0 (Å) and model.dispersion_smoothing in [0, 1) (the "
                             "share of the cutoff over which the D3 pair energy is switched off)")
        if not isinstance(dispersion, bool):
            raise ValueError(f"model.dispersion={dispersion!r} is invalid: use true (add the file's DFT-D3) or false")
        self.label = f"model.checkpoint={checkpoint}"
        self.path, registry = resolve(str(checkpoint))
        self.net, self.meta = load(self.path, self.label, trust_code=trust_code is True, config=config,
                                   registry=registry)
        self.dtype, self.device = dtype, torch.device(device)
        self.net = self.net.to(device=self.device, dtype=dtype)
        for p in self.net.parameters():
            p.requires_grad_(False)
        self._check_heads()
        self.charge, self.mult = float(charge), float(mult)
        self.channels = int(self.net.num_charge_channels)
        self.rc_s = float(self.net.aev.rc_s)
        self.coulomb = coulomb if self.meta.get("needs_coulomb") else "none"
        self.coulomb_cutoff, self.dsf_alpha = float(coulomb_cutoff), float(dsf_alpha)
        self.ewald_accuracy = float(ewald_accuracy)
        self.d3 = None
        if self.meta.get("needs_dispersion") and dispersion:
            self.d3 = self._dispersion(float(dispersion_cutoff), float(dispersion_smoothing))
        self._ewald = None
        if self.coulomb in ("ewald", "pme"):
            from .coulomb import COULOMB_K, Coulomb

            self._ewald = Coulomb(charges={"H": 0.0}, cutoff=self.coulomb_cutoff, method=self.coulomb,
                                  accuracy=self.ewald_accuracy)
            self._ewald_scale = HARTREE_BOHR / COULOMB_K   # models/coulomb.py's K is CODATA 2018's
        self.cutoff = max(self.rc_s, self.coulomb_cutoff if self.coulomb != "none" else 0.0,
                          self.d3.cutoff if self.d3 is not None else 0.0)
        self.atomic_numbers = [int(z) for z in self.meta.get("implemented_species") or []]
        #: device bytes per list edge for the memory check (models/edge_memory.py): measured with the
        #: list at the 15 Å Coulomb cutoff; the same bytes an atom for another list radius
        self.bytes_per_edge = edge_bytes(174 * (16.0 / (self.cutoff + 1.0)) ** 3, dtype=dtype)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))

    def _dispersion(self, cutoff: float, smoothing: float):
        """models/d3.py's D3(BJ) as aimnet's ``DFTD3`` of this file (module docstring).  Its CNs
        count every pair of the list aimnet's calculator gives it: the D3 cutoff's own, or, where
        the DSF Coulomb cutoff is longer but within 20 % (its rule for sharing one list), that."""
        p = self.meta.get("d3_params")
        if not isinstance(p, dict) or any(k not in p for k in ("s8", "a1", "a2")):
            raise ValueError(f"{self.label} needs DFT-D3 but its d3_params ({p!r}) lack s8, a1 or a2; give "
                             "model.dispersion=false to run the network without it")
        try:
            import tad_dftd3  # noqa: F401 - the D3 tables

            from .d3 import D3Dispersion
        except ImportError:
            raise ValueError(f"{self.label} needs DFT-D3(BJ), which model=aimnet2 adds with tad-dftd3: pip install "
                             "'shardmd[d3]' (or give model.dispersion=false to run the network without it)") from None
        params = {"s6": float(p.get("s6", 1.0)), "s8": float(p["s8"]), "a1": float(p["a1"]), "a2": float(p["a2"])}
        shared = self.coulomb == "dsf" and cutoff < self.coulomb_cutoff <= 1.2 * cutoff
        return D3Dispersion(functional=f"{self.label}'s d3_params", damping="bj", params=params, cutoff=cutoff,
                            cn_cutoff=self.coulomb_cutoff if shared else cutoff, cutoff_width=smoothing * cutoff,
                            dtype=self.dtype)

    def _check_heads(self) -> None:
        """Refuse output heads this wrapper does not evaluate per atom (one line, by name)."""
        for head in self.net.outputs.children():
            kind = type(head).__name__
            if kind not in HEADS:
                raise ValueError(f"{self.label} has the output head {kind}, which model=aimnet2 cannot split per "
                                 f"atom (it evaluates {', '.join(HEADS[:4])})")
            if kind == "AtomicShift" and head.reduce_sum:
                raise ValueError(f"{self.label}: its AtomicShift sums per molecule (reduce_sum), which model=aimnet2 "
                                 "cannot split per atom")

    def identity(self) -> str:
        return file_sha256(self.path)

    def check_species(self, numbers) -> None:
        if self.atomic_numbers:
            refuse_unknown_species(numbers, self.atomic_numbers, self.label,
                                   "use an AIMNet2 model trained on those elements")

    # -- the padded local structure ---------------------------------------------------------------
    def _graph(self, x: torch.Tensor, cell: torch.Tensor, nl, n: int):
        """aimnet's flat layout from the engine's list: (nbmat (n + 1, M) int32, padded with the
        dummy's index n; image shifts (n + 1, M, 3) in cell units), edges within ``rc_s``."""
        i, j = nl.centers().long(), nl.neighbors.long()
        s = nl.shifts.to(x.dtype)
        with torch.no_grad():
            r = torch.linalg.vector_norm(x[j] + s @ cell - x[i], dim=1)
            keep = torch.nonzero(r < self.rc_s).squeeze(1)
        i, j, s = i[keep], j[keep], s[keep]
        counts = torch.bincount(i, minlength=n + 1)
        width = max(int(counts.max()) if i.numel() else 0, 1)
        slot = torch.arange(i.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[i]
        nbmat = torch.full((n + 1, width), n, dtype=torch.int32, device=x.device)
        nbmat[i, slot] = j.to(torch.int32)
        shifts = x.new_zeros((n + 1, width, 3))
        shifts[i, slot] = s
        return nbmat, shifts

    def _total(self, x: torch.Tensor) -> torch.Tensor:
        """(1, C) sum over the system of per-atom (n, C) values: owned rows, over ranks."""
        return system_sum(x, torch.zeros(x.shape[0], dtype=torch.int64, device=x.device), 1)

    def _refresh(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Halo rows of (n + 1, ...) per-atom values re-copied from their owners (dummy row kept)."""
        return torch.cat([refresh_halo(x[:n]).as_subclass(torch.Tensor), x[n:]], 0)

    def _update_q(self, data: dict, out: torch.Tensor, n: int, delta: bool) -> None:
        """aimnet's ``AIMNet2._update_q`` and ``ops.nse`` with the molecule sums over the system."""
        c = self.channels
        q_u, f_u, delta_a = out.split([c, c, out.shape[-1] - 2 * c], dim=-1)
        q_u = data["charges"] + q_u if delta else q_u
        f_u = f_u.pow(2)
        big_f = self._total(f_u[:n]) + 1.0e-6
        dq = data["charge"] - self._total(q_u[:n])
        q = q_u + f_u / big_f * dq
        data["charges"] = self._refresh(q, n)
        data["a"] = self._refresh(data["a"] + delta_a.view_as(data["a"]), n)

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions (n_padded, 3) Å (the owned rows first), cell (3, 3) Å, numbers (n_padded,);
        nl: the engine's list (query rows = the owned atoms).  Returns energy () eV (this rank's
        owned atoms; summed over ranks by the spec) and energies (n_owned,) eV."""
        from aimnet import nbops, ops

        net, n = self.net, int(positions.shape[0])
        x = positions.as_subclass(torch.Tensor).to(self.dtype)
        c = cell.as_subclass(torch.Tensor).to(self.dtype)
        z = numbers.as_subclass(torch.Tensor).long()
        nbmat, shifts = self._graph(x, c, nl, n)
        zero = x.new_zeros((1, 3))
        q_total = x.new_tensor([self.charge])
        if self.channels == 2:   # aimnet's _preprocess_spin_polarized_charge
            half_spin = 0.5 * (self.mult - 1.0)
            charge = torch.stack([0.5 * q_total + half_spin, 0.5 * q_total - half_spin], dim=-1)
        else:
            charge = q_total.unsqueeze(-1)
        data = {"coord": torch.cat([x, zero]), "numbers": torch.cat([z, z.new_zeros(1)]), "charge": charge,
                "mol_idx": torch.zeros(n + 1, dtype=torch.int64, device=x.device), "nbmat": nbmat,
                "shifts": shifts, "cell": c}
        data = nbops.calc_masks(nbops.set_nb_mode(data))
        data["a"] = net.afv(data["numbers"])
        if net.d2features:
            data["a"] = data["a"].unflatten(-1, (net.nfeature, net.nshifts_s))
        data = net.aev(data)
        passes = len(net.mlps)
        for k, mlp in enumerate(net.mlps):
            inputs = net._prepare_in_a(data) if k == 0 else net._prepare_in_aq(data)
            out = nbops.mask_i_(mlp(inputs), data, mask_value=0.0)
            if k < passes - 1:
                self._update_q(data, out, n, delta=k > 0)
            else:
                data["aim"] = out
        data["charges"] = data["charges"].sum(-1) if self.channels == 2 else data["charges"].squeeze(-1)
        energies = x.new_zeros(n + 1, dtype=torch.float64)
        for head in net.outputs.children():
            kind = type(head).__name__
            if kind in ("Output", "AtomicShift"):   # per atom: the energy MLP, the element shifts
                data = head(data)
                energies = data[head.key_out]
            elif kind == "SRCoulomb":   # aimnet's _calc_coulomb_sr, per atom (no molecule sum)
                d_ij = data["d_ij"]
                q_i, q_j = nbops.get_ij(data[head.key_in], data)
                fc = (ops.exp_cutoff(d_ij, head.rc) if head.envelope == "exp"
                      else ops.cosine_cutoff(d_ij, head.rc.item()))
                e_ij = nbops.mask_ij_(fc * q_i * q_j / d_ij, data, 0.0)
                energies = energies.double() - head._factor * e_ij.sum(-1, dtype=torch.float64)
        q = data["charges"][:n]
        energies = energies[:n].double()
        if self.coulomb == "dsf":
            energies = energies + self._dsf(x, c, q, nl)
        elif self._ewald is not None:
            out = self._ewald.compute(x, c, pbc, numbers, nl, charges=q)
            energies = energies + self._ewald_scale * out["energies"].double()
        if self.d3 is not None:   # the padded structure and the list are the D3's too (ghost CNs refreshed)
            energies = energies + self.d3.compute(x, c, pbc, z, nl)["energies"].double()
        own = to_local(energies).to(x.dtype)
        return {"energy": own.sum(), "energies": own}

    def _dsf(self, x, cell, q, nl) -> torch.Tensor:
        """(n,) float64 eV: aimnet's damped-shifted-force Coulomb (``LRCoulomb._coul_dsf_torch``)
        per atom, over the engine's edges within ``coulomb_cutoff`` (owned centres)."""
        i, j = nl.centers().long(), nl.neighbors.long()
        d = torch.linalg.vector_norm(x[j] + nl.shifts.to(x.dtype) @ cell - x[i], dim=1)
        keep = torch.nonzero(d.detach() < self.coulomb_cutoff).squeeze(1)
        i, j, d = i[keep], j[keep], d[keep]
        alpha, rc = d.new_tensor(self.dsf_alpha), d.new_tensor(self.coulomb_cutoff)
        erfc_rc = torch.erfc(alpha * rc)
        shift_val = erfc_rc / rc
        slope = erfc_rc / rc.pow(2) + 2.0 * self.dsf_alpha / math.sqrt(math.pi) * torch.exp(-(alpha**2) * rc**2) / rc
        pair = q[i] * q[j] * (torch.erfc(alpha * d) / d - shift_val + (d - rc) * slope)
        factor = 0.5 * HARTREE_BOHR
        e = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device).index_add_(0, i, pair.double())
        self_coeff = -(shift_val / 2.0 + self.dsf_alpha / math.sqrt(math.pi))
        return factor * e + 2.0 * factor * (self_coeff * q.pow(2)).double()

    # -- the reference -----------------------------------------------------------------------------
    def ase_calculator(self):
        """aimnet's own ``AIMNet2ASE`` on the same file and Coulomb method (its neighbour lists,
        its Coulomb module, its autograd), in this model's dtype: for float64 the model, its
        Coulomb module and the input dtypes aimnet fixes at float32 are cast (aimnet's ASE
        calculator sends float32 positions, its model casts inputs to the default dtype it saw
        at import).  DSF runs aimnet's closed-form torch DSF (``LRCoulomb._coul_dsf_torch``, its
        path for Hessians and training): its nvalchemiops DSF kernel, which it takes for plain
        inference, differs from that closed form by 1e-6 eV and 3e-6 eV/Å (81 waters' atoms,
        float64)."""
        import_aimnet()
        from aimnet.calculators import AIMNet2Calculator
        from aimnet.calculators.aimnet2ase import AIMNet2ASE
        from ase.calculators.calculator import Calculator, all_changes

        dtype = self.dtype
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = AIMNet2Calculator(str(self.path), device=str(self.device),
                                     needs_coulomb=False if self.coulomb == "none" else None,
                                     needs_dispersion=self.d3 is not None)
        if self.d3 is not None:
            base.set_dftd3_cutoff(self.d3.cutoff2, self.d3.width2 / self.d3.cutoff2)
        if self.coulomb == "dsf":
            base.set_lrcoulomb_method("dsf", cutoff=self.coulomb_cutoff, dsf_alpha=self.dsf_alpha)
        elif self.coulomb in ("ewald", "pme"):
            base.set_lrcoulomb_method(self.coulomb, ewald_accuracy=self.ewald_accuracy)
        if dtype == torch.float64:
            base.model.double()
            if base.external_coulomb is not None:
                base.external_coulomb.double()
            base.keys_in = {k: (dtype if v.is_floating_point else v) for k, v in base.keys_in.items()}
            base.keys_in_optional = {k: (dtype if v.is_floating_point else v) for k, v in base.keys_in_optional.items()}
            m = base.model
            m._required_keys_dtype = [dtype if d.is_floating_point else d for d in m._required_keys_dtype]
            m._optional_keys_dtype = [dtype if d.is_floating_point else d for d in m._optional_keys_dtype]

        class _ASE(AIMNet2ASE):
            """AIMNet2ASE.calculate with the positions, cell and charge in the model's dtype
            (aimnet's hard-codes float32 positions): the same call of its AIMNet2Calculator."""

            def calculate(self, atoms=None, properties=None, system_changes=all_changes):
                properties = properties or ["energy"]
                Calculator.calculate(self, atoms, properties, system_changes)
                self._update_charge_spin_from_info()
                self.update_tensors()
                a = self.atoms
                inp = {"coord": torch.tensor(a.positions, dtype=dtype), "numbers": self._t_numbers,
                       "charge": self._t_charge.to(dtype), "mult": self._t_mult.to(dtype)}
                if a.pbc.any():
                    inp.update(cell=torch.tensor(a.cell.array, dtype=dtype), pbc=torch.tensor(a.pbc))
                else:
                    inp = {k: v.unsqueeze(0) for k, v in inp.items()}
                out = self.base_calc(inp, forces="forces" in properties, stress="stress" in properties,
                                     validate_species=self.validate_species)
                out = {k: v.detach().cpu().numpy().reshape(v.shape[1:] if not a.pbc.any() else v.shape)
                       for k, v in out.items()}
                self.results.update(energy=float(out["energy"].reshape(-1)[0]), charges=out["charges"])
                for key in ("forces", "stress"):
                    if key in properties:
                        self.results[key] = out[key]

        coulomb = base.external_coulomb
        if self.coulomb == "dsf" and coulomb is not None:
            forward = coulomb.forward

            def closed_form(data, **kw):   # aimnet's own torch DSF (its Hessian and training path)
                return forward(data, **{**kw, "training_derivatives": True})

            coulomb.forward = closed_form
        return _ASE(base, charge=self.charge, mult=self.mult)


def factory(*, checkpoint: str | None = None, charge: float = 0.0, mult: float = 1.0, coulomb: str = "dsf",
            coulomb_cutoff: float = 15.0, dsf_alpha: float = 0.2, ewald_accuracy: float = 1e-6,
            trust_code: bool = False, config: str | None = None, dispersion: bool = True,
            dispersion_cutoff: float = 15.0, dispersion_smoothing: float = 0.2,
            dtype: str | None = None, precision: torch.dtype = torch.float64, device="cpu"):
    """AIMNet2 via aimnet (models/aimnet2.py): ``checkpoint`` an aimnet v2 ``.pt`` (read as data),
    a legacy ``.jpt`` (``trust_code=true``; ``config`` its architecture's YAML) or the name of a
    model in aimnet's cache; ``charge`` the total charge (e, default 0), ``mult`` the spin
    multiplicity (NSE models); ``coulomb`` dsf|ewald|pme|none with ``coulomb_cutoff`` (Å),
    ``dsf_alpha`` (1/Å), ``ewald_accuracy``; ``dispersion`` (default true): add the DFT-D3(BJ) a
    file asks for (its ``d3_params``), cutoff ``dispersion_cutoff`` (Å, 15) switched off over its
    last ``dispersion_smoothing`` (0.2), as aimnet's calculator; false: the network without it;
    ``dtype`` float32|float64 (default: the run's)."""
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"model.dtype={dtype!r}: give float32 or float64 (or leave it out: the run's precision)")
    if checkpoint is None:
        raise ValueError("model=aimnet2 needs model.checkpoint=FILE.pt (an AIMNet2 model, aimnet export) or the name "
                         "of a model aimnet has downloaded")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    return AIMNet2Model(checkpoint, charge=charge, mult=mult, coulomb=coulomb, coulomb_cutoff=coulomb_cutoff,
                        dsf_alpha=dsf_alpha, ewald_accuracy=ewald_accuracy, trust_code=trust_code is True,
                        config=config, dispersion=dispersion, dispersion_cutoff=dispersion_cutoff,
                        dispersion_smoothing=dispersion_smoothing, dtype=dt, device=device)


__all__ = ["HARTREE_BOHR", "INSTALL", "SPEC_AIMNET2", "AIMNet2Model", "factory"]
