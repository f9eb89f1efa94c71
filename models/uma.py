"""UMA (fairchem-core's eSCN-MD backbone with a mixture of linear experts, unmodified) behind the
model contract, on any number of domains.

UMA is a message-passing network on one cutoff graph: an edge-degree embedding, then
``num_layers`` blocks, each summing edge messages onto their target atom (``index_add`` into a
fresh node tensor) followed by per-atom layers; a per-atom energy MLP.  Its linear layers are
mixtures of experts whose coefficients come from the **whole system**: the mean of a
per-element composition embedding over all atoms, and the system's charge, spin and task
(``csd_embedding``), through a routing MLP and softmax.

Route to decomposition, and why: **our edges, with a per-layer halo refresh**.  The engine's
list (receiver-owned, query rows = the owned atoms, one cutoff of ghosts) becomes fairchem's
external graph (``otf_graph=False``: ``edge_index = [source j, target i]``, vectors
``x_j + S @ cell - x_i``), so each owned atom's messages are complete; a ghost row's sum is not
(its own neighbours are not all here), so after the edge-degree embedding and after each block
but the last the ghost rows are re-copied from their owners (``refresh_halo``: one forward
exchange; its backward sends the ghosts' gradients to their owners).  That needs a halo one
cutoff deep instead of ``num_layers`` cutoffs (a wide halo of 4 x 6 Å would hold several
times the owned atoms).  The wrapper therefore runs the backbone's ``forward`` steps itself on
fairchem's own submodules (:meth:`UMAModel.compute`), with three changes: the composition mean
is a whole-system sum over the owned atoms of every rank (``system_sum``: ghosts dropped,
summed over ranks), so every domain mixes its experts with the same coefficients; the charge
and spin channel balancing, where a model has it, uses the same sums; and the per-atom
energies are summed per system into ``positions.new_zeros(1)``, the per-system scatter the
``system_reduce`` handler sums over ranks (ghost rows dropped).  Energies are fairchem's
predictor's: ``E = rmsd * sum_i e_i + mean + sum_i ref[Z_i]`` of the task's normaliser and
element references (the mean spread as ``mean / N`` per atom).  Forces ``-dE/dx`` and the
virial ``-dE/d strain`` come from DistributedModel's autograd; fairchem's own
``FAIRChemCalculator`` on the same file is the reference (:meth:`UMAModel.ase_calculator`).

Units: Å, eV.  Shapes: positions (n_padded, 3) Å, cell (3, 3) Å, numbers (n_padded,); energy
() eV, energies (n_padded,) eV (owned rows kept by the spec).  Precision: the run's (UMA runs in
float64 as in float32; fairchem builds its buffers at the precision, and so does this wrapper).

Tasks (``model.task``): the datasets the checkpoint has heads for (UMA: omat, omol, oc20, odac,
omc).  ``omol`` takes the total charge (e) and spin multiplicity from the engine
(``system.charge``, ``system.spin`` or the structure file's info, as fairchem reads
``atoms.info``); the other tasks use fairchem's defaults for them (charge 0, spin 0).  An atom
with more than the model's ``max_neighbors`` neighbours within the cutoff is refused (fairchem
would drop the farthest; UMA's 300 at 6 Å is far above condensed matter's ~100).
"""
from __future__ import annotations

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

from .contract import refuse_unknown_species
from .edge_memory import edge_bytes
from .files import file_sha256
from .uma_files import INSTALL, build, import_fairchem, read_checkpoint, read_tasks, resolve

#: tasks that take the system's charge and spin (fairchem's ``validate_uma_atoms_data``)
CHARGED_TASKS = ("omol",)

SPEC_UMA = SPEC_MPNN_HALO.replace(
    name="uma-halo-refresh",
    description="UMA (eSCN-MD + MoLE): our edges, ghost rows refreshed from their owners after every message-passing "
                "layer (refresh_halo), whole-system composition for the expert coefficients (system_sum), per-atom "
                "energies summed per system, autograd forces and virial",
    output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "energies": OutputKind.PER_NODE,
                  "virial": OutputKind.PER_GRAPH},
).with_storage(HaloStorage("gather"))   # every sum fairchem does is onto plain tensors; refreshes are explicit


class UMAModel:
    """A UMA inference checkpoint on the halo scheme, through ``SPEC_UMA``.

    checkpoint: a file fairchem wrote (``MLIPInferenceCheckpoint``) or a pretrained name already
    in the Hugging Face cache; task: the dataset head to run; dtype, device: how and where;
    trust_pickle: unpickle the file freely (its classes are still checked)."""

    name = "uma"
    distribution_spec = SPEC_UMA

    def __init__(self, checkpoint: str, task: str | None = None, dtype=torch.float64, device="cpu",
                 trust_pickle: bool = False, edge_chunk: int | str = "auto"):
        import_fairchem()
        self.dtype, self.device = dtype, torch.device(device)
        self.label = f"model.checkpoint={checkpoint}"
        self.path = resolve(str(checkpoint))
        cp = read_checkpoint(self.path, self.label, trust_pickle=trust_pickle is True)
        self.tasks = read_tasks(cp.tasks_config, self.label)
        if not self.tasks:
            raise ValueError(f"{self.label}: the checkpoint has no energy task")
        if task is None:
            if len(self.tasks) > 1:
                raise ValueError(f"model=uma needs model.task=<{'|'.join(sorted(self.tasks))}> (the checkpoint has "
                                 "several tasks)")
            task = next(iter(self.tasks))
        if task not in self.tasks:
            raise ValueError(f"model.task={task}: this UMA has no such task; its tasks: "
                             f"{', '.join(sorted(self.tasks))}")
        self.task = str(task)
        self.rmsd, self.mean, refs = self.tasks[self.task]
        self.hydra = build(cp, self.label, dtype).to(self.device)
        self.backbone = bb = self.hydra.backbone
        self.head = self._energy_head()
        self.edge_chunk = _edge_chunk(edge_chunk, self.device)
        for m in self.hydra.modules():   # fairchem's own chunked recomputation (its "batch" inference setting)
            if hasattr(m, "activation_checkpoint_chunk_size"):
                m.activation_checkpoint_chunk_size = self.edge_chunk
        self.cutoff = float(bb.cutoff)
        #: device bytes per list edge for the memory check (models/edge_memory.py): by channels x layers,
        #: with the recomputation's figure where it is on
        size = int(bb.sphere_channels) * len(bb.blocks)
        self.bytes_per_edge = edge_bytes(131_000 if self.edge_chunk is None else 7_580, size, 128 * 4, dtype)
        self.max_neighbors = int(bb.max_neighbors)
        n_z = int(bb.max_num_elements)
        self.refs = (refs if refs is not None else torch.zeros(n_z, dtype=torch.float64)).to(self.device, dtype)
        self.known = list(range(1, min(n_z, len(self.refs))))
        self.include_self = getattr(bb, "model_id", None) == "UMA-S-1.2"   # fairchem's 1.2 composition mean
        charged = self.task in CHARGED_TASKS
        self.model_config = ModelConfig(outputs=("energy", "energies", "forces", "virial"),
                                        autograd_outputs={"forces": "energy"}, strain_outputs={"virial": "energy"},
                                        neighbors=NeighborConfig(self.cutoff),
                                        system_inputs=("charge", "spin") if charged else ())

    def _energy_head(self):
        """The head wrapper whose datasets include the task (its MLP_EFS_Head's energy MLP is run)."""
        for head in self.hydra.output_heads.values():
            if self.task in getattr(head, "dataset_names", ()):
                return head
        raise ValueError(f"{self.label}: no head predicts task {self.task}'s energy")

    def identity(self) -> str:
        """SHA-256 of the checkpoint file."""
        return file_sha256(self.path)

    def check_species(self, numbers) -> None:
        refuse_unknown_species(numbers, self.known, self.label, "UMA embeds atomic numbers "
                               f"1..{self.known[-1]} only")

    def ase_calculator(self, **settings):
        """fairchem's own ``FAIRChemCalculator`` on the same file (its predictor, its graph, its
        autograd forces and stress), at this model's precision: the single-process reference.
        Its predictor unpickles the file (``weights_only=False``): for files you trust."""
        import warnings

        from fairchem.core import FAIRChemCalculator
        from fairchem.core.units.mlip_unit.api.inference import InferenceSettings
        from fairchem.core.units.mlip_unit.predict import MLIPPredictUnit

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = InferenceSettings(base_precision_dtype=self.dtype, **settings)
            return FAIRChemCalculator(MLIPPredictUnit(str(self.path), device=str(self.device), inference_settings=s),
                                      task_name=self.task)

    # -- the call ---------------------------------------------------------------------------------
    def _graph(self, positions, cell, nl):
        """fairchem's external graph from our list: edge_index (2, n_edges) [source j, target i],
        vectors (n_edges, 3) Å ``x_j + S @ cell - x_i`` and lengths (n_edges,) Å, edges within the
        cutoff (the list reaches cutoff + skin)."""
        i, j = nl.centers(), nl.neighbors.long()
        shift = nl.shifts.to(positions.dtype) @ cell.as_subclass(torch.Tensor)
        with torch.no_grad():
            x = positions.detach()
            r = torch.linalg.vector_norm(x[j] + shift - x[i], dim=1)
            keep = torch.nonzero(r <= self.cutoff).squeeze(1)
            counts = torch.bincount(i[keep], minlength=1)
        if counts.numel() and int(counts.max()) > self.max_neighbors:
            raise ValueError(f"{self.label}: an atom has {int(counts.max())} neighbours within {self.cutoff} Å, more "
                             f"than the model's max_neighbors={self.max_neighbors}, which fairchem would truncate")
        i, j, shift = i[keep], j[keep], shift[keep]
        vectors = positions[j] + shift - positions[i]
        return torch.stack([j, i]), vectors, torch.linalg.norm(vectors, dim=-1)

    def _wigner(self, vectors: torch.Tensor):
        """(wigner, wigner_inv) of each edge, as ``eSCNMDBackbone._get_rotmat_and_wigner`` with
        the roll angle about the edge 0 instead of fairchem's random draw (the energy does not
        depend on it: SO(2) equivariance).  A random roll would change the last bits of every
        evaluation (no bit-exact restart) and consume the process's random stream."""
        bb = self.backbone
        zero = vectors.new_zeros(vectors.shape[0])
        if bb.use_quaternion_wigner:
            from fairchem.core.models.uma.common.quaternion.wigner_d_hybrid import axis_angle_wigner_hybrid

            w = bb.wigner_data
            return axis_angle_wigner_hybrid(vectors, bb.lmax, gamma=zero, coeffs=w.coeffs, U_blocks=w.U_blocks,
                                            custom_kernels=w.custom_kernels,
                                            compact_l2=getattr(bb.backend, "supports_fused_edgewise", False))
        from fairchem.core.models.uma.common.rotation import eulers_to_wigner, init_edge_rot_euler_angles

        with torch.random.fork_rng():   # its roll draw, discarded
            _, beta, alpha = init_edge_rot_euler_angles(vectors)
        jd = [getattr(bb, f"Jd_{k}").type(vectors.dtype) for k in range(bb.lmax + 1)]
        wigner = eulers_to_wigner((zero, beta, alpha), 0, bb.lmax, jd)
        return wigner, torch.transpose(wigner, 1, 2).contiguous()

    def _set_experts(self, z: torch.Tensor, csd: torch.Tensor) -> None:
        """The backbone's expert coefficients from the whole system: the composition mean over
        every rank's owned atoms (``system_sum``), then fairchem's routing MLP and norm."""
        bb = self.backbone
        if not getattr(bb, "num_experts", 0):
            return
        parts = []
        if bb.use_composition_embedding:
            by_atom = bb.composition_embedding(z)                          # (n_padded, C)
            system = torch.zeros(len(z), dtype=torch.int64, device=z.device)
            total = system_sum(by_atom, system)                            # (1, C), owned rows of all ranks
            count = system_sum(torch.ones_like(by_atom[:, :1]), system)    # (1, 1): N
            parts.append(total / (count + 1.0 if self.include_self else count))
        parts.append(csd)
        coefficients = bb.routing_mlp(torch.cat(parts, dim=1))
        norm = bb.mole_expert_coefficient_norm(bb.mole_dropout(coefficients))
        bb.global_mole_tensors.expert_mixing_coefficients = norm

    def _balance(self, x, charge, spin, n_total):
        """fairchem's charge/spin channel balancing, its per-system sums over all ranks."""
        bb = self.backbone
        for start, end, target in ((bb.charge_channel_start, bb.charge_channel_end, charge),
                                   (bb.spin_channel_start, bb.spin_channel_end, spin - 1.0)):
            if end > start:
                channels = x[:, 0, start:end]
                sums = system_sum(channels, torch.zeros(len(x), dtype=torch.int64, device=x.device))
                x = x.clone()
                x[:, 0, start:end] = channels - (sums - target.to(x.dtype).unsqueeze(1)) / n_total
        return x

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, pbc, numbers: torch.Tensor, nl,
                charge: torch.Tensor | None = None, spin: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """positions: (n_padded, 3) Å (a ShardTensor under DistributedModel); nl: query rows = the
        owned atoms; charge, spin: (1,) the total charge (e) and multiplicity (omol only).
        eSCNMDBackbone.forward's steps on its own submodules, ghost rows refreshed between layers.
        Returns energy () eV (summed over ranks by the per-system scatter) and energies
        (n_padded,) eV (owned rows kept by the spec)."""
        bb, n = self.backbone, int(positions.shape[0])
        z = numbers.as_subclass(torch.Tensor).long()
        dev = z.device
        q = torch.zeros(1, dtype=torch.int64, device=dev) if charge is None else \
            torch.round(charge.as_subclass(torch.Tensor).reshape(1)).long()
        s = torch.zeros(1, dtype=torch.int64, device=dev) if spin is None else \
            torch.round(spin.as_subclass(torch.Tensor).reshape(1)).long()
        batch = torch.zeros(n, dtype=torch.int64, device=dev)
        edge_index, vectors, lengths = self._graph(positions, cell, nl)
        vectors, lengths = vectors.as_subclass(torch.Tensor), lengths.as_subclass(torch.Tensor)
        csd = bb.csd_embedding(charge=q, spin=s, dataset=[self.task])     # (1, C)
        self._set_experts(z, csd)
        wigner, wigner_inv = self._wigner(vectors)
        wigner, wigner_inv = bb.backend.prepare_wigner(wigner, wigner_inv, bb.mappingReduced,
                                                       bb.coefficient_index if bb.mmax != bb.lmax else None)
        x = torch.zeros(n, bb.sph_feature_size, bb.sphere_channels, dtype=self.dtype, device=dev)
        x[:, 0, :] = bb.sphere_embedding(z)
        sys_node = csd[batch]
        x[:, 0, :] = x[:, 0, :] + sys_node
        bb.set_MOLE_sizes(nsystems=1, batch_full=batch, edge_index=edge_index)
        envelope = bb.envelope(lengths / bb.cutoff).reshape(-1, 1)
        x_edge = torch.cat((bb.distance_expansion(lengths), bb.source_embedding(z[edge_index[0]]),
                            bb.target_embedding(z[edge_index[1]])), dim=1)
        wigner_env = wigner_inv * (envelope.unsqueeze(-1) if wigner_inv.ndim == 3 else envelope)
        x = bb.edge_degree_embedding(x, x_edge, edge_index[1], wigner_env)
        x = refresh_halo(x).as_subclass(torch.Tensor)   # a ghost's own edges are not here: its owner's rows
        balanced = bb.charge_channel_end > bb.charge_channel_start or bb.spin_channel_end > bb.spin_channel_start
        n_total = system_sum(torch.ones(n, 1, dtype=self.dtype, device=dev), batch) if balanced else None
        x_edges = bb.backend.get_layer_radial_emb(x_edge, bb)
        for k, block in enumerate(bb.blocks):
            x = block(x, x_edges[k], edge_index, wigner, wigner_env, total_atoms_across_gp_ranks=n,
                      sys_node_embedding=sys_node, scatter_target=edge_index[1], gp_ctx=None)
            if balanced:
                x = self._balance(x, q, s, n_total)
            if k + 1 < len(bb.blocks):   # the last layer's ghost rows feed nothing the owned atoms read
                x = refresh_halo(x).as_subclass(torch.Tensor)
        x = bb.norm(x)
        energies = self._energies(x[:, 0, :], z, n)
        # accumulated in float64 (a float32 index_add of 10^4 site energies drifts: domain/runtime.py system_sum)
        energy = positions.new_zeros(1, dtype=torch.float64).index_add_(0, batch, energies.double())
        return {"energy": energy.to(energies.dtype).reshape(()), "energies": energies}

    def _energies(self, scalars: torch.Tensor, z: torch.Tensor, n: int) -> torch.Tensor:
        """(n_padded,) eV: the task's energy MLP on the scalar channels (its experts: one-hot of
        the task, as fairchem's head wrapper sets them), denormalised, plus the element
        references and ``mean / N`` (N: the whole system's atom count)."""
        head = self.head
        if hasattr(head, "global_mole_tensors"):
            g = head.global_mole_tensors
            one_hot = torch.zeros(1, len(head.dataset_name_to_exp), dtype=self.dtype, device=scalars.device)
            one_hot[0, head.dataset_name_to_exp[self.task]] = 1.0
            g.expert_mixing_coefficients, g.mole_sizes, g.natoms = one_hot, torch.tensor([n], dtype=torch.int), n
        e = head.head.energy_block(scalars).view(-1) * self.rmsd + self.refs[z]
        if self.mean:
            count = system_sum(torch.ones(n, 1, dtype=self.dtype, device=scalars.device),
                               torch.zeros(n, dtype=torch.int64, device=scalars.device))
            e = e + self.mean / count.reshape(())
        return e


#: fairchem's edge block for its activation checkpointing (ESCNMD_DEFAULT_EDGE_ACTIVATION_CHECKPOINT_CHUNK_SIZE)
EDGE_CHUNK = 128 * 1024


def _edge_chunk(value, device) -> int | None:
    """``model.edge_chunk``: edges per block whose activations the message-passing layers
    recompute in the backward pass instead of keeping (fairchem's activation checkpointing, the
    setting of its "batch" inference mode and of torch-sim's wrapper); 0: keep them all; auto:
    fairchem's block on a GPU, where memory bounds the system size (~6x less at 4,000 atoms of a
    UMA-S-sized model, docs/benchmarks.md), none on the CPU, where the recomputation costs time."""
    if value == "auto":
        return EDGE_CHUNK if torch.device(device).type == "cuda" else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"model.edge_chunk={value!r}: give a number of edges (e.g. {EDGE_CHUNK}), 0 to keep every "
                         "activation, or auto")
    return int(value) or None


def factory(*, checkpoint: str | None = None, task: str | None = None, dtype: str | None = None,
            trust_pickle: bool = False, edge_chunk: int | str = "auto", precision: torch.dtype = torch.float64,
            device="cpu"):
    """UMA via fairchem-core (models/uma.py): ``checkpoint`` an inference checkpoint fairchem
    wrote (``.pt``, read as data) or a pretrained name already in the Hugging Face cache
    (``uma-s-1p1``, ...); ``task`` the head to run (omat, omol, oc20, odac, omc: those the file
    has); ``dtype`` float32|float64 (default: the run's precision); ``trust_pickle=true`` to
    unpickle a file the safe loader refuses; ``edge_chunk`` edges per recomputed block (auto:
    fairchem's on a GPU, none on the CPU; 0: none)."""
    if dtype not in (None, "float32", "float64"):
        raise ValueError(f"model.dtype={dtype!r}: give float32 or float64 (or leave it out: the run's precision)")
    if checkpoint is None:
        raise ValueError("model=uma needs model.checkpoint=FILE.pt (a fairchem UMA inference checkpoint) or a "
                         "pretrained name already downloaded (uma-s-1p1, ...)")
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype] if dtype else precision
    return UMAModel(str(checkpoint), task=task, dtype=dt, device=device, trust_pickle=trust_pickle is True,
                    edge_chunk=edge_chunk)


__all__ = ["INSTALL", "SPEC_UMA", "UMAModel", "factory"]
