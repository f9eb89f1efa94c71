"""NequIP (the ``nequip`` package, unmodified) behind the model contract, through the specs.

The second MLIP family, wrapped with **no exchange code of its own**:
where MACE is driven through mace-torch's LAMMPS ghost-exchange hook (models/mace.py), NequIP
runs on the spec alone.  Its message passing is plain PyTorch except for one opaque helper,
``torch_runstats.scatter.scatter`` (a TorchScript function: the ops inside it run below
Python dispatch, so ShardTensor never sees its scatter-add).  The spec swaps that helper with
two :class:`JitAdapter` entries (the two nequip modules that call it) for :func:`scatter`,
which does the same sum into a target allocated like the positions (``shard_like``): the
built-in handlers then do what decomposition needs --

- the interaction blocks' node scatter (``dim_size`` = the padded rows): ``halo_correction``,
  the per-layer exchange (ghost rows refreshed from their owners before the next layer reads
  them; its backward is the reverse exchange);
- the per-system energy sum (``dim_size`` = number of systems): ``system_reduce`` (ghost rows
  dropped, summed over ranks).

Forces (``-dE/dx``) and the virial (``-dE/d strain``) come from DistributedModel's autograd
(``model_config``), not from nequip's ``ForceOutput``/``StressForceOutput`` wrapper, which is
kept as the single-process reference (:meth:`NequipModel.ase_calculator`, nequip's own ASE
calculator with its own neighbour list).

Graph from our neighbour list: ``edge_index = [centre i, neighbour j]`` and integer image
shifts ``S`` with the (possibly strained) cell, so nequip computes ``r_ij = x_j - x_i + S @
cell`` itself; edges past ``r_max`` (the list reaches cutoff + skin) are dropped (nequip's
polynomial cutoff is exactly zero there).  Units: eV, Å (nequip's are those of its training
data; a config trained in other units needs its own conversion).
"""
from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, JitAdapter, ModelConfig, NeighborConfig, OutputKind, shard_like

from .contract import refuse_unknown_species

#: the modules of nequip that call torch_runstats' TorchScript scatter (looked up at call time)
SCATTER_CALLERS = ("nequip.nn._interaction_block", "nequip.nn._atomwise")


def scatter(scope, original):
    """JitAdapter factory: torch_runstats' ``scatter(src, index, dim, out, dim_size, reduce)``
    with its target allocated like the promoted positions, so the domain's handlers see the
    scatter-add (per-point target: halo correction; per-system target: system reduction).
    Other calls (no scope, another shape, an ``out`` given) run the original."""
    ref = getattr(scope, "reference", None)
    sizes = () if ref is None else (scope.n_padded, scope.n_systems)

    def scatter_(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: torch.Tensor | None = None,
                 dim_size: int | None = None, reduce: str = "sum") -> torch.Tensor:
        d = dim if dim >= 0 else src.dim() + dim
        if out is None and reduce == "sum" and d == 0 and dim_size in sizes and index.dim() == 1:
            target = shard_like(src.new_zeros((dim_size, *src.shape[1:])), ref)
            return target.index_add_(0, index, src)
        return original(src, index, dim, out, dim_size, reduce)

    return scatter_


SPEC_NEQUIP = SPEC_MPNN_HALO.replace(
    name="nequip-mpnn-halo",
    description="NequIP: message passing, autograd forces and virial, halo storage with scatter correction; "
                "torch_runstats' TorchScript scatter swapped for one the handlers see",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_helpers(*(JitAdapter(f"{m}:scatter", scatter, factory=True) for m in SCATTER_CALLERS))


def _import_nequip():
    """Import nequip quietly.  e3nn 0.4's import ``torch.load``s its own shipped constants, which
    hold a ``slice``: allowed for that load only (mace-torch instead switches weights-only
    loading off for the whole process)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with torch.serialization.safe_globals([slice]):
            import e3nn.o3  # noqa: F401
        import nequip  # noqa: F401
        from nequip.model import model_from_config
    return model_from_config


def random_config(species: Sequence[str] = ("Cu", "Ni"), r_max: float = 4.0, num_layers: int = 2, l_max: int = 1,
                  num_features: int = 8, seed: int = 0, dtype: torch.dtype = torch.float64) -> dict:
    """A small NequIP configuration (nequip's own keys) for a model with random weights."""
    name = str(dtype).removeprefix("torch.")
    return dict(model_builders=["SimpleIrrepsConfig", "EnergyModel", "StressForceOutput"],
                r_max=float(r_max), num_layers=int(num_layers), l_max=int(l_max), parity=True,
                num_features=int(num_features), chemical_symbols=list(species), num_basis=8,
                invariant_layers=1, invariant_neurons=16, PolynomialCutoff_p=6, avg_num_neighbors=20.0,
                default_dtype=name, model_dtype=name, seed=int(seed))


def build_graph_model(config: dict, weights: str | Path | None = None, dtype: torch.dtype = torch.float64):
    """nequip's own ``model_from_config`` (random weights from ``config['seed']``, drawn on a
    forked RNG), then a state dict (``weights``: nequip's ``best_model.pth``, loaded weights-only)."""
    model_from_config = _import_nequip()
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(int(config.get("seed", 0)))
            model = model_from_config(dict(config), initialize=True)
    finally:
        torch.set_default_dtype(old)
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.to(dtype=dtype).eval()


class NequipModel:
    """A NequIP model on the halo scheme, through ``SPEC_NEQUIP``.

    config: a nequip configuration (dict, or a YAML file of nequip's training config); without
    it, :func:`random_config` with ``species``, ``r_max``, ``num_layers``, ``l_max``,
    ``num_features``, ``seed``; weights: nequip's saved state dict for that config (without it
    the weights are random, drawn from the config's ``seed``); dtype, device: where and how it runs.
    """

    name = "nequip"
    distribution_spec = SPEC_NEQUIP

    def __init__(self, config: dict | str | Path | None = None, weights: str | Path | None = None,
                 dtype=torch.float64, device="cpu", **random_kwargs):
        if isinstance(config, (str, Path)):
            import yaml

            p = Path(config)
            if not p.is_file():
                raise ValueError(f"model.config={str(config)!r}: no such file; give nequip's YAML configuration")
            config = yaml.safe_load(p.read_text())
        if config is None:
            config = random_config(dtype=dtype, **random_kwargs)
        elif random_kwargs:
            raise ValueError(f"model.config given: {', '.join(sorted(random_kwargs))} come from it; drop them")
        if weights is not None and not Path(weights).is_file():
            raise ValueError(f"model.weights={str(weights)!r}: no such file; give nequip's saved state dict")
        self.dtype, self.device = dtype, torch.device(device)
        self.config = dict(config)
        self.weights = None if weights is None else Path(weights)
        #: nequip's full model (with its StressForceOutput): the single-process reference
        self.graph_model = build_graph_model(self.config, weights, dtype).to(self.device)
        for p in self.graph_model.parameters():
            p.requires_grad_(False)
        #: the energy network the engine calls (forces and virial by DistributedModel)
        self.energy_model = self.graph_model.model.func
        self.cutoff = float(self.config["r_max"])
        from nequip.data.transforms import TypeMapper
        from nequip.utils import instantiate

        mapper, _ = instantiate(TypeMapper, all_args=self.config)   # as nequip maps species to types
        self.type_mapper = mapper
        from ase.data import atomic_numbers

        self.symbols = list(mapper.chemical_symbol_to_type)
        self.atomic_numbers = [atomic_numbers[s] for s in self.symbols]
        lut = torch.full((max(self.atomic_numbers) + 1,), -1, dtype=torch.int64)
        for s, z in zip(self.symbols, self.atomic_numbers):
            lut[z] = mapper.chemical_symbol_to_type[s]
        self._lut = lut.to(self.device)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))
        #: message-passing steps (nequip's interaction blocks), and the energy counts
        #: ``nl.n_counted`` rows where a list has them: a call can be made in parts (subdomains)
        self.layers = int(self.config.get("num_layers", 3))
        self.counts_rows = True

    def identity(self) -> str:
        import hashlib
        import json

        h = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode())
        for t in self.graph_model.state_dict().values():
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.atomic_numbers, "the NequIP model")

    def ase_calculator(self):
        """nequip's own ASE calculator on the same weights (its neighbour list, its ForceOutput
        and StressOutput): the independent single-process reference."""
        _import_nequip()
        from nequip.ase import NequIPCalculator

        return NequIPCalculator(model=self.graph_model, r_max=self.cutoff, device=self.device,
                                transform=self.type_mapper)

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows =
        the owned atoms.  Returns energy () eV (the system's, summed over ranks by the
        per-system scatter), energies (n_padded,) eV (owned rows kept by the spec)."""
        from nequip.data import AtomicDataDict as K

        i, j = nl.centers(), nl.neighbors.long()
        shifts = nl.shifts.to(positions.dtype)
        with torch.no_grad():   # the list reaches cutoff + skin: keep the edges nequip sees
            x = positions.as_subclass(torch.Tensor)
            r = torch.linalg.vector_norm(x[j] - x[i] + shifts @ cell.as_subclass(torch.Tensor), dim=1)
            keep = torch.nonzero(r < self.cutoff).squeeze(1)
        n = int(positions.shape[0])
        types = self._lut[numbers.as_subclass(torch.Tensor).long()]
        data = {K.POSITIONS_KEY: positions, K.CELL_KEY: cell.reshape(1, 3, 3),
                K.EDGE_INDEX_KEY: torch.stack([i[keep], j[keep]]), K.EDGE_CELL_SHIFT_KEY: shifts[keep],
                K.ATOM_TYPE_KEY: types.reshape(n, 1), K.BATCH_KEY: torch.zeros(n, dtype=torch.int64,
                                                                                device=types.device),
                K.BATCH_PTR_KEY: torch.tensor([0, n], dtype=torch.int64, device=types.device)}
        out = self.energy_model(data)
        energies = out[K.PER_ATOM_ENERGY_KEY].reshape(n)
        counted = getattr(nl, "n_counted", None)   # a part (domain/subdomains.py): its own rows alone
        if counted is not None:
            return {"energy": energies[:counted].sum(), "energies": energies}
        return {"energy": out[K.TOTAL_ENERGY_KEY].reshape(()), "energies": energies}
