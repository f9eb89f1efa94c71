"""ORB (the ``orb-models`` package, unmodified: its orb-v3 direct and conservative forcefields and
orb-v2) behind the model contract, through the specs.

ORB is a graph network simulator: edges from each atom (the *sender*) to its ``max_neighbors``
nearest atoms within 6 Å (20 or 120 in the released models), an encoder of atoms and edges,
``num_message_passing_steps`` attention interaction layers (each edge updated from its two end
atoms, each atom from the attention-weighted sums of its out-edges *and* its in-edges; the edge
states persist from layer to layer), then heads on the final atom features:

- energy ``E = N * (s * MLP(mean_i h_i) + m) + sum_i ref(Z_i)`` (``predict_atom_avg``: the mean
  over the whole system; N the number of atoms; s, m the head's normaliser), plus the ZBL pair
  repulsion (orb-v3: summed in direct models, its per-atom mean in conservative ones);
- direct models: forces ``F_i = s_F * (MLP(h_i) - mean_k MLP(h_k)) + m_F`` (the mean force
  removed over the whole system; without periodicity also the net torque) plus ZBL's forces, and
  the stress ``MLP(mean_i h_i)`` denormalised, plus ZBL's virial over the volume;
- conservative models: forces ``-dE/dx`` and the virial ``-dE/d strain`` (DistributedModel's
  autograd, as orb-models' own ``compute_gradient_forces_and_stress``);
- charge/spin-conditioned models (OrbMol, orb-v3 ``-omol``): the system's total charge and spin
  (``model.charge``, ``model.spin``) embedded by orb-models' own conditioner and added to every
  atom's features in every layer: the same rows on every rank, so nothing is exchanged for them.

Route to decomposition, and why: **the per-layer halo refresh**, with the graph built here from
the engine's list (models/orb_graph.py: the cap reproduced exactly on any number of domains
through one exchange of each owner's K-th-neighbour key).  Every edge this rank holds touches an
owned atom; its state depends only on its end atoms and itself, so if the ghost atoms' features
are their owners' before each layer (``refresh_halo``, whose backward sends the ghost rows'
gradients back to their owners), every owned atom's features are exact after every layer.  The
halo stays one cutoff (6 Å + skin); a halo of layers x cutoff would not do without it, since a
ghost's in-edges from beyond the halo are missing whatever the depth.  orb-models' layers,
encoder and featurisers are called as they are; only their loop (``MoleculeGNS.forward``) is
run here, with the refresh between layers.  Whole-system terms (the mean of atom features, the
atom count, the mean force, the torque sums, the reference and ZBL sums, the stress) go through
``system_sum`` (owned rows, summed over ranks; its backward sums the cotangents over ranks), so
the energy and the direct outputs are the same replicated values on every rank, with the
gradients of the whole system.  The spec (``SPEC_ORB``) keeps the owned rows of the per-atom
outputs and takes energy and virial as already reduced; halo storage in ``local`` mode, since
no scatter of this wrapper is a ShardTensor (every exchange is explicit).

Graph: orb-models' convention, edge vector ``x_receiver - x_sender`` (Å).  Shapes: positions
(n_padded, 3) Å, owned rows first; cell (3, 3) Å; numbers (n_padded,); energy () eV, energies
(n_padded,) eV (the network term shared equally, plus each atom's reference and ZBL energies),
forces (n_padded, 3) eV/Å (owned rows kept), virial (3, 3) eV.  Units: eV, Å.

Precision: orb-models runs float64 (its ``precision="float64"``); ``dtype`` casts the weights.
Files and names: models/orb_files.py.  orb-models is imported only when this model is built.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import torch

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    HaloStorage,
    ModelConfig,
    NeighborConfig,
    OutputKind,
    refresh_halo,
    system_sum,
)

from .edge_memory import edge_bytes
from .files import file_sha256, weights_sha256
from .orb_compat import calculator, forces_denormalised_first, get_cutoff
from .orb_files import (
    CONDITIONED,
    INSTALL,
    RADIUS,
    RELEASED,
    Architecture,
    architecture,
    build_network,
    cached_release,
    import_orb,
    read_state_dict,
    released_name,
)
from .orb_graph import capped_graph, remove_net_torque, zbl_edges

SPEC_ORB = SPEC_MPNN_HALO.replace(
    name="orb-halo",
    description="ORB: capped sender graph built by the wrapper (owners' K-th-neighbour keys refreshed to ghosts), "
                "explicit per-layer halo refresh of atom features, whole-system means through system_sum; direct "
                "forces and stress or autograd forces and virial",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_storage(HaloStorage("local"))   # no ShardTensor scatter: the wrapper exchanges explicitly
MAX_Z = 117   # orb-models' one-hot of atomic numbers has 118 classes (Z = 0 .. 117)


def _full(voigt: torch.Tensor) -> torch.Tensor:
    """(3, 3) from orb-models' Voigt order (xx, yy, zz, yz, xz, xy), shape (1, 6)."""
    v = voigt.reshape(6)
    return torch.stack([torch.stack([v[0], v[5], v[4]]), torch.stack([v[5], v[1], v[3]]),
                        torch.stack([v[4], v[3], v[2]])])


class OrbModel:
    """An ORB forcefield on the halo scheme, through ``SPEC_ORB``.

    checkpoint: orb-models' state dict file, or a released model's name already downloaded;
    max_neighbors: the neighbour cap (default: from a released model's name); random: a dict
    (``kind``, ``args`` of orb-models' architecture function, ``max_neighbors``, ``seed``) for
    random weights; dtype, device: how and where it runs; trust_pickle: unpickle the file freely."""

    name = "orb"
    distribution_spec = SPEC_ORB

    def __init__(self, checkpoint: str | None = None, max_neighbors: int | None = None, trust_pickle: bool = False,
                 random: dict | None = None, dtype=torch.float64, device="cpu", charge=None, spin=None):
        import_orb()
        self.dtype, self.device = dtype, torch.device(device)
        if random is not None:
            self.label = "the random ORB model"
            self.random = dict(random)
            self.arch = Architecture(random["kind"], random["args"])
            self.max_neighbors = int(random["max_neighbors"])
            state, seed = None, int(random.get("seed", 0))
        else:
            self.path = self._resolve(str(checkpoint))
            self.label = f"model.checkpoint={checkpoint}"
            state, seed = read_state_dict(self.path, self.label, trust_pickle=trust_pickle), 0
            self.arch = architecture(state, self.label)
            self.max_neighbors = self._cap(max_neighbors, str(checkpoint))
            self.random = None
        if self.max_neighbors < 1:
            raise ValueError(f"model.max_neighbors={self.max_neighbors}: give the model's neighbour cap (>= 1)")
        self.kind = self.arch.kind
        self.net = build_network(self.arch, self.max_neighbors, state, self.label, seed, dtype)
        self.net.to(self.device)
        #: (total charge e, total spin) of a charge/spin-conditioned network (OrbMol), else None
        self.charge_spin = _charge_spin(self.net.model.conditioner is not None, charge, spin, self.label)
        self.direct = self.kind != "v3-conservative"
        self.cutoff = RADIUS
        #: device bytes per list edge for the memory check (models/edge_memory.py): by width x layers
        args = dict(self.arch.args)
        self.bytes_per_edge = edge_bytes(2_390, int(args.get("latent_dim", 256)) *
                                         int(args.get("num_message_passing_steps", 5)), 256 * 5, dtype)
        weight = self.net.heads["energy"].reference.linear.weight.detach().reshape(-1)
        self.atomic_numbers = [z for z in range(1, MAX_Z + 1) if float(weight[z]) != 0.0]
        stress = not self.direct or "stress" in self.net.heads
        outputs = ("energy", "energies", "forces", "virial") if stress else ("energy", "energies", "forces")
        self.model_config = ModelConfig(outputs=outputs, neighbors=NeighborConfig(self.cutoff),
                                        **({} if self.direct else {"autograd_outputs": {"forces": "energy"},
                                                                   "strain_outputs": {"virial": "energy"}}))

    def _resolve(self, checkpoint: str) -> Path:
        p = Path(checkpoint).expanduser()
        if p.is_file():
            return p
        name = checkpoint.lower()
        if name in RELEASED:
            hit = cached_release(name)
            if hit is not None:
                return hit
            raise ValueError(f"model.checkpoint={checkpoint}: not downloaded yet (nothing is downloaded here); let "
                             f"orb-models download it (pretrained.{name.replace('-', '_')}()) or give the file")
        raise ValueError(f"model.checkpoint={checkpoint}: no such file; give an ORB checkpoint (.ckpt, a state dict) "
                         "or a downloaded released model's name (e.g. orb-v3-direct-20-omat)")

    def _cap(self, max_neighbors, checkpoint: str) -> int:
        """The neighbour cap: given, or from a released model's name (the file does not record it)."""
        if max_neighbors is not None:
            return int(max_neighbors)
        name = released_name(checkpoint) or released_name(self.path.name)
        if name is None:
            raise ValueError(f"{self.label}: the file does not record its neighbour cap; give model.max_neighbors="
                             "20 or 120 (the released -20 and -inf models; orb-v2: 20)")
        return RELEASED[name][1]

    # -- identity, species, reference -------------------------------------------------------------
    def identity(self) -> str:
        """SHA-256 of the checkpoint file, or of the random model's description and weights."""
        return file_sha256(self.path) if hasattr(self, "path") else weights_sha256(self.random, self.net)

    def check_species(self, numbers) -> None:
        """ORB covers the atomic numbers with a reference energy (1 .. 117 in the released models)."""
        from ase.data import chemical_symbols

        have = {int(z) for z in torch.as_tensor(numbers).unique().tolist()}
        bad = sorted(have - set(self.atomic_numbers))
        if bad:
            names = ", ".join(chemical_symbols[z] if 0 <= z < len(chemical_symbols) else str(z) for z in bad)
            raise ValueError(f"{self.label} does not know {names}: ORB embeds atomic numbers 1..{MAX_Z} and needs a "
                             "reference energy for each element; use a model trained on those elements")

    def ase_calculator(self):
        """orb-models' own ``ORBCalculator`` on a copy of the same network (its graph builder, its
        heads; for conservative models its autograd forces and stress): the reference.  It builds
        its graph in the process's default dtype: evaluate under float64 for a float64 model."""
        return calculator(copy.deepcopy(self.net), RADIUS, self.max_neighbors)

    # -- the call ---------------------------------------------------------------------------------
    def _features(self, z: torch.Tensor, senders, receivers, vectors) -> torch.Tensor:
        """``MoleculeGNS.forward``'s steps on its own modules, the ghost rows refreshed from their
        owners before every layer but the first.  Returns (n_padded, latent) atom features."""
        gns = self.net.model
        graph = SimpleNamespace(
            node_features={"atomic_numbers": z,
                           "atomic_numbers_embedding": torch.nn.functional.one_hot(z, 118).to(vectors.dtype)},
            edge_features={"vectors": vectors}, senders=senders, receivers=receivers)
        nodes, edges = gns._encoder(gns.featurize_nodes(graph), gns.featurize_edges(graph))
        cutoff = get_cutoff()(vectors.norm(dim=-1))
        cond = {}
        if self.charge_spin is not None:   # the same rows on every rank: the system's charge and spin
            dev = vectors.device
            spin = torch.tensor([self.charge_spin[1]], dtype=vectors.dtype, device=dev)
            batch = SimpleNamespace(   # the spin under both names: orb-models 0.5's and 0.7's conditioner
                system_features={"total_charge": torch.tensor([self.charge_spin[0]], dtype=vectors.dtype, device=dev),
                                 "total_spin": spin, "spin_multiplicity": spin},
                n_node=torch.tensor([nodes.shape[0]], device=dev), n_edge=torch.tensor([edges.shape[0]], device=dev))
            cond["cond_nodes"], cond["cond_edges"] = gns.conditioner(batch)
        for k, layer in enumerate(gns.gnn_stacks):
            if k:
                nodes = refresh_halo(nodes).as_subclass(torch.Tensor)
            nodes, edges = layer(nodes, edges, senders, receivers, cutoff, **cond)
        return nodes

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows = the
        owned atoms.  Returns energy () eV (replicated: every sum over atoms is a system_sum),
        energies (n_padded,) eV, and for direct models forces (n_padded, 3) eV/Å and virial (3, 3)
        eV (conservative: DistributedModel differentiates the energy)."""
        net = self.net
        x = positions.as_subclass(torch.Tensor)   # stays on the autograd graph; no handler needed
        c = cell.as_subclass(torch.Tensor)
        z = numbers.as_subclass(torch.Tensor).long()
        n = int(x.shape[0])
        senders, receivers, vectors, n_out = capped_graph(x, c, nl, RADIUS, self.max_neighbors)
        h = self._features(z, senders, receivers, vectors)
        system = torch.zeros(n, dtype=torch.int64, device=x.device)
        n_atoms = system_sum(torch.ones(n, dtype=x.dtype, device=x.device), system)   # (1,)

        head = net.heads["energy"]
        # system_sum accumulates in float64: in float32 the ~N terms' roundings added up (at 16,384 atoms
        # the energy per atom was 3.5e-4 eV off float64's; docs/benchmarks.md, "The other families on one GPU")
        pooled = system_sum(h, system)
        if head.atom_avg:
            pooled = pooled / n_atoms
        e_net = head.normalizer.inverse(head.mlp(pooled).squeeze(-1)).reshape(1)
        if head.atom_avg:
            e_net = e_net * n_atoms
        e_ref = head.reference.linear.weight.reshape(-1)[z]                 # (n,) eV
        energies = e_net / n_atoms + e_ref
        out = {}
        zbl = net.pair_repulsion_fn if net.pair_repulsion else None
        if zbl is not None:   # each global edge once: the owned senders' out-edges
            v_edges, f_edges = zbl_edges(zbl, z, senders, receivers, vectors, gradients=self.direct)
            v_atom = x.new_zeros(n).index_add(0, senders[:n_out], v_edges[:n_out])
            energies = energies + (v_atom / n_atoms if zbl.node_aggregation == "mean" else v_atom)
        energy = system_sum(energies, system)
        out["energy"], out["energies"] = energy.reshape(()), energies
        if not self.direct:
            return out

        fh = net.heads["forces"]
        f = fh.mlp(h)
        first = forces_denormalised_first()   # as the installed orb-models' ForceHead (models/orb_compat.py)
        if first:
            f = fh.normalizer.inverse(f)
        if fh.remove_mean:
            f = f - system_sum(f, system) / n_atoms
        if fh.remove_torque_for_nonpbc_systems and not any(bool(p) for p in pbc):
            f = remove_net_torque(x, f, n_atoms)
        if not first:
            f = fh.normalizer.inverse(f)
        if zbl is not None:
            f = f.index_add(0, senders, -f_edges).index_add(0, receivers, f_edges)
        out["forces"] = f
        if "stress" in net.heads:
            sh = net.heads["stress"]
            pooled = system_sum(h, system) / (n_atoms if sh.node_aggregation == "mean" else 1)
            raw = sh.mlp(pooled)
            stress = _full(_stress_inverse(sh, raw))
            volume = torch.linalg.det(c)
            virial = -stress * volume
            if zbl is not None:   # orb-models: stress -= sum(r (x) f) / det(cell); its virial, the sum
                pair = torch.einsum("bi,bj->bij", vectors[:n_out], f_edges[:n_out])
                total = system_sum(x.new_zeros((n, 3, 3)).index_add(0, senders[:n_out], pair), system)[0]
                virial = virial + 0.5 * (total + total.T)
            out["virial"] = virial
        return out


def _stress_inverse(head, raw: torch.Tensor) -> torch.Tensor:
    """The stress head's denormalisation of its MLP output ``raw`` (1, 6) (Voigt, eV/Å^3):
    orb-v3's StressHead (separate diagonal and off-diagonal normalisers; its method is
    ``denormalize`` in orb-models 0.5, ``_denormalize`` in 0.7, hence written out) or orb-v2's
    GraphHead (one normaliser)."""
    if hasattr(head, "diag_normalizer"):
        return torch.cat([head.diag_normalizer.inverse(raw[:, :3]), head.offdiag_normalizer.inverse(raw[:, 3:])], -1)
    return head.normalizer.inverse(raw.squeeze(-1))


def _charge_spin(conditioned: bool, charge, spin, label: str) -> tuple[float, float] | None:
    """(charge, spin) for a conditioned network (both required, finite numbers), None for one
    that is not (which takes neither); refusals in one line."""
    if not conditioned:
        if charge is not None or spin is not None:
            raise ValueError(f"model.charge and model.spin are for a charge/spin-conditioned ORB model (orb-v3 "
                             f"-omol); {label} is not one: leave them out")
        return None
    if charge is None or spin is None:
        raise ValueError(f"{label} is charge/spin-conditioned (orb-v3 -omol): give model.charge (the total charge, "
                         "e) and model.spin (the total spin, as orb-models' atoms.info['spin'])")
    out = []
    for key, v in (("charge", charge), ("spin", spin)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise ValueError(f"model.{key}={v!r}: give a number (the system's total {key})")
        out.append(float(v))
    return out[0], out[1]


def factory(*, checkpoint: str | None = None, max_neighbors: int | None = None, trust_pickle: bool = False,
            dtype: str | None = None, random: bool = False, conservative: bool = False, latent_dim: int = 32,
            mlp_hidden_dim: int = 64, mlp_depth: int = 2, head_hidden_dim: int = 32, head_depth: int = 1,
            num_layers: int = 2, seed: int = 0, charge_spin: bool = False, charge=None, spin=None,
            precision: torch.dtype = torch.float64, device="cpu"):
    """ORB via orb-models (models/orb.py): ``checkpoint`` orb-models' state dict file (``.ckpt``;
    ``max_neighbors`` 20 or 120 unless the file name starts with a released model's name) or a
    released model's name already downloaded (``orb-v3-direct-20-omat``, ...); ``random=true``:
    orb-v3's architecture with random weights (``conservative``, ``latent_dim``,
    ``mlp_hidden_dim``, ``mlp_depth``, ``head_hidden_dim``, ``head_depth``, ``num_layers``,
    ``max_neighbors`` (default 20), ``seed``, ``charge_spin``: OrbMol's charge/spin conditioner);
    ``charge``, ``spin``: the total charge (e) and spin a conditioned model (orb-v3 -omol) needs;
    ``dtype`` float32|float64 (default: the run's precision); ``trust_pickle=true`` unpickles a
    file the safe loader refuses."""
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"model.dtype={dtype!r}: give float32 or float64 (or leave it out: the run's precision)")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    if random:
        kind = "v3-conservative" if conservative is True else "v3-direct"
        args = dict(latent_dim=int(latent_dim), base_mlp_hidden_dim=int(mlp_hidden_dim), base_mlp_depth=int(mlp_depth),
                    head_mlp_hidden_dim=int(head_hidden_dim), head_mlp_depth=int(head_depth),
                    num_message_passing_steps=int(num_layers))
        if charge_spin is True:
            args.update(CONDITIONED)
        return OrbModel(None, random={"kind": kind, "args": args, "seed": int(seed),
                                      "max_neighbors": int(max_neighbors if max_neighbors is not None else 20)},
                        dtype=dt, device=device, charge=charge, spin=spin)
    if checkpoint is None:
        raise ValueError("model=orb needs model.checkpoint=FILE.ckpt (orb-models' state dict, or a downloaded "
                         "released model's name) or model.random=true")
    return OrbModel(str(checkpoint), max_neighbors=max_neighbors, trust_pickle=trust_pickle is True, dtype=dt,
                    device=device, charge=charge, spin=spin)


__all__ = ["INSTALL", "SPEC_ORB", "OrbModel", "factory"]
