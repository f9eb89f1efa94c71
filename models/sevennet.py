"""SevenNet (the ``sevenn`` package, unmodified) behind the model contract, through the specs.

A NequIP-architecture family (e3nn tensor-product message passing) wrapped like
models/nequip.py: **no exchange code of its own**, the spec alone makes it run on N domains.
What sevenn does that fixes the route:

- messages are summed by ``sevenn.nn.convolution.message_gather``, a plain Python function
  (not TorchScript) that allocates its target with ``torch.zeros`` (a plain tensor: no handler
  sees the sum) and fills it with ``scatter_reduce_(reduce='sum')``.  A :class:`PythonAdapter`
  swaps it for :func:`message_gather`: the same sum with ``index_add_`` into a target
  allocated like the positions (``shard_like``), so the built-in ``halo_correction`` does the
  per-layer exchange (ghost rows refreshed from their owners before the next layer; its
  backward is the reverse exchange);
- the total energy comes from ``sevenn.nn.linear.AtomReduce`` (``torch.zeros`` +
  ``scatter_reduce_``, or ``torch.sum`` over every row, ghosts included): a
  :class:`MethodAdapter` swaps its ``forward`` for :func:`atom_reduce`, a scatter into a
  per-system target the ``system_reduce`` handler sums over ranks (ghost rows dropped);
- sevenn's own forces/stress (``ForceStressOutputFromEdge``: ``dE/d r_ij`` scattered with
  ``torch.zeros`` targets) are not called: forces ``-dE/dx`` and the virial ``-dE/d strain``
  come from DistributedModel's autograd (``model_config``).  sevenn's ASE calculator on the
  same weights (its own matscipy neighbour list and edge-gradient forces) is the independent
  reference (:meth:`SevenNetModel.ase_calculator`).

Precision: sevenn runs float32 only (its one-hot embedding is hard-coded ``.float()``, its
calculator casts every input to float32).  ``dtype=float64`` casts the weights and, by a
forward hook on the one-hot modules, the one-hot rows (0/1: exact); everything else in sevenn
is dtype-generic, so the model is evaluated in float64 with its float32 weights.

Graph from our neighbour list: ``edge_index = [centre i, neighbour j]`` and
``edge_vec = x_j - x_i + S @ cell`` (sevenn's convention: messages flow from index 1 to
index 0), edges past the cutoff dropped (the list reaches cutoff + skin).  Shapes: positions
(n_padded, 3) Å, cell (3, 3) Å, numbers (n_padded,); energy () eV, energies (n_padded,) eV
(owned rows kept by the spec), forces (n, 3) eV/Å and virial (3, 3) eV by autograd.  Units of
SevenNet-0: eV and Å (trained on VASP data).

Checkpoints are sevenn's ``.pth`` (a pickled dict: ``config``, ``model_state_dict``):
loaded ``weights_only=True`` with numpy arrays allowed (never unpickled freely without
``model.trust_pickle=true``); a file of another family or written by a newer sevenn is refused
in one line.  sevenn is imported only when this model is built.
"""
from __future__ import annotations

import functools
import pickle
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    MethodAdapter,
    ModelConfig,
    NeighborConfig,
    OutputKind,
    PythonAdapter,
    shard_like,
)

from .contract import refuse_unknown_species
from .files import file_sha256, refused_global, weights_sha256

#: what the error messages tell to install (sevenn needs e3nn >= 0.5; mace-torch pins 0.4.4)
INSTALL = "pip install 'sevenn==0.13.0'"
#: the pretrained models sevenn ships in its wheel (sevenn's own names; others download)
SHIPPED = ("7net-0", "7net-0_11july2024", "7net-0_22may2024", "7net-l3i5", "7net-mf-0")


def message_gather(scope):
    """PythonAdapter factory for ``sevenn.nn.convolution.message_gather(node_features,
    edge_dst, message)``: the per-receiver sum of the messages with its target allocated like
    the promoted positions, so ``halo_correction`` sees it (outside a scope: sevenn's sum)."""
    ref = getattr(scope, "reference", None)
    n_padded = None if ref is None else scope.n_padded

    def gather(node_features: torch.Tensor, edge_dst: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        out = message.new_zeros((len(node_features), *message.shape[1:]), dtype=node_features.dtype)
        if ref is not None and len(node_features) == n_padded:
            out = shard_like(out, ref)
        return out.index_add_(0, edge_dst, message)

    return gather


def atom_reduce(scope):
    """MethodAdapter factory for ``sevenn.nn.linear.AtomReduce.forward``: per-atom energies
    summed into a per-system target allocated like the positions (``system_reduce``: ghost
    rows dropped, summed over ranks); outside a scope the plain sum over all rows."""
    ref = getattr(scope, "reference", None)

    def forward(self, data):
        src = data[self.key_input].reshape(-1)
        if ref is None:
            total = src.sum()
        else:
            batch = torch.zeros(src.shape[0], dtype=torch.int64, device=src.device)
            total = shard_like(src.new_zeros(scope.n_systems), ref).index_add_(0, batch, src)
        data[self.key_output] = total.reshape(()) * self.constant
        return data

    return forward


SPEC_SEVENNET = SPEC_MPNN_HALO.replace(
    name="sevennet-mpnn-halo",
    description="SevenNet: message passing, autograd forces and virial, halo storage with scatter correction; "
                "sevenn's message_gather and AtomReduce swapped for sums the handlers see",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_helpers(PythonAdapter("sevenn.nn.convolution", "message_gather", message_gather, factory=True),
               MethodAdapter("sevenn.nn.linear:AtomReduce", "forward", atom_reduce, factory=True))


def import_sevenn():
    """``sevenn`` (quietly), or a one-line ValueError with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import sevenn
            import sevenn.checkpoint
            import sevenn.model_build
    except ImportError as exc:
        raise ValueError(f"model=sevennet needs the sevenn package ({exc.name or 'sevenn'} is not importable): "
                         f"{INSTALL} (it needs e3nn >= 0.5: use an environment without mace-torch)") from None
    return sevenn


# -- checkpoints -----------------------------------------------------------------------------
def _safe_globals():
    """What a sevenn checkpoint's config needs besides tensors: numeric numpy arrays (shift,
    scale).  ``_reconstruct`` is named by both its numpy 1 and numpy 2 module paths."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    rec = core.multiarray._reconstruct
    dtypes = [getattr(np.dtypes, n) for n in ("Float16DType", "Float32DType", "Float64DType", "Int32DType",
                                              "Int64DType", "BoolDType") if hasattr(np, "dtypes")]
    return [(rec, "numpy.core.multiarray._reconstruct"), (rec, "numpy._core.multiarray._reconstruct"),
            np.ndarray, np.dtype, *dtypes]


_FAMILIES = (("mace.", "a mace-torch model: use model=mace"), ("nequip.", "a NequIP model: use model=nequip"),
             ("e3nn.", "a pickled e3nn module"), ("torch.nn.", "a whole pickled torch module"))


def _refused(label: str, what: str) -> ValueError:
    kind = next((k for prefix, k in _FAMILIES if what.startswith(prefix)), None)
    if kind:
        return ValueError(f"{label} is not a SevenNet checkpoint: it holds {what} ({kind})")
    return ValueError(f"{label} needs {what}, which the safe loader does not allow; it is not a plain SevenNet "
                      "checkpoint. If you made this file yourself or trust its source, add model.trust_pickle=true "
                      "(unpickling runs any code the file holds)")


def load_checkpoint_dict(path: Path, label: str, trust_pickle: bool = False) -> dict:
    """The dict of a sevenn checkpoint (``config``, ``model_state_dict``), checked: family,
    model type and format version (a newer sevenn's file is refused, sevenn itself only warns)."""
    sevenn = import_sevenn()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if trust_pickle:
                cp = torch.load(path, map_location="cpu", weights_only=False)
            else:
                with torch.serialization.safe_globals(_safe_globals()):
                    cp = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise ValueError(f"{label} is not a loadable SevenNet checkpoint (a corrupt pickle)") from None
        raise _refused(label, what) from None
    except Exception as exc:  # noqa: BLE001 - zip errors, a TorchScript archive, ...
        if "TorchScript" in str(exc) or "constants.pkl" in str(exc):
            raise ValueError(f"{label} is a TorchScript archive (e.g. sevenn's deployed LAMMPS model), not a "
                             "SevenNet checkpoint; give the checkpoint .pth it was deployed from") from None
        raise ValueError(f"{label} is not a loadable SevenNet checkpoint ({type(exc).__name__}); give a "
                         "checkpoint_*.pth written by sevenn") from None
    if isinstance(cp, torch.nn.Module):
        raise ValueError(f"{label} is not a SevenNet checkpoint: it holds a whole {type(cp).__module__}."
                         f"{type(cp).__name__} module")
    if not isinstance(cp, dict) or not isinstance(cp.get("config"), dict) or "model_state_dict" not in cp:
        what = "a bare state dict" if isinstance(cp, dict) else f"a {type(cp).__name__}"
        raise ValueError(f"{label} is not a SevenNet checkpoint: it holds {what}, without sevenn's config and "
                         "model_state_dict; give a checkpoint_*.pth written by sevenn")
    cfg = cp["config"]
    if cfg.get("_model_type", "E3_equivariant_model") != "E3_equivariant_model":
        raise ValueError(f"{label} holds a sevenn model of type {cfg['_model_type']!r}; only "
                         "E3_equivariant_model (SevenNet) is supported")
    from packaging.version import InvalidVersion, Version

    try:
        written, have = Version(str(cfg.get("version"))), Version(sevenn.__version__)
    except InvalidVersion:
        raise ValueError(f"{label}: its config has no sevenn version ({cfg.get('version')!r}); give a checkpoint "
                         "written by sevenn") from None
    if written > have:
        raise ValueError(f"{label} was written by sevenn {written}, newer than the installed {have}: its format "
                         f"may differ; pip install 'sevenn>={written}'")
    if cfg.get("use_modality") or cfg.get("_modal_map"):
        raise ValueError(f"{label} is a multi-fidelity SevenNet model ({', '.join(cfg.get('_modal_map') or [])}); "
                         "only single-fidelity models are supported")
    return cp


def random_config(species: Sequence[str] = ("Cu",), cutoff: float = 4.5, channel: int = 16, lmax: int = 2,
                  num_layers: int = 3, is_parity: bool = False, seed: int = 0) -> dict:
    """sevenn's own default model configuration (``DEFAULT_E3_EQUIVARIANT_MODEL_CONFIG``) with
    these keys and what training would have filled in (type map, shift, scale, denominator)."""
    import_sevenn()
    import copy

    import sevenn._const as C
    import sevenn._keys as K
    from sevenn.nn.node_embedding import get_type_mapper_from_specie

    cfg = copy.deepcopy(C.DEFAULT_E3_EQUIVARIANT_MODEL_CONFIG)
    type_map = get_type_mapper_from_specie(list(species))
    cfg.update({K.CUTOFF: float(cutoff), K.NODE_FEATURE_MULTIPLICITY: int(channel), K.LMAX: int(lmax),
                K.NUM_CONVOLUTION: int(num_layers), K.IS_PARITY: bool(is_parity),
                K.SELF_CONNECTION_TYPE: "linear", K.CUTOFF_FUNCTION: {"cutoff_function_name": "XPLOR",
                                                                     "cutoff_on": 0.9 * float(cutoff)},
                K.CHEMICAL_SPECIES: sorted(species), K.NUM_SPECIES: len(type_map), K.TYPE_MAP: type_map,
                K.CONV_DENOMINATOR: 20.0, K.SHIFT: [-3.5 - 0.1 * k for k in range(len(type_map))], K.SCALE: 1.3,
                K.USE_SPECIES_WISE_SHIFT_SCALE: True, "version": import_sevenn().__version__,
                "random_seed": int(seed)})
    return cfg


def build_graph_model(cp: dict | None, config: dict | None = None, dtype=torch.float64, label: str = ""):
    """sevenn's ``AtomGraphSequential`` from a checkpoint dict (sevenn's own config routine,
    builder and state-dict patches, as ``SevenNetCheckpoint.build_model`` does), or with random
    weights from ``config`` (drawn from its ``random_seed`` on a forked RNG)."""
    import_sevenn()
    import sevenn.scripts.backward_compatibility as compat
    from sevenn.checkpoint import _config_cp_routine
    from sevenn.model_build import build_E3_equivariant_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if cp is not None:
            try:
                config = _config_cp_routine(dict(cp["config"]))
                model = build_E3_equivariant_model(config)
                model.load_state_dict(compat.patch_state_dict_if_old(cp["model_state_dict"], config, model))
            except Exception as exc:  # noqa: BLE001 - a config sevenn cannot build, weights that do not fit it
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise ValueError(f"{label}: sevenn cannot build a model from it ({type(exc).__name__}: {first}); "
                                 "give a checkpoint written by sevenn") from None
        else:
            with torch.random.fork_rng():
                torch.manual_seed(int(config.get("random_seed", 0)))
                model = build_E3_equivariant_model(dict(config))
    model.set_is_batch_data(False)
    if dtype != torch.float32:   # sevenn's one-hot is float32 always: cast it (0/1, exact)
        from sevenn.nn.node_embedding import OnehotEmbedding

        for m in model.modules():
            if isinstance(m, OnehotEmbedding):
                m.register_forward_hook(functools.partial(_cast_onehot, dtype=dtype))
    return model.to(dtype=dtype).eval(), config


def _cast_onehot(module, args, data, dtype=torch.float64):
    """Forward hook: sevenn's float32 one-hot rows in the model's dtype."""
    for key in {module.key_output, module.key_additional_output} - {None}:
        data[key] = data[key].to(dtype)
    return data


class SevenNetModel:
    """A SevenNet model on the halo scheme, through ``SPEC_SEVENNET``.

    checkpoint: a pretrained name shipped with sevenn (``7net-0``, ...) or a sevenn
    checkpoint file; random: a model of sevenn's architecture with random weights
    (:func:`random_config` keywords); dtype, device: how and where it runs; trust_pickle:
    unpickle the file freely (only for files you trust)."""

    name = "sevennet"
    distribution_spec = SPEC_SEVENNET

    def __init__(self, checkpoint: str | Path | None = "7net-0", dtype=torch.float64, device="cpu",
                 trust_pickle: bool = False, random: dict | None = None):
        import_sevenn()
        self.dtype, self.device = dtype, torch.device(device)
        if random is not None:   # no ``path``: the engine records a model file's path and SHA-256 by it
            cp, config = None, random_config(**random)
            self.label = "the random SevenNet model"
        else:
            self.path = self._resolve(str(checkpoint))
            self.label = f"model.checkpoint={str(checkpoint)!r}"
            cp, config = load_checkpoint_dict(self.path, self.label, trust_pickle=trust_pickle), None
        #: sevenn's full model (with its ForceStressOutputFromEdge): the single-process reference
        self.graph_model, self.config = build_graph_model(cp, config, dtype, self.label)
        self.graph_model.to(self.device)
        for p in self.graph_model.parameters():
            p.requires_grad_(False)
        #: the modules the engine runs: all but sevenn's force/stress output (autograd does those)
        self.modules = [m for m in self.graph_model if not hasattr(m, "get_grad_key")]
        self.cutoff = float(self.graph_model.cutoff)
        self.type_map = {int(z): int(t) for z, t in self.graph_model.type_map.items()}
        self.atomic_numbers = sorted(self.type_map)
        self._lut = self.graph_model.z_to_onehot_tensor.to(self.device)
        #: message-passing steps (a site energy reaches layers x cutoff), and the energy counts
        #: ``nl.n_counted`` rows where a list has them: a call can be made in parts (subdomains)
        self.layers = int(self.config.get("num_convolution_layer", 0)) or sum(
            type(m).__name__ == "IrrepsConvolution" for m in self.modules)
        self.counts_rows = True
        #: device bytes per list edge for the memory check before a run (engine/run/preflight.py):
        #: SevenNet-0 (128 channels, l <= 2, 5 layers) held 4.3-4.6 MB an atom in float32 at ~77
        #: list edges an atom (one H100, docs/benchmarks.md), ~60 kB an edge; scaled by the width,
        #: the depth and the float size of this model
        c = self.config
        size = int(c.get("channel", 128)) * (int(c.get("lmax", 2)) + 1) ** 2 * self.layers
        self.bytes_per_edge = int(60_000 * size / (128 * 9 * 5) * torch.finfo(dtype).bits / 32)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))

    @staticmethod
    def _resolve(checkpoint: str) -> Path:
        p = Path(checkpoint).expanduser()
        if p.is_file():
            return p
        shipped = _shipped_path(checkpoint)
        if shipped is not None:
            return shipped
        if checkpoint.lower().startswith(("7net-", "sevennet-")):
            raise ValueError(f"model.checkpoint={checkpoint!r}: not a SevenNet model shipped with sevenn (shipped: "
                             f"{', '.join(SHIPPED)}); download it with sevenn first and give the file")
        raise ValueError(f"model.checkpoint={checkpoint!r}: no such file; give a sevenn checkpoint .pth or a "
                         f"shipped model name ({', '.join(SHIPPED)})")

    def identity(self) -> str:
        """SHA-256 of the checkpoint file, or of the random model's config and weights."""
        return file_sha256(self.path) if hasattr(self, "path") else weights_sha256(self.config, self.graph_model)

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.atomic_numbers, self.label,
                               "use a SevenNet model trained on those elements")

    def ase_calculator(self):
        """sevenn's own SevenNetCalculator on the same model object (its matscipy neighbour
        list, its edge-gradient forces and stress); in float64 its inputs are built in float64
        (sevenn casts them to float32): the independent single-process reference."""
        import_sevenn()
        import sevenn._keys as K
        import sevenn.util as util
        from ase.calculators.calculator import Calculator, all_changes
        from sevenn.atom_graph_data import AtomGraphData
        from sevenn.calculator import SevenNetCalculator
        from sevenn.train.dataload import unlabeled_atoms_to_graph

        dtype = self.dtype

        class _Calculator(SevenNetCalculator):
            def calculate(self, atoms=None, properties=None, system_changes=all_changes):
                Calculator.calculate(self, atoms, properties, system_changes)
                graph = unlabeled_atoms_to_graph(atoms, self.cutoff, with_shift=False)
                data = AtomGraphData(**{k: v if k == K.INFO else util.dtype_correct(v, dtype)
                                        for k, v in graph.items()})
                self.results = self.output_to_results(self.model(data.to(self.device)))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = SevenNetCalculator if dtype == torch.float32 else _Calculator
            return cls(model=self.graph_model, file_type="model_instance", device=self.device)

    def layer_problem(self) -> str | None:
        """Why this model cannot be called layer by layer (domain/layered_parts.py), or None."""
        from .sevennet_layers import segments

        return segments(self.graph_model)[1]

    def call_layer(self, index: int, positions: torch.Tensor, numbers: torch.Tensor, nl, features):
        """Layer ``index`` on a part (models/sevennet_layers.py): (the query rows' features, their
        site energies (q,) eV at the last layer, zeros before). positions: (m, 3) Å."""
        from .sevennet_layers import call_layer, segments

        if getattr(self, "_segments", None) is None:
            self._segments = segments(self.graph_model)[0]
        z = numbers.long()
        return call_layer(self.graph_model, self._segments, index, positions.to(self.dtype), self._lut[z], z, nl,
                          features, self.cutoff)

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows =
        the owned atoms.  Returns energy () eV (summed over ranks by the per-system scatter)
        and energies (n_padded,) eV (owned rows kept by the spec)."""
        import sevenn._keys as K

        i, j = nl.centers(), nl.neighbors.long()
        shift = nl.shifts.to(positions.dtype) @ cell.as_subclass(torch.Tensor)
        with torch.no_grad():   # the list reaches cutoff + skin: keep the edges sevenn sees
            x = positions.as_subclass(torch.Tensor)
            keep = torch.nonzero(torch.linalg.vector_norm(x[j] - x[i] + shift, dim=1) < self.cutoff).squeeze(1)
        i, j = i[keep], j[keep]
        n = int(positions.shape[0])
        types = self._lut[numbers.as_subclass(torch.Tensor).long()]
        data = {K.EDGE_IDX: torch.stack([i, j]), K.EDGE_VEC: positions[j] - positions[i] + shift[keep],
                K.NODE_FEATURE: types, K.ATOMIC_NUMBERS: numbers.as_subclass(torch.Tensor),
                K.NUM_ATOMS: torch.tensor(n, device=types.device),
                K.BATCH: torch.zeros(n, dtype=torch.int64, device=types.device)}
        for module in self.modules:
            data = module(data)
        energies = data[K.ATOMIC_ENERGY].reshape(n)
        counted = getattr(nl, "n_counted", None)   # a part (domain/subdomains.py): its own rows alone
        energy = data[K.PRED_TOTAL_ENERGY].reshape(()) if counted is None else energies[:counted].sum()
        return {"energy": energy, "energies": energies}


def _shipped_path(name: str) -> Path | None:
    """The file of a pretrained model sevenn ships (no download: None when it is not there)."""
    import sevenn._const as C

    table = {n: getattr(C, a) for n, a in (("7net-0", "SEVENNET_0_11Jul2024"), ("sevennet-0", "SEVENNET_0_11Jul2024"),
                                           ("7net-0_11july2024", "SEVENNET_0_11Jul2024"),
                                           ("7net-0_11jul2024", "SEVENNET_0_11Jul2024"),
                                           ("7net-0_22may2024", "SEVENNET_0_22May2024"),
                                           ("7net-l3i5", "SEVENNET_l3i5"), ("7net-mf-0", "SEVENNET_MF_0"))
             if hasattr(C, a)}
    p = table.get(name.lower().replace("sevennet-", "7net-"))
    return Path(p) if p and Path(p).is_file() else None


def factory(*, checkpoint: str = "7net-0", dtype: str | None = None, trust_pickle: bool = False,
            random: bool = False, species=("Cu",), cutoff: float = 4.5, channel: int = 16, lmax: int = 2,
            num_layers: int = 3, seed: int = 0, precision: torch.dtype = torch.float64, device="cpu"):
    """SevenNet via sevenn (models/sevennet.py): ``checkpoint`` a shipped name (default
    ``7net-0``) or a sevenn checkpoint file; ``random=true``: sevenn's architecture with random
    weights (``species``, ``cutoff``, ``channel``, ``lmax``, ``num_layers``, ``seed``);
    ``dtype`` float32|float64 (default: the run's precision)."""
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"model.dtype={dtype!r}: give float32 or float64 (or leave it out: the run's precision)")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    if random:
        if isinstance(species, str):
            species = [species]
        return SevenNetModel(None, dtype=dt, device=device,
                             random=dict(species=tuple(species), cutoff=cutoff, channel=channel, lmax=lmax,
                                         num_layers=num_layers, seed=seed))
    return SevenNetModel(checkpoint, dtype=dt, device=device, trust_pickle=trust_pickle is True)
