"""MatterSim (the ``mattersim`` package, unmodified: its M3GNet) behind the model contract,
through the specs.

MatterSim's M3GNet takes external edges (one cutoff, default 5 Å) and three-body (angle)
indices built from them (pairs of distinct edges of one centre, both within the three-body
cutoff, default 4 Å), then runs message-passing blocks: each block updates edge ``(i, j)``
from the angles ``j-i-k`` around its centre ``i`` (a sum over the centre's own edges), then
the edge from the features of ``i`` and ``j``, then atom ``i`` by the sum of its edges; a
per-atom readout, per-species scale and shift; no whole-system terms.

Route to decomposition, and why: **the per-layer exchange through the spec** (as
models/sevennet.py), not the wide halo.  MatterSim's modules are plain Python ``nn.Module`` code
(its TorchScript ``compile_mode`` applies only when a user scripts the model), and its blocks'
sums go through one module-level function of
``mattersim.forcefield.m3gnet.modules.message_passing``: torch_runstats' ``scatter`` in
mattersim 1.2.3, mattersim's own ``scatter_sum`` (``modules/scatter.py``) in 1.2.5, called in
both for the same sums: ``MainBlock``'s per-atom sum (``AtomLayer``'s too, a module M3Gnet does
not use) and the three-body sum onto edges.  A :class:`PythonAdapter` swaps the installed name
(``SCATTER_NAME``) for :func:`message_scatter`, the same sum with its per-atom target allocated
like the positions (``shard_like``), so the built-in ``halo_correction`` refreshes ghost rows
from their owners before the next block (its backward is the reverse exchange).  The edge sum of
the three-body update (target: the edges) stays MatterSim's own: every edge and every angle is
of an owned centre, whose edges are all on its rank (the engine's full list, query rows = owned
atoms), so each owned atom's angles are complete (:func:`three_body_indices`).  M3GNet's
``forward`` (graph featurisation, then the blocks, then a sum over systems, its one other
scatter) is short and in 1.2.3 casts to float32 (``pbc_offsets.float()``, the one-hot
``.float()``); the wrapper runs the same steps on the same submodules
(:meth:`MatterSimModel.compute`) in the model's dtype and sums the per-atom energies into
``positions.new_zeros(1)``, the per-system scatter the ``system_reduce`` handler sums over
ranks (ghost rows dropped).  Forces ``-dE/dx`` and the virial ``-dE/d strain`` come from
DistributedModel's autograd (``model_config``); MatterSim's own ``MatterSimCalculator`` on the
same weights (its pymatgen neighbour list, its three-body builder, its autograd) is the
independent reference (:meth:`MatterSimModel.ase_calculator`).

Graph from our neighbour list: MatterSim's convention ``edge_index = [centre i, neighbour j]``,
``edge_vector = x_i - (x_j + S @ cell)``, edges past the cutoff dropped (the list reaches
cutoff + skin).  Shapes: positions (n_padded, 3) Å, cell (3, 3) Å, numbers (n_padded,);
energy () eV, energies (n_padded,) eV (owned rows kept by the spec).  Units: eV, Å.

Precision: MatterSim's calculator and data are float32 only; ``dtype=float64`` casts the
weights and buffers (the constants its basis functions computed in float32 are kept as those
values) and evaluates everything in float64.

Checkpoints (``Potential.save``: a pickled dict of ``model_name``, ``model`` (state dict),
``model_args``, training state) are read ``weights_only=True`` (tensors and plain containers;
never unpickled freely without ``model.trust_pickle=true``); a file of another family, a bare
state dict, an unknown model name or arguments or weights this MatterSim does not have (a newer
format) are refused in one line.  mattersim is imported only when this model is built.
"""
from __future__ import annotations

import importlib.util
import inspect
import pickle
import threading
import warnings
from pathlib import Path

import torch

from shardmd.domain.api import SPEC_MPNN_HALO, ModelConfig, NeighborConfig, OutputKind, PythonAdapter, shard_like

from .edge_memory import edge_bytes
from .files import file_sha256, refused_global, weights_sha256

#: what the errors tell to install (mattersim 1.2.3 needs e3nn >= 0.5; mace-torch pins 0.4.4)
INSTALL = "pip install 'shardmd[mattersim]'"
ENVIRONMENT = "in its own environment: mattersim needs e3nn >= 0.5, which mace-torch excludes"
#: the pretrained names MatterSim downloads to ~/.local/mattersim/pretrained_models (never downloaded here)
PRETRAINED = {"mattersim-v1.0.0-1m": "mattersim-v1.0.0-1M.pth", "mattersim-v1.0.0-5m": "mattersim-v1.0.0-5M.pth"}
#: M3Gnet's constructor arguments a checkpoint may give (``M3Gnet.get_model_args``); mattersim
#: 1.2.5 also saves ``gradient_checkpointing``, which recomputes activations to save memory and
#: changes no number (1.2.3's M3Gnet takes it into ``**kwargs``; the wrapper runs the blocks itself)
MODEL_ARGS = ("num_blocks", "units", "max_l", "max_n", "cutoff", "max_z", "threebody_cutoff",
              "gradient_checkpointing")
_LOCAL = threading.local()   # the current call's three-body edge map: that sum is over edges, not atoms


def _scatter_name() -> str:
    """The name message_passing calls its sums by, read from the installed files (importing
    mattersim is slow and happens only when a model is built): ``scatter_sum`` where mattersim
    has its own ``modules/scatter.py`` (1.2.5), else torch_runstats' ``scatter`` (1.2.3)."""
    try:
        spec = importlib.util.find_spec("mattersim")
    except (ImportError, ValueError):   # hidden or half-installed: the model's build says so
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    own = any((Path(r) / "forcefield" / "m3gnet" / "modules" / "scatter.py").is_file() for r in roots)
    return "scatter_sum" if own else "scatter"


SCATTER_NAME = _scatter_name()


def _is_edge_map(index) -> bool:
    """Whether ``index`` is the current call's three-body edge map (that sum's target is the
    edges, not the atoms): 1.2.3 gets the tensor itself (``three_body_edge_map``); 1.2.5 slices
    ``three_body_index[:, 0]`` afresh, a new tensor on the same memory, shape and strides.  The
    per-atom sums index ``edge_index``, other memory."""
    edge_map = getattr(_LOCAL, "edge_map", None)
    if edge_map is None or not torch.is_tensor(index):
        return False
    return index is edge_map or (index.shape == edge_map.shape and index.stride() == edge_map.stride()
                                 and index.data_ptr() == edge_map.data_ptr())


def message_scatter(scope):
    """PythonAdapter factory for message_passing's sum as MatterSim's blocks call it, by keyword
    (1.2.3: ``scatter(src, index, dim=0, reduce="sum", dim_size=n)``; 1.2.5:
    ``scatter_sum(src, index, dim=0, dim_size=n)``): the per-atom sum (target (n_padded, F))
    allocated like the promoted positions, so ``halo_correction`` sees it; the three-body sum
    onto edges, any other call and any call outside a scope go to the function it replaces."""
    if SCATTER_NAME == "scatter_sum":
        from mattersim.forcefield.m3gnet.modules.scatter import scatter_sum as plain
    else:
        from torch_runstats.scatter import scatter as plain

    ref = getattr(scope, "reference", None)
    n_padded = None if ref is None else scope.n_padded

    def scatter(src, index, *args, **kw):
        atoms = (ref is not None and not args and kw.get("dim") == 0 and kw.get("dim_size") == n_padded
                 and kw.get("out") is None and kw.get("reduce", "sum") == "sum" and not _is_edge_map(index))
        if not atoms:
            return plain(src, index, *args, **kw)
        target = shard_like(src.new_zeros((n_padded, *src.shape[1:])), ref)
        return target.index_add_(0, index, src)

    return scatter


SPEC_MATTERSIM = SPEC_MPNN_HALO.replace(
    name="mattersim-mpnn-halo",
    description="MatterSim (M3GNet): message passing with three-body updates of each centre's own edges, autograd "
                "forces and virial, halo storage with scatter correction; its per-atom scatter swapped for a sum "
                "the handlers see",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_helpers(PythonAdapter("mattersim.forcefield.m3gnet.modules.message_passing", SCATTER_NAME,
                             message_scatter, factory=True))


def import_mattersim():
    """``mattersim.forcefield.m3gnet.m3gnet`` (quietly), or a one-line ValueError: the install
    command, or the fix for torchvision/torchaudio wheels built for another torch."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import mattersim.forcefield.m3gnet.m3gnet as m3gnet
            import mattersim.forcefield.m3gnet.modules.message_passing  # noqa: F401 - the adapter's target
    except ImportError as exc:
        raise ValueError(f"model=mattersim needs the mattersim package ({exc.name or 'mattersim'} is not "
                         f"importable): {INSTALL} ({ENVIRONMENT})") from None
    except RuntimeError as exc:   # torchvision's operators registered against another torch build
        first = (str(exc).strip().splitlines() or [""])[0][:120]
        raise ValueError(f"model=mattersim: importing mattersim failed ({first}); pip uninstall torchvision "
                         "torchaudio (pulled in for another torch; MatterSim does not need them)") from None
    return m3gnet


# -- checkpoints -----------------------------------------------------------------------------
_FAMILIES = (("mace.", "a mace-torch model: use model=mace"), ("nequip.", "a NequIP model: use model=nequip"),
             ("sevenn.", "a SevenNet model: use model=sevennet"), ("e3nn.", "a pickled e3nn module"),
             ("mattersim.", "a pickled MatterSim object (not Potential.save's dict)"),
             ("torch.nn.", "a whole pickled torch module"))


def _refused(label: str, what: str) -> ValueError:
    kind = next((k for prefix, k in _FAMILIES if what.startswith(prefix)), None)
    if kind:
        return ValueError(f"{label} is not a MatterSim checkpoint: it holds {what} ({kind})")
    return ValueError(f"{label} needs {what}, which the safe loader does not allow; it is not a plain MatterSim "
                      "checkpoint. If you made this file yourself or trust its source, add model.trust_pickle=true "
                      "(unpickling runs any code the file holds)")


def _other_dict(cp: dict) -> str | None:
    """What a checkpoint dict of another family is, from its keys (None: not recognised)."""
    if "config" in cp and "model_state_dict" in cp:
        return "a SevenNet checkpoint: use model=sevennet"
    if "hyper_parameters" in cp and "state_dict" in cp:
        return "a nequip-train checkpoint: use model=allegro or model=nequip"
    if cp and all(torch.is_tensor(v) for v in cp.values()):
        return "a bare state dict, without MatterSim's model_name and model_args: save it with Potential.save"
    return None


def load_checkpoint_dict(path: Path, label: str, trust_pickle: bool = False) -> dict:
    """The dict ``Potential.save`` writes, checked: family, model name, arguments."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cp = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise ValueError(f"{label} is not a loadable MatterSim checkpoint (a corrupt pickle)") from None
        raise _refused(label, what) from None
    except Exception as exc:  # noqa: BLE001 - zip errors, a TorchScript archive, ...
        if "TorchScript" in str(exc) or "constants.pkl" in str(exc):
            raise ValueError(f"{label} is a TorchScript archive, not a MatterSim checkpoint; give the .pth "
                             "Potential.save wrote") from None
        raise ValueError(f"{label} is not a loadable MatterSim checkpoint ({type(exc).__name__}); give the .pth "
                         "Potential.save wrote") from None
    if isinstance(cp, torch.nn.Module):
        raise ValueError(f"{label} is not a MatterSim checkpoint: it holds a whole {type(cp).__module__}."
                         f"{type(cp).__name__} module")
    if not isinstance(cp, dict) or "model" not in cp or not isinstance(cp.get("model_args"), dict):
        what = (_other_dict(cp) if isinstance(cp, dict) else None) or f"a {type(cp).__name__} without " \
            "MatterSim's model, model_args and model_name"
        raise ValueError(f"{label} is not a MatterSim checkpoint: it is {what}")
    name = str(cp.get("model_name", "m3gnet"))
    if name.lower() != "m3gnet":
        raise ValueError(f"{label} holds a MatterSim {name!r} model; only m3gnet (MatterSim v1) is supported")
    extra = sorted(set(cp["model_args"]) - set(MODEL_ARGS))
    if extra:
        raise ValueError(f"{label} has model arguments {', '.join(extra)} that mattersim "
                         f"{_version()} does not know (written by a newer mattersim?): pip install -U mattersim")
    return cp


def _version() -> str:
    from importlib.metadata import version

    return version("mattersim")


def build_network(cp: dict | None, args: dict, dtype=torch.float64, label: str = "", seed: int = 0,
                  scale: float = 1.0, shift: dict | None = None):
    """MatterSim's ``M3Gnet`` from a checkpoint dict (every weight must fit, none left random), or
    with random weights from ``args`` (drawn from ``seed`` on a forked RNG; the per-species
    energy ``scale`` and ``shift`` (eV, {Z: value}) stand for what training fills in)."""
    m3gnet = import_mattersim()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if cp is not None:
                net = m3gnet.M3Gnet(device="cpu", **{**args, **cp["model_args"]})
                missing, unexpected = net.load_state_dict(cp["model"], strict=False)
                if missing or unexpected:
                    names = ", ".join((missing or unexpected)[:3])
                    raise ValueError(f"{label}: its weights do not fit MatterSim {_version()}'s M3GNet ("
                                     f"{'missing' if missing else 'unknown'}: {names}); a newer or another model "
                                     "format")
            else:
                with torch.random.fork_rng():
                    torch.manual_seed(int(seed))
                    net = m3gnet.M3Gnet(device="cpu", **args)
                net.normalizer.scale.fill_(float(scale))
                for z, value in (shift or {}).items():
                    net.normalizer.shift[int(z)] = float(value)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - arguments M3Gnet cannot build, weights of the wrong shape
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"{label}: MatterSim cannot build a model from it ({type(exc).__name__}: {first})"
                             ) from None
    for p in net.parameters():
        p.requires_grad_(False)
    return net.to(dtype=dtype).eval()


# -- three-body indices -----------------------------------------------------------------------
def three_body_indices(centres: torch.Tensor, lengths: torch.Tensor, cutoff: float) -> torch.Tensor:
    """(n_triples, 2) pairs of edge numbers ``(ij, ik)``: every ordered pair of distinct edges of
    one centre, both no longer than ``cutoff`` (Å), as MatterSim's ``compute_threebody`` builds
    them.  centres: (n_edges,) the edges' centres; lengths: (n_edges,) Å.  All edges of an owned
    centre are on its rank, so its angles are complete."""
    edges = torch.nonzero(lengths <= cutoff).squeeze(1)
    order = torch.argsort(centres[edges], stable=True)
    edges = edges[order]
    _, counts = torch.unique_consecutive(centres[edges], return_counts=True)
    per_edge = torch.repeat_interleave(counts, counts)               # its centre's edge count, per edge
    start = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)   # its centre's first edge
    first = torch.repeat_interleave(torch.arange(len(edges), device=edges.device), per_edge)
    within = torch.arange(len(first), device=edges.device) - torch.repeat_interleave(
        torch.cumsum(per_edge, 0) - per_edge, per_edge)
    second = start[first] + within
    keep = first != second
    return torch.stack([edges[first[keep]], edges[second[keep]]], 1)


class MatterSimModel:
    """A MatterSim (M3GNet) model on the halo scheme, through ``SPEC_MATTERSIM``.

    checkpoint: a file ``Potential.save`` wrote, or a pretrained name MatterSim has already
    downloaded; random: a dict of M3Gnet arguments plus ``seed``, ``scale``, ``shift`` for
    random weights; dtype, device: how and where it runs; trust_pickle: unpickle the file freely."""

    name = "mattersim"
    distribution_spec = SPEC_MATTERSIM

    def __init__(self, checkpoint: str | None, dtype=torch.float64, device="cpu", trust_pickle: bool = False,
                 random: dict | None = None):
        self.dtype, self.device = dtype, torch.device(device)
        if random is not None:
            random = dict(random)
            extra = {k: random.pop(k) for k in ("seed", "scale", "shift") if k in random}
            self.label, cp = "the random MatterSim model", None
            self.args = random
        else:
            self.path = self._resolve(str(checkpoint))
            self.label = f"model.checkpoint={checkpoint}"
            cp, extra = load_checkpoint_dict(self.path, self.label, trust_pickle=trust_pickle), {}
            self.args = dict(cp["model_args"])
        self.random = None if cp is not None else extra
        self.net = build_network(cp, self.args, dtype, self.label, **extra).to(self.device)
        self.args = dict(self.net.model_args)
        self.cutoff = float(self.args["cutoff"])
        self.threebody_cutoff = float(self.args["threebody_cutoff"])
        self.max_z = int(self.args["max_z"])
        #: device bytes per list edge for the memory check (models/edge_memory.py): by blocks x units
        self.bytes_per_edge = edge_bytes(39_600, int(self.args.get("num_blocks", 4)) * int(self.args.get("units", 128)),
                                         4 * 128, dtype)
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff))
        #: message-passing steps (each block reaches one edge: atoms, bonds and the angles at a
        #: bond's centre), and the energy counts ``nl.n_counted`` rows where a list has them: a
        #: call can be made in parts (subdomains)
        self.layers = len(self.net.graph_conv)
        self.counts_rows = True
        #: 1.2.3's blocks take the sizes and the three-body edge map (without them they read the
        #: sizes back from the tensors and rebuild the map as if the angles were sorted by edge;
        #: ours are by centre); 1.2.5's take neither, reading both off the tensors they are given
        self.block_sizes = "three_body_edge_map" in inspect.signature(import_mattersim().MainBlock.forward).parameters

    @staticmethod
    def _resolve(checkpoint: str) -> Path:
        p = Path(checkpoint).expanduser()
        if p.is_file():
            return p
        name = PRETRAINED.get(checkpoint.lower().removesuffix(".pth"))
        if name is not None:
            local = Path("~/.local/mattersim/pretrained_models").expanduser() / name
            if local.is_file():
                return local
            raise ValueError(f"model.checkpoint={checkpoint}: not downloaded yet; let MatterSim download it "
                             "(MatterSimCalculator(load_path=...)) or give the file")
        raise ValueError(f"model.checkpoint={checkpoint}: no such file; give a MatterSim checkpoint (.pth, "
                         f"Potential.save) or a downloaded pretrained name ({', '.join(PRETRAINED)})")

    def identity(self) -> str:
        """SHA-256 of the checkpoint file, or of the random model's arguments and weights."""
        return file_sha256(self.path) if hasattr(self, "path") else weights_sha256([self.args, self.random], self.net)

    def check_species(self, numbers) -> None:
        """MatterSim covers Z = 1 .. max_z (its one-hot); other numbers are refused."""
        bad = sorted(z for z in set(int(z) for z in torch.as_tensor(numbers).unique().tolist())
                     if not 1 <= z <= self.max_z)
        if bad:
            raise ValueError(f"{self.label} covers atomic numbers 1..{self.max_z}; the system has "
                             f"{', '.join(map(str, bad))}")

    def ase_calculator(self):
        """MatterSim's own ``MatterSimCalculator`` on a float32 copy of the same weights (its
        graph builder, its autograd forces and stress; MatterSim runs float32 only)."""
        m3gnet = import_mattersim()
        from mattersim.forcefield.potential import MatterSimCalculator, Potential

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = m3gnet.M3Gnet(device="cpu", **self.args)
            net.load_state_dict({k: v.float() if v.is_floating_point() else v
                                 for k, v in self.net.state_dict().items()})
            return MatterSimCalculator(potential=Potential(net.eval(), device="cpu"), device="cpu")

    # -- the call -----------------------------------------------------------------------------
    def _graph(self, positions, cell, nl):
        """Edges within the cutoff: (edge_index (2, n_edges) [centre, neighbour], edge vectors
        (n_edges, 3) Å in MatterSim's sign, lengths (n_edges,) Å, three-body pairs (n_triples, 2))."""
        i, j = nl.centers(), nl.neighbors.long()
        shift = nl.shifts.to(positions.dtype) @ cell.as_subclass(torch.Tensor)
        with torch.no_grad():   # the list reaches cutoff + skin: keep the edges MatterSim has
            x = positions.as_subclass(torch.Tensor)
            keep = torch.nonzero(torch.linalg.vector_norm(x[i] - (x[j] + shift), dim=1) <= self.cutoff).squeeze(1)
        i, j, shift = i[keep], j[keep], shift[keep]
        vectors = positions[i] - (positions[j] + shift)
        lengths = torch.linalg.norm(vectors, dim=1)
        triples = three_body_indices(i, lengths.detach().as_subclass(torch.Tensor), self.threebody_cutoff)
        return torch.stack([i, j]), vectors, lengths, triples

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl
                ) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows =
        the owned atoms.  M3Gnet.forward's steps on its own submodules, in the model's dtype.
        Returns energy () eV (summed over ranks by the per-system scatter) and energies
        (n_padded,) eV (owned rows kept by the spec)."""
        net, n = self.net, int(positions.shape[0])
        edge_index, vectors, lengths, triples = self._graph(positions, cell, nl)
        t0, t1 = triples[:, 0], triples[:, 1]
        cos = torch.sum(vectors[t0] * vectors[t1], dim=1) / (lengths[t0] * lengths[t1])
        cos = torch.clamp(cos, min=-1.0 + 1e-7, max=1.0 - 1e-7)   # as MatterSim: acos stays finite
        z = numbers.as_subclass(torch.Tensor).long()
        onehot = torch.nn.functional.one_hot(z, num_classes=self.max_z + 1).to(self.dtype)
        atom_attr = net.atom_embedding(onehot)
        edge_zero = net.rbf(lengths.view(-1))
        edge_attr = net.edge_encoder(edge_zero)
        basis = net.sbf(lengths[t1].view(-1), torch.acos(cos))
        n_edges = int(edge_index.shape[1])
        counts = torch.bincount(t0, minlength=n_edges)
        sizes = dict(total_num_atoms=n, total_num_bonds=n_edges, three_body_edge_map=t0) if self.block_sizes else {}
        _LOCAL.edge_map = t0
        try:
            for block in net.graph_conv:
                atom_attr, edge_attr = block(atom_attr, edge_attr, edge_zero, edge_index, basis, triples,
                                             lengths.unsqueeze(-1), counts.new_tensor([n_edges]), counts,
                                             counts.new_tensor([n]), **sizes)
        finally:
            _LOCAL.edge_map = None
        energies = net.normalizer(net.final(atom_attr).view(-1), z)
        counted = getattr(nl, "n_counted", None)   # a part (domain/subdomains.py): its own rows alone
        if counted is not None:
            return {"energy": energies[:counted].sum(), "energies": energies.reshape(n)}
        system = torch.zeros(n, dtype=torch.int64, device=energies.device)
        energy = positions.new_zeros(1, dtype=energies.dtype).index_add_(0, system, energies)
        return {"energy": energy.reshape(()), "energies": energies.reshape(n)}


def factory(*, checkpoint: str | None = None, dtype: str | None = None, trust_pickle: bool = False,
            random: bool = False, num_blocks: int = 4, units: int = 128, max_l: int = 4, max_n: int = 4,
            cutoff: float = 5.0, threebody_cutoff: float = 4.0, seed: int = 0, scale: float = 1.0,
            shift=None, precision: torch.dtype = torch.float64, device="cpu"):
    """MatterSim via mattersim (models/mattersim.py): ``checkpoint`` a file ``Potential.save``
    wrote (or a pretrained name already downloaded); ``random=true``: MatterSim's M3GNet with
    random weights (``num_blocks``, ``units``, ``max_l``, ``max_n``, ``cutoff`` and
    ``threebody_cutoff`` in Å, defaults M3Gnet's own, MatterSim v1's size; ``seed``, energy
    ``scale`` and per-element ``shift`` in eV);
    ``dtype`` float32|float64 (default: the run's precision)."""
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"model.dtype={dtype!r}: give float32 or float64 (or leave it out: the run's precision)")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    if random:
        from ase.data import atomic_numbers

        shifts = {atomic_numbers.get(k, k): v for k, v in dict(shift or {}).items()}
        return MatterSimModel(None, dtype=dt, device=device,
                              random=dict(num_blocks=int(num_blocks), units=int(units), max_l=int(max_l),
                                          max_n=int(max_n), cutoff=float(cutoff),
                                          threebody_cutoff=float(threebody_cutoff), seed=int(seed),
                                          scale=float(scale), shift=shifts))
    if checkpoint is None:
        raise ValueError("model=mattersim needs model.checkpoint=FILE.pth (a MatterSim checkpoint, Potential.save) "
                         "or model.random=true")
    return MatterSimModel(checkpoint, dtype=dt, device=device, trust_pickle=trust_pickle is True)


__all__ = ["INSTALL", "SPEC_MATTERSIM", "MatterSimModel", "factory", "import_mattersim", "load_checkpoint_dict",
           "message_scatter", "three_body_indices"]
