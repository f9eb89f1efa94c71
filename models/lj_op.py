"""The Lennard-Jones model as a ``torch.library.custom_op`` declared through an OpAdapter.

``torch.ops.shardmd_lj.lennard_jones`` runs :meth:`LennardJones.compute` (its Warp kernel)
on plain tensors: energy, forces, virial and per-atom energies of the query atoms of a
receiver-owned full list.  Under decomposition the kernel's forces and per-atom energies
of owned atoms are complete (ghosts cover the cutoff); the energy and virial are this
rank's partial sums, so the adapter declares ``AllReduceSum`` on outputs 0 and 2.  With
:data:`SPEC_LJ` (the pair-potential preset plus that adapter) ``DistributedModel`` needs no
``output_kinds``; the results are bit-identical to the direct call.
``shardmd_lj::lennard_jones_forces`` is the same call with the model's ``forces_only`` on
(steps without output, engine/run/simulation.py): NaN energy and virial, so its adapter sums
nothing over ranks (two all-reduces per decomposed step saved); ``lennard_jones_virial``
with ``virial_only`` (npt's steps without output) sums the virial alone.

    model = LennardJonesOp(LennardJones(...))      # or LennardJonesOp.from_config(cfg)
    DistributedModel(model).compute(ctx, positions, numbers, nl)
"""
from __future__ import annotations

import itertools
import weakref

import torch

from shardmd.domain.api import (
    SPEC_PAIR_HALO,
    AllReduceSum,
    ModelConfig,
    NeighborConfig,
    NeighborList,
    OpAdapter,
    defer_dynamo,
)

from .lj import LennardJones

_MODELS: "weakref.WeakValueDictionary[int, LennardJones]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


@torch.library.custom_op("shardmd_lj::lennard_jones", mutates_args=())
def lennard_jones(positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor, offsets: torch.Tensor,
                  neighbors: torch.Tensor, shifts: torch.Tensor, packed: torch.Tensor, cutoff: float, n_points: int,
                  handle: int, half: bool = False,
                  order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(energy (), forces (n_query, 3), virial (3, 3), energies (n_query,)) of the model
    registered under ``handle`` on the CSR list: its packed edges when ``packed`` is not
    empty (``neighbors`` and ``shifts`` are then not read, and may be empty), else the
    arrays (offsets, neighbors, shifts). ``order``: the list's canonical point order
    (``NeighborList.order``; the half list's visit order), None if it has none."""
    return _call(positions, cell, numbers, offsets, neighbors, shifts, packed, cutoff, n_points, handle, half,
                 order, "all")


def _call(positions, cell, numbers, offsets, neighbors, shifts, packed, cutoff, n_points, handle, half, order,
          sums: str):
    """The model's compute with its flags set for ``sums``: 'all', 'virial' (virial_only) or
    'none' (forces_only), restored afterwards."""
    model = _MODELS.get(int(handle))
    if model is None:
        raise RuntimeError(f"shardmd_lj: no LennardJones model registered under handle {handle}")
    if packed.shape[0]:
        nl = NeighborList(offsets=offsets, cutoff=float(cutoff), n_points=int(n_points), packed=packed, half=half,
                         order=order)
    else:
        nl = NeighborList(offsets=offsets, neighbors=neighbors, shifts=shifts, cutoff=float(cutoff),
                          n_points=int(n_points), half=half, order=order)
    kept = model.forces_only, model.virial_only
    model.forces_only, model.virial_only = sums == "none", sums == "virial"
    try:
        out = model.compute(positions, cell, None, numbers, nl)
    finally:
        model.forces_only, model.virial_only = kept
    return out["energy"], out["forces"], out["virial"], out["energies"]


@torch.library.custom_op("shardmd_lj::lennard_jones_forces", mutates_args=())
def lennard_jones_forces(positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor, offsets: torch.Tensor,
                         neighbors: torch.Tensor, shifts: torch.Tensor, packed: torch.Tensor, cutoff: float,
                         n_points: int, handle: int, half: bool = False, order: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`lennard_jones` with the model's ``forces_only`` on (a step whose energy nobody
    reads): the same forces; energy, virial and per-atom energies NaN (the full-list kernel
    ignores the flag and sums them). Its adapter sums nothing over ranks: a decomposed step
    without output pays no all-reduce for them."""
    return _call(positions, cell, numbers, offsets, neighbors, shifts, packed, cutoff, n_points, handle, half,
                 order, "none")


@torch.library.custom_op("shardmd_lj::lennard_jones_virial", mutates_args=())
def lennard_jones_virial(positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor, offsets: torch.Tensor,
                         neighbors: torch.Tensor, shifts: torch.Tensor, packed: torch.Tensor, cutoff: float,
                         n_points: int, handle: int, half: bool = False, order: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`lennard_jones` with the model's ``virial_only`` on (an npt step without output):
    the same forces and virial; energy and per-atom energies NaN. Its adapter sums the virial
    alone over ranks."""
    return _call(positions, cell, numbers, offsets, neighbors, shifts, packed, cutoff, n_points, handle, half,
                 order, "virial")


def _fake(positions, cell, numbers, offsets, neighbors, shifts, packed, cutoff, n_points, handle, half=False,
          order=None):
    """The three ops' output shapes without computing them (tracing, torch.compile)."""
    nq = offsets.shape[0] - 1
    return (positions.new_empty(()), positions.new_empty(nq, 3), positions.new_empty(3, 3), positions.new_empty(nq))


for _op in (lennard_jones, lennard_jones_forces, lennard_jones_virial):
    _op.register_fake(_fake)


OP = torch.ops.shardmd_lj.lennard_jones.default
OP_FORCES = torch.ops.shardmd_lj.lennard_jones_forces.default
OP_VIRIAL = torch.ops.shardmd_lj.lennard_jones_virial.default
defer_dynamo(lennard_jones)   # eager calls import no torch._dynamo (~1.5 s of CPU per process)
defer_dynamo(lennard_jones_forces)
defer_dynamo(lennard_jones_virial)

#: the pair-potential preset with the kernel's adapter: energy and virial summed by the
#: adapter (so not again by the output stage), forces and per-atom energies owned rows
SPEC_LJ = SPEC_PAIR_HALO.replace(name="lj-op", all_reduce_outputs=frozenset()).with_custom_ops(
    OpAdapter(OP, output_transforms={0: AllReduceSum(), 2: AllReduceSum()}, module=__name__),
    OpAdapter(OP_FORCES, module=__name__), OpAdapter(OP_VIRIAL, output_transforms={2: AllReduceSum()}, module=__name__))


class LennardJonesOp:
    """A :class:`LennardJones` model called through the custom op, with :data:`SPEC_LJ`."""

    name = "lj"
    needs_autograd = False

    def __init__(self, lj: LennardJones, spec=SPEC_LJ, direct: bool = False):
        self.lj = lj
        self.handle = next(_ids)
        _MODELS[self.handle] = lj
        self.distribution_spec = spec
        # direct=True (the engine's model=lj): DistributedModel calls the op's body without the
        # op (shardmd.domain.distributed_model, ``direct_call``); the op stays for a spec given
        # elsewhere, the validator and torch.compile
        self.direct_call = _Direct(self) if direct and spec is SPEC_LJ else None
        self.model_config = ModelConfig(outputs=("energy", "forces", "virial", "energies"),
                                        neighbors=NeighborConfig(lj.cutoff, full=not lj.newton))

    @property
    def cutoff(self) -> float:
        return self.lj.cutoff

    @property
    def virial_only(self) -> bool:
        """The model's :attr:`LennardJones.virial_only` (the engine sets it per npt step)."""
        return self.lj.virial_only

    @virial_only.setter
    def virial_only(self, value: bool) -> None:
        self.lj.virial_only = bool(value)

    @property
    def forces_only(self) -> bool:
        """The model's :attr:`LennardJones.forces_only` (the engine sets it per step)."""
        return self.lj.forces_only

    @forces_only.setter
    def forces_only(self, value: bool) -> None:
        self.lj.forces_only = bool(value)

    def check_species(self, numbers) -> None:
        self.lj.check_species(numbers)

    def describe(self) -> str:
        return self.lj.describe() + " via shardmd_lj::lennard_jones"

    def compute(self, positions, cell, pbc, numbers, nl) -> dict:
        op = (lennard_jones_forces if self.lj.forces_only else lennard_jones_virial if self.lj.virial_only
              else lennard_jones)
        e, f, w, es = op(positions, cell, numbers, *_list_args(nl, self.handle))
        return {"energy": e, "forces": f, "virial": w, "energies": es}


_EMPTY: dict = {}


def _empty_arrays(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(0,) and (0, 3) int32 on ``offsets``' device, made once per device (nothing reads or
    writes an empty array: sharing them between calls is safe, and two fewer tensors a step)."""
    kept = _EMPTY.get(offsets.device)
    if kept is None:
        kept = _EMPTY[offsets.device] = (offsets.new_zeros(0), offsets.new_zeros(0, 3))
    return kept


def _list_args(nl, handle: int) -> tuple:
    """The op's arguments after ``numbers``, in its order: the list's, the model's ``handle``, the
    list's half flag and order."""
    packed = getattr(nl, "packed", None)
    if packed is not None and packed.shape[0]:   # the kernel reads these alone: never unpack
        neighbors, shifts = _empty_arrays(nl.offsets)
    else:
        packed = nl.offsets.new_zeros(0, dtype=torch.int64)
        neighbors, shifts = nl.neighbors, nl.shifts
    return (nl.offsets, neighbors, shifts, packed, float(nl.cutoff), int(nl.n_points), handle,
            bool(getattr(nl, "half", False)), getattr(nl, "order", None))


class _Direct:
    """:class:`LennardJonesOp`'s call without the op: the op's body (``_call``) on the same
    arguments, so the same bits, with the op adapters' reductions as output kinds (energy and
    virial summed over ranks, unless this call skipped them; forces and per-atom energies the
    owned rows the kernel completes)."""

    output_kinds = {"energy": "per_system", "virial": "per_system", "forces": "per_point", "energies": "per_point"}

    def __init__(self, op: LennardJonesOp):
        self.op = op   # a cycle, so that a deep copy of the op model points its copy here at the copy

    @property
    def skipped_outputs(self) -> frozenset:
        lj = self.op.lj
        if lj.forces_only:
            return frozenset(("energy", "virial", "energies"))
        return frozenset(("energy", "energies")) if lj.virial_only else frozenset()

    def compute(self, positions, cell, pbc, numbers, nl) -> dict:
        lj = self.op.lj
        sums = "none" if lj.forces_only else "virial" if lj.virial_only else "all"
        e, f, w, es = _call(positions, cell, numbers, *_list_args(nl, self.op.handle), sums)
        return {"energy": e, "forces": f, "virial": w, "energies": es}


__all__ = ["LennardJonesOp", "OP", "OP_FORCES", "OP_VIRIAL", "SPEC_LJ", "lennard_jones", "lennard_jones_forces",
           "lennard_jones_virial"]
