"""The inputs a model declares beyond positions, cell, pbc and numbers (docs/byo.md, "The contract").

A model names them in its ``model_config`` (``shardmd.domain.api.ModelConfig``):
``point_inputs`` (per-atom, e.g. ``("charges",)``) and ``system_inputs`` (per-system, e.g.
``("charge", "spin")``), and receives each as a keyword argument of ``compute``.  The engine
supplies only the names a model declares (a model that declares none is called as before):

- per-atom ``charges`` (e): ``system.charges`` (a map by element, or one value per atom in the
  file's order) if given, else the structure file's ``initial_charges`` array (ASE's extxyz
  column; a ``charges`` column, which ASE reads as calculator results, also serves); any other
  per-atom name ``X``: the file's array ``X``; failing both, the model's ``default_input(name,
  numbers)`` where it has one (model=coulomb: its ``model.charges`` table), else a one-line error;
- per-system ``charge`` (total charge, e): ``system.charge``, else the file's ``charge`` info
  entry, else 0; ``spin`` (multiplicity 2S+1): ``system.spin``, else the file's ``spin``, else
  1; any other per-system name ``X``: the file's info entry ``X``.

They live in the State (``inputs``, ``system_inputs``): per-atom ones move with their atoms
(migration, sorting), reach ghosts as copies of their owners' values (the forward halo
exchange in ``DistributedModel``) and are written to checkpoints, from which a restart takes
them bit for bit (``system.*`` describes the starting system only, as ``system.file`` does).
Every value is checked before the first step: finite, one row per atom.
"""
from __future__ import annotations

import numpy as np
import torch

from shardmd.engine.errors import CollectiveError, UserError
from shardmd.engine.run.state import INPUT, State

#: per-atom inputs known by name: (the file's arrays holding them, in order of preference)
POINT_FILE_ARRAYS = {"charges": ("initial_charges", "charges")}
#: per-system inputs known by name: default value when neither the config nor the file gives one
SYSTEM_DEFAULTS = {"charge": 0.0, "spin": 1.0}
#: config keys under ``system`` that give inputs by name
CONFIG_KEYS = ("charges", "charge", "spin")


def declared(dmodel) -> tuple[tuple, tuple]:
    """(per-atom names, per-system names) the wrapped model declares."""
    return tuple(getattr(dmodel, "point_inputs", ())), tuple(getattr(dmodel, "system_inputs", ()))


def _model_name(dmodel) -> str:
    return type(getattr(dmodel, "model", dmodel)).__name__


def _config_value(cfg, name: str):
    """``system.<name>`` as plain Python (None: not set, or no such key)."""
    from omegaconf import OmegaConf

    if name not in CONFIG_KEYS or "system" not in cfg or cfg.system.get(name) is None:
        return None
    v = cfg.system[name]
    return OmegaConf.to_container(v) if OmegaConf.is_config(v) else v


def _file_array(atoms, name: str):
    """The per-atom array ``name`` of ``atoms`` (its arrays, then its calculator's results), else None."""
    if atoms is None:
        return None
    for key in POINT_FILE_ARRAYS.get(name, (name,)):
        if key in atoms.arrays:
            return atoms.arrays[key]
        results = getattr(getattr(atoms, "calc", None), "results", None) or {}
        if key in results:
            return results[key]
    return None


def _source(cfg, atoms) -> str:
    if "system" not in cfg:   # the ASE calculator: an Atoms object, no configuration
        return "the Atoms object"
    f = cfg.system.get("file")
    return f"system.file={str(f)!r}" if f and atoms is not None else "the starting system"


def _model_default(dmodel, name: str, numbers):
    """``model.default_input(name, numbers)``: the values a model uses for an input it declares
    when neither the config nor the structure gives them (None: it has none, the input is required)."""
    fn = getattr(getattr(dmodel, "model", dmodel), "default_input", None)
    if fn is None:
        return None
    try:
        v = fn(name, np.asarray(numbers))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return None if v is None else np.asarray(v, dtype=np.float64)


def per_atom_values(cfg, name: str, atoms, numbers, dmodel) -> np.ndarray:
    """(n,) or (n, F) values of the per-atom input ``name`` for atoms of atomic ``numbers``
    ((n,), id order); one-line UserError when neither the config nor the structure gives them."""
    given = _config_value(cfg, name)
    n = len(numbers)
    if isinstance(given, dict):
        from ase.data import chemical_symbols

        symbols = [chemical_symbols[int(z)] for z in np.asarray(numbers).tolist()]
        missing = sorted({s for s in symbols if s not in given})
        if missing:
            raise UserError(f"system.{name} gives no value for {', '.join(missing)} (the system holds "
                            f"{', '.join(sorted(set(symbols)))}); add {missing[0]} to the map")
        return np.asarray([given[s] for s in symbols], dtype=np.float64)
    if isinstance(given, (list, tuple)):
        if len(given) != n:
            raise UserError(f"system.{name} has {len(given)} values but the system holds {n} atoms; give one "
                            f"per atom (in the file's order) or a map by element, e.g. {{Na: 1.0, Cl: -1.0}}")
        return np.asarray(given, dtype=np.float64)
    arr = _file_array(atoms, name)
    if arr is None:   # the model's own default (model=coulomb: its element table), if it has one
        arr = _model_default(dmodel, name, numbers)
    if arr is None:
        names = POINT_FILE_ARRAYS.get(name, (name,))
        arrays = names[0] + "".join(f" (or {k})" for k in names[1:])
        key = (f"set system.{name}={{Na: 1.0, Cl: -1.0}} (by element) or " if name in CONFIG_KEYS and "system" in cfg
               else "")
        raise UserError(f"model {_model_name(dmodel)} takes per-atom {name} and {_source(cfg, atoms)} has no "
                        f"{arrays} array; {key}add that array to the {'structure file' if key else 'atoms'}")
    try:
        a = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise UserError(f"{_source(cfg, atoms)}: its {name} array is not numbers; give numbers") from None
    return a


def per_system_value(cfg, name: str, atoms, dmodel) -> np.ndarray:
    """(1, *F) value of the per-system input ``name``."""
    given = _config_value(cfg, name)
    if given is None and atoms is not None and name in atoms.info:
        given = atoms.info[name]
        try:
            given = np.asarray(given, dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError(f"{_source(cfg, atoms)}: its {name} entry {str(atoms.info[name])[:40]!r} is not a "
                            f"number; correct it or set system.{name}") from None
    if given is None:
        if name not in SYSTEM_DEFAULTS:
            raise UserError(f"model {_model_name(dmodel)} takes the per-system input {name} and "
                            f"{_source(cfg, atoms)} has no {name} entry (info); add it to the structure file")
        given = SYSTEM_DEFAULTS[name]
    v = np.asarray(given, dtype=np.float64)
    return v.reshape(1) if v.ndim == 0 else v.reshape(1, *v.shape)


def complete(cfg, state: State, dmodel, atoms=None) -> State:
    """``state`` with every input the model declares (those it holds already, from a checkpoint
    or the API, are kept; the others from the config and ``atoms``, the structure it was built
    from), each checked: finite, one row per atom.  Inputs the model does not declare are dropped."""
    points, systems = declared(dmodel)
    kept = {k: v for k, v in state.inputs.items() if k in points}
    for name in points:
        if name not in kept:
            kept[name] = torch.as_tensor(per_atom_values(cfg, name, atoms, state.numbers.cpu().numpy(), dmodel),
                                         dtype=state.dtype, device=state.device)
    sys_kept = {k: v for k, v in state.system_inputs.items() if k in systems}
    for name in systems:
        if name not in sys_kept:
            sys_kept[name] = torch.as_tensor(per_system_value(cfg, name, atoms, dmodel), dtype=state.dtype,
                                             device=state.device)
    state.inputs = {k: v.to(dtype=state.dtype, device=state.device).contiguous() for k, v in kept.items()}
    state.system_inputs = {k: v.to(dtype=state.dtype, device=state.device).contiguous() for k, v in sys_kept.items()}
    check(state, _source(cfg, atoms))
    return state


def of_atoms(atoms, dmodel) -> dict:
    """{name: numpy array} of every input ``dmodel`` declares, from ``ase.Atoms`` alone (its
    arrays and info; the ASE calculator's inputs): per-atom (n, *F), per-system (1, *F)."""
    points, systems = declared(dmodel)
    out = {name: per_atom_values({}, name, atoms, atoms.numbers, dmodel) for name in points}
    out.update({name: per_system_value({}, name, atoms, dmodel) for name in systems})
    return out


def check(state: State, where: str) -> None:
    """Refuse (collectively: every rank holds the same starting state) per-atom inputs without
    one row per atom, and non-finite values."""
    n = state.n_atoms
    ids = state.ids.cpu()
    for name, v in state.inputs.items():
        if v.dim() == 0 or v.shape[0] != n:
            rows = v.shape[0] if v.dim() else 0
            raise CollectiveError(f"{where}: per-atom {name} has {rows} values for {n} atoms; give one per atom")
        bad = ~torch.isfinite(v.reshape(n, -1)).all(dim=1).cpu()
        if bool(bad.any()):
            i = int(ids[bad].min())
            raise CollectiveError(f"{where}: {name} of atom id {i} is {v[ids == i].flatten()[0].item():g} "
                                  f"(not finite); give finite {name}")
    for name, v in state.system_inputs.items():
        if v.dim() == 0 or v.shape[0] != 1:
            raise CollectiveError(f"{where}: the per-system {name} has shape {tuple(v.shape)}; give one value "
                                  "per system, (1, *F)")
        if not bool(torch.isfinite(v).all()):
            raise CollectiveError(f"{where}: the per-system {name} is not finite; give a finite value "
                                  f"(system.{name})")


def extras(state: State) -> dict | None:
    """The inputs of a model call (``DistributedModel.compute(..., extras=)``): per-atom ones with
    this rank's owned rows, per-system ones; None when the model declares none (the call unchanged)."""
    if not state.inputs and not state.system_inputs:
        return None
    return {**state.inputs, **state.system_inputs}


def gathered(state: State) -> dict:
    """Per-atom inputs as extra arrays of a gather (``RankDomain.gather(extra=)``), ``input:<name>``."""
    return {INPUT + k: v for k, v in state.inputs.items()}


def for_checkpoint(full: dict, state: State) -> dict:
    """{"atoms": {name: (n, *F) id order}, "system": {name: (1, *F)}} (numpy) for a checkpoint:
    the per-atom ones out of a gather's ``full`` arrays; empty when the model declares none."""
    atoms = {k[len(INPUT):]: v for k, v in full.items() if k.startswith(INPUT)}
    system = {k: v.detach().cpu().numpy() for k, v in state.system_inputs.items()}
    return {"atoms": atoms, "system": system} if atoms or system else {}
