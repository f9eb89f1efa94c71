"""metatomic models (metatomic-torch ``AtomisticModel`` files: PET, SOAP-BPNN and the other
architectures metatrain exports) behind the model contract, on any number of domains.

Units: positions Å, cell Å (rows are the cell vectors), energy eV, forces eV/Å, virial eV;
the model is asked for its energy in eV with positions in Å (``ModelEvaluationOptions``), and
metatomic converts from the model's own units.  Shapes: positions (n_padded, 3) = this rank's
owned atoms then its halo copies; numbers (n_padded,); outputs energy () eV (this rank's
share: its owned atoms' energies, summed over ranks by the spec), energies (n_owned,) eV,
forces (n_owned, 3) eV/Å and virial (3, 3) eV (both by DistributedModel's autograd).

Route to decomposition, and why.  A metatomic model is TorchScript: its scatters run below
Python dispatch, so ShardTensor's per-layer halo exchange cannot reach inside it (NequIP's
single TorchScript helper can be swapped, models/nequip.py; a whole TorchScript program
cannot).  So every rank gives the model a *padded local structure* instead: its owned atoms
plus a halo as deep as the model's whole receptive field, which is this wrapper's ``cutoff``
and therefore the engine's ghost width (cutoff + skin): ``interaction_range`` from
``ModelCapabilities``, except for metatrain's PET, whose declared range (GNN layers x cutoff)
is one cutoff short (:func:`pet_range`), or ``interaction_range=`` given by the user.  The
wrapper builds the model's own neighbour lists (``requested_neighbor_lists``: vesin, every
step) over all padded atoms, periodic only along the rank's unsplit periodic axes
(``ctx.local_pbc``; halo copies are the images along split axes), with the distance vectors
computed here in torch from the positions and cell so that autograd (forces, strain) flows
through them.  An atom at depth d below the halo surface has complete neighbourhoods for
d / cutoff hops, so the owned atoms (depth >= the receptive field) get the periodic system's
energies exactly; halo atoms' energies are wrong and are not asked for (``selected_atoms`` =
the owned atoms).  The energy is each
rank's partial sum (``all_reduce_outputs``); forces are ``-dE/dx`` over all padded rows,
the halo rows added to their owners by the reverse exchange; the virial is ``-dE/d strain``
summed over ranks.  Spec: ``SPEC_METATOMIC`` (the ``wide-halo`` preset: halo storage with no
correction, since every edge the model sees is its own).  The cost is the wide halo (at
9 Å, more halo atoms than owned ones per rank for small domains); one domain needs none.

Determinism: TorchScript's profiling executor swaps in an optimised graph after a model's
first calls, which changed the forces' last bits (9e-15 eV/Å from the second call on), so a
restarted run (whose first calls are unoptimised) would not repeat the uninterrupted one bit
for bit.  The model runs under ``torch.jit.optimized_execution(False)``: the same graph on
every call (as fast on CPU here: 69 vs 73 ms a call for 432 atoms of a small PET).

Safety (docs/safety.md).  A metatomic file is a program: its TorchScript is the model's
code, it runs with this process's rights and its operators can read and write files
(``torch.from_file(..., shared=True)`` writes any file the user may write).  So a file is
loaded only with ``trust_code=true``; before that, only its zip directory and metadata are
read as data, which is how a file of another family (a mace-torch pickle, a NequIP deployed
model, a metatensor-era atomistic model) or of a newer metatomic is refused by name.
TorchScript extensions (native libraries a model may name, e.g. featomic's) are loaded only
from ``extensions_directory``, the folder the user names (the paths recorded in the file are
taken relative to it, never as they stand); then metatomic's own ``check_atomistic_model``
(versions of torch and metatomic, extensions loaded) runs before ``torch.jit.load``.
"""
from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path, PurePosixPath

import torch

from shardmd.domain.api import PRESETS, ModelConfig, NeighborConfig, current_scope

from .contract import refuse_unknown_species
from .files import file_sha256

INSTALL = "pip install 'metatomic-torch>=0.1.19' vesin"
TRUST_FIX = ("it is a TorchScript program that runs with your rights (it can read and write files): "
             "add model.trust_code=true if you trust its source")

SPEC_METATOMIC = PRESETS["wide-halo"].replace(
    name="metatomic-wide-halo",
    description="metatomic TorchScript model on a padded local structure: halo as deep as its interaction range, "
                "its own neighbour lists over owned and halo atoms, owned atoms' energies (selected_atoms) summed "
                "over ranks, autograd forces (halo rows to owners) and virial")


def import_metatomic():
    """(metatomic.torch, vesin), or a one-line ValueError with the install command."""
    try:
        import metatomic.torch as mta
        import vesin
    except ImportError as exc:
        raise ValueError(f"model=metatomic needs the metatomic-torch package ({exc.name} is not installed): "
                         f"{INSTALL}") from None
    return mta, vesin


def _version(text: str) -> tuple:
    out = []
    for part in str(text).strip().split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _other_family(z: zipfile.ZipFile, names: list[str], extra: dict) -> tuple[str, str]:
    """(what the archive is, what to do) for a zip that is not a metatomic model."""
    if "metatensor-version" in extra:
        return ("a metatensor-torch atomistic model (metatensor.torch.atomistic, before metatomic)",
                "export it again with metatomic-torch (metatomic.torch.AtomisticModel.save)")
    if "nequip_version" in extra:
        return "a NequIP deployed model", "run NequIP models with model=nequip"
    if any("/code/" in n for n in names):
        return ("a TorchScript file without metatomic's metadata",
                "export the model with metatomic.torch.AtomisticModel.save (or mtt export)")
    pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is not None:
        with z.open(pkl) as f:
            head = f.read(1 << 20)   # its first MiB, as bytes: never unpickled
        if b"mace.modules" in head:
            return "a mace-torch model (a pickle)", "run it with model=mace model.checkpoint=FILE"
        if b"nequip" in head:
            return "a NequIP model (a pickle)", "run NequIP models with model=nequip"
        return "a torch.save file (a pickle)", "give a metatomic model exported with AtomisticModel.save"
    return "a zip archive", "give a metatomic model exported with AtomisticModel.save"


def inspect_file(path) -> dict:
    """The metadata of a metatomic model file, read as data (its zip directory and ``extra/``
    entries; nothing is unpickled or run): metatomic and torch versions, extensions (lists of
    {"name", "path"}); a one-line ValueError for a missing file or one of another family."""
    p = Path(path)
    label = f"model.checkpoint={path}"
    if not p.is_file():
        raise ValueError(f"{label}: no such file; give a metatomic model (.pt, exported with AtomisticModel.save)")
    if not zipfile.is_zipfile(p):
        raise ValueError(f"{label} is not a TorchScript archive, so not a metatomic model; give a file exported "
                         "with metatomic.torch.AtomisticModel.save (or mtt export)")
    with zipfile.ZipFile(p) as z:
        names = z.namelist()
        extra = {}
        for n in names:
            parts = PurePosixPath(n).parts
            if len(parts) == 3 and parts[1] == "extra":
                extra[parts[2]] = n
        if "metatomic-version" not in extra:
            what, fix = _other_family(z, names, extra)
            raise ValueError(f"{label} is {what}, not a metatomic model: {fix}")

        def text(key: str, default: str = "") -> str:
            return z.read(extra[key]).decode("utf-8", "replace").strip() if key in extra else default

        meta = {"metatomic_version": text("metatomic-version"), "torch_version": text("torch-version")}
        for key in ("extensions", "extensions-deps"):
            try:
                items = json.loads(text(key, "[]") or "[]")
            except (ValueError, RecursionError):   # RecursionError: hostile nesting
                items = None
            if not isinstance(items, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                      and isinstance(e.get("path"), str) for e in items):
                raise ValueError(f"{label}: its extra/{key} entry is not a list of {{name, path}}; "
                                 "export the model again with metatomic-torch")
            meta[key.replace("-", "_")] = items
    return meta


def check_versions(meta: dict, installed: str, label: str) -> None:
    """A file written by a newer metatomic-torch than the installed one is refused in one line."""
    wrote = meta["metatomic_version"]
    if _version(wrote) > _version(installed):
        raise ValueError(f"{label} was written by metatomic-torch {wrote}, newer than the installed {installed}: "
                         f"pip install -U 'metatomic-torch>={wrote}' (or export the model with {installed})")


def _load_extensions(meta: dict, directory, label: str) -> None:
    """Load the extension libraries the file names, from ``directory`` only (each entry's
    recorded path taken relative to it; absolute paths and escapes refused); an extension
    loaded in this process already is kept."""
    needed = meta["extensions_deps"] + meta["extensions"]
    if not needed:
        return
    loaded = {Path(p).name for p in torch.ops.loaded_libraries}
    names = ", ".join(e["name"] for e in meta["extensions"]) or ", ".join(e["name"] for e in needed)
    if directory is None:
        missing = [e for e in needed if Path(e["path"]).name not in loaded]
        if missing:
            raise ValueError(f"{label} needs the TorchScript extensions {names} (native libraries): give "
                             "model.extensions_directory=DIR, the folder their libraries were collected in "
                             "(AtomisticModel.save(..., collect_extensions=DIR))")
        return
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ValueError(f"model.extensions_directory={directory}: no such folder; give the folder the model's "
                         "extensions were collected in")
    for e in needed:
        rel = PurePosixPath(e["path"])
        lib = (root / rel).resolve() if not rel.is_absolute() else None
        if lib is None or root not in lib.parents:
            raise ValueError(f"{label} names the extension {e['name']} at {e['path']}, outside "
                             f"model.extensions_directory: libraries are loaded from that folder only")
        if lib.name in loaded:
            continue
        if not lib.is_file():
            raise ValueError(f"{label} needs the extension {e['name']}: no {rel} in {directory}")
        torch.ops.load_library(str(lib))
        loaded.add(lib.name)


def load_model(path, trust_code: bool = False, extensions_directory=None):
    """The file's ``AtomisticModel`` (TorchScript), after the checks above, with ``trust_code``."""
    mta, _ = import_metatomic()
    label = f"model.checkpoint={path}"
    meta = inspect_file(path)
    check_versions(meta, mta.__version__, label)
    if trust_code is not True:
        raise ValueError(f"{label}: {TRUST_FIX}")
    _load_extensions(meta, extensions_directory, label)
    try:
        mta.check_atomistic_model(str(path))
        module = torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{label}: metatomic cannot load it ({first}); export it again with the installed "
                         f"metatomic-torch {mta.__version__} and torch {torch.__version__}") from None
    if getattr(module, "original_name", None) != "AtomisticModel":
        raise ValueError(f"{label} holds a {getattr(module, 'original_name', type(module).__name__)}, not an "
                         "AtomisticModel; export the model with metatomic.torch.AtomisticModel.save")
    return module


def pet_range(module) -> float | None:
    """The receptive field of metatrain's PET with its default ``feedforward`` featurizer, in the
    model's length unit: (GNN layers + 1) x cutoff, one cutoff more than the
    ``interaction_range`` metatrain declares (layers x cutoff).  After the last GNN layer the
    reversed edge messages (atom j's tokens, themselves layers x cutoff deep around j) are
    folded into the edge features the readout sums, so an atom's energy reaches one more
    cutoff.  Measured: with a halo of layers x cutoff + skin the owned atoms' energies were
    6e-6 eV off the periodic system's (2 layers, 4 Å), exact (1e-15) from (layers + 1) x cutoff.
    None for any other model (the ``residual`` featurizer reads each layer before the reversal)."""
    inner = getattr(module, "module", None)
    if getattr(inner, "original_name", None) != "PET" or getattr(inner, "featurizer_type", None) != "feedforward":
        return None
    try:
        return (int(inner.num_gnn_layers) + 1) * float(inner.cutoff)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


class MetatomicModel:
    """A metatomic model file on the wide-halo route (module docstring).

    checkpoint: the exported model (.pt); trust_code: load it (it is a program);
    extensions_directory: where its TorchScript extensions are, if it has any; variant:
    the energy variant (output ``energy/<variant>``; default the model's ``energy``);
    dtype: the model's own dtype, only to check it ("float32"/"float64"; the model runs in
    the dtype it was exported in, inputs converted); precision: the engine's dtype (outputs
    come back in it); check_consistency: metatomic's input/output checks on every call;
    interaction_range: Å, the halo depth to use instead of the file's (or PET's, :func:`pet_range`)."""

    name = "metatomic"
    distribution_spec = SPEC_METATOMIC

    def __init__(self, checkpoint, trust_code: bool = False, extensions_directory=None, variant: str | None = None,
                 dtype: str | None = None, precision: torch.dtype = torch.float64, device="cpu",
                 check_consistency: bool = False, interaction_range: float | None = None):
        mta, vesin = import_metatomic()
        self._mta = mta
        self.path = Path(checkpoint)
        label = f"model.checkpoint={checkpoint}"
        self.module = load_model(self.path, trust_code, extensions_directory)
        caps = self.module.capabilities()
        self.capabilities = caps
        self.model_dtype = {"float64": torch.float64, "float32": torch.float32}.get(caps.dtype)
        if self.model_dtype is None:
            raise ValueError(f"{label}: the model runs in {caps.dtype}; ShardMD runs float32 or float64 models")
        if dtype is not None and dtype != caps.dtype:
            raise ValueError(f"model.dtype={dtype}: {self.path.name} was exported in {caps.dtype} and runs in it; "
                             f"drop model.dtype or give {caps.dtype} (precision= sets the engine's dtype)")
        self.device = torch.device(device)
        if self.device.type not in list(caps.supported_devices):
            raise ValueError(f"{label}: the model runs on {', '.join(caps.supported_devices)}, not "
                             f"{self.device.type}; choose device= accordingly")
        self.precision = precision
        self.check_consistency = check_consistency is True
        key = "energy" if variant is None else f"energy/{variant}"
        if key not in caps.outputs:
            have = sorted(k for k in caps.outputs if k == "energy" or k.startswith("energy/"))
            raise ValueError(f"{label} has no output {key!r} (its energy outputs: {', '.join(have) or 'none'}); "
                             + ("give model.variant=NAME" if have else "ShardMD runs energy models"))
        self.energy_key = key
        self.per_atom = caps.outputs[key].sample_kind == "atom"
        inputs = self.module.requested_inputs(use_new_names=True)
        if len(inputs):
            raise ValueError(f"{label} asks for inputs {', '.join(inputs)}, which ShardMD does not give a "
                             "metatomic model yet; use a model that needs positions, cell and species only")
        to_angstrom = mta.unit_conversion_factor(caps.length_unit or "angstrom", "angstrom")
        self.nl_options = list(self.module.requested_neighbor_lists())
        self._nl = [vesin.NeighborList(cutoff=float(o.engine_cutoff("angstrom")), full_list=bool(o.full_list))
                    for o in self.nl_options]
        lists = max([float(o.engine_cutoff("angstrom")) for o in self.nl_options], default=0.0)
        #: Å: the range the file declares (ModelCapabilities.interaction_range)
        self.declared_range = float(caps.interaction_range) * to_angstrom
        if interaction_range is not None:
            try:
                reach = float(interaction_range)
            except (TypeError, ValueError):
                reach = math.nan
            if not (math.isfinite(reach) and reach >= lists and reach > 0):
                raise ValueError(f"model.interaction_range={interaction_range}: give the model's receptive field in "
                                 f"Å, at least its neighbour-list cutoff {lists:g} Å")
        else:
            pet = pet_range(self.module)
            reach = max(self.declared_range, lists, pet * to_angstrom if pet is not None else 0.0)
        if not math.isfinite(reach) or reach <= 0:
            raise ValueError(f"{label}: its interaction range is {caps.interaction_range} (a long-range or "
                             "unbounded model); ShardMD needs a finite one to size the halo")
        #: Å: the model's whole receptive field: the halo depth (ghost width = cutoff + skin)
        self.cutoff = reach
        self.atomic_numbers = sorted(int(z) for z in caps.atomic_types)
        self.module = self.module.to(device=self.device)
        outputs = ("energy", "energies", "forces", "virial") if self.per_atom else ("energy", "forces", "virial")
        self.model_config = ModelConfig(outputs=outputs,
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))
        from metatensor.torch import Labels, TensorBlock

        self._labels, self._block = Labels, TensorBlock
        self._xyz = Labels("xyz", torch.tensor([[0], [1], [2]], device=self.device))
        self._distance = Labels("distance", torch.tensor([[0]], device=self.device))

    # -- identity, species, reference -------------------------------------------------------------
    def identity(self) -> str:
        return file_sha256(self.path)

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.atomic_numbers, f"the metatomic model {self.path.name}")

    def ase_calculator(self, **kwargs):
        """metatomic's own ASE calculator on the same file (its neighbour lists, its autograd
        forces and stress on the whole periodic system): the independent reference."""
        try:
            from metatomic_ase import MetatomicCalculator
        except ImportError:   # metatomic-torch before metatomic-ase was split out
            from metatomic.torch.ase_calculator import MetatomicCalculator
        return MetatomicCalculator(str(self.path), device=str(self.device), **kwargs)

    # -- the call ---------------------------------------------------------------------------------
    def _neighbors(self, k: int, x: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor):
        """The k-th requested list over all given points: a metatensor TensorBlock whose
        distance vectors ``x[j] - x[i] + S @ cell`` (Å) carry autograd to x and cell."""
        pts = x.detach().to("cpu", torch.float64).numpy()
        box = (cell.detach().to("cpu", torch.float64) * pbc.to("cpu")[:, None]).numpy()
        i, j, s = self._nl[k].compute(points=pts, box=box, periodic=pbc.cpu().numpy(), quantities="ijS")
        i = torch.as_tensor(i, dtype=torch.int64, device=x.device)
        j = torch.as_tensor(j, dtype=torch.int64, device=x.device)
        s = torch.as_tensor(s, dtype=torch.int32, device=x.device).reshape(-1, 3)
        d = x.index_select(0, j) - x.index_select(0, i) + s.to(x.dtype) @ cell
        samples = self._labels(["first_atom", "second_atom", "cell_shift_a", "cell_shift_b", "cell_shift_c"],
                               torch.cat([i[:, None], j[:, None], s.to(torch.int64)], 1).to(torch.int32))
        return self._block(d.reshape(-1, 3, 1), samples, [self._xyz], self._distance)

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions (n_padded, 3) Å, the owned rows first; returns energy () eV (the owned
        atoms' energies) and energies (n_owned,) eV.  ``nl`` (the engine's list) is not used:
        the model's lists are built here over all padded atoms."""
        mta = self._mta
        scope = current_scope()
        x = positions.as_subclass(torch.Tensor).to(self.model_dtype)
        c = cell.as_subclass(torch.Tensor).to(self.model_dtype)
        n = int(x.shape[0])
        n_owned = int(scope.n_owned) if scope is not None and scope.halo is not None else n
        local = scope.ctx.local_pbc if scope is not None else pbc
        lp = torch.as_tensor([bool(b) for b in (local.tolist() if torch.is_tensor(local) else local)],
                             device=x.device)
        types = numbers.as_subclass(torch.Tensor).to(device=x.device, dtype=torch.int32)
        system = mta.System(types=types, positions=x, cell=c * lp[:, None].to(c.dtype), pbc=lp)
        for k, options in enumerate(self.nl_options):
            system.add_neighbor_list(options, self._neighbors(k, x, c, lp))
        selected = None
        if n_owned < n:
            atoms = torch.arange(n_owned, device=x.device, dtype=torch.int32)
            selected = self._labels(["system", "atom"], torch.stack([torch.zeros_like(atoms), atoms], 1))
        request = mta.ModelOutput(unit="eV", sample_kind="atom" if self.per_atom else "system")
        options = mta.ModelEvaluationOptions(length_unit="angstrom", outputs={self.energy_key: request},
                                             selected_atoms=selected)
        with torch.jit.optimized_execution(False):   # the same graph on every call: bit-exact restarts
            block = self.module([system], options, self.check_consistency)[self.energy_key].block()
        values = block.values.reshape(-1).to(self.precision)
        if not self.per_atom:
            return {"energy": values.sum()}
        atom = block.samples.column("atom").to(torch.int64)
        energies = values.new_zeros(n_owned).index_add(0, atom, values)
        return {"energy": energies.sum(), "energies": energies}


def factory(*, checkpoint: str | None = None, trust_code: bool = False, extensions_directory: str | None = None,
            variant: str | None = None, dtype: str | None = None, check_consistency: bool = False,
            interaction_range: float | None = None, precision: torch.dtype = torch.float64, device="cpu"):
    """A metatomic model file: ``model=metatomic model.checkpoint=FILE.pt model.trust_code=true``."""
    if checkpoint is None:
        raise ValueError("model=metatomic needs model.checkpoint=FILE.pt, a metatomic model exported with "
                         "AtomisticModel.save (or mtt export)")
    if dtype is not None and dtype not in ("float32", "float64"):
        raise ValueError(f"model.dtype={dtype}: give float32 or float64 (the dtype the model was exported in)")
    return MetatomicModel(checkpoint, trust_code=trust_code is True, extensions_directory=extensions_directory,
                          variant=variant, dtype=dtype, precision=precision, device=device,
                          check_consistency=check_consistency, interaction_range=interaction_range)


__all__ = ["INSTALL", "SPEC_METATOMIC", "MetatomicModel", "factory", "import_metatomic", "inspect_file", "load_model"]
