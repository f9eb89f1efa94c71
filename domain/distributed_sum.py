"""A sum of distributed models on one decomposition: each term keeps its own spec, cutoff and
inputs; the outputs are added.

    E = sum_t E_t      F = sum_t F_t      W = sum_t W_t      e_i = sum_t e_i,t

The halo and the neighbour list are the widest term's (its cutoff + the skin). Every other term
gets the list's edges shorter than its own cutoff + the same skin, selected once per list: the
list's positions at a build are those the selection measures, and no point moves more than
skin / 2 before the next build, so the selection is as valid as the list (a short-ranged term
beside a long-ranged one does not pay for the long list).

An output is summed when every term gives it (``energy`` and ``forces`` must be); one that some
term lacks (``virial``, ``energies``) is left out of the sum, as the engine treats a model that
never gives it. Per-point and per-system inputs go to the terms that declare them. Terms whose
declared units of one output differ (``ModelConfig.units``, an unnamed output in ``units``'s
default, the caller's contract) are refused when the sum is made: a sum of eV and kcal/mol is no
energy.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from .distributed_model import DistributedModel

REQUIRED = ("energy", "forces")


def same_unit(a: str, b: str) -> bool:
    """Whether two unit strings name one unit ("eV/Angstrom", "eV/A" and "eV/Å" do)."""
    def norm(unit: str) -> str:
        for old, new in (("Angstrom", "Å"), ("angstrom", "Å"), ("/A", "/Å"), (" ", "")):
            unit = unit.replace(old, new)
        return unit
    return norm(str(a)) == norm(str(b))


class TermsOfSum:
    """What the engine reads of the model itself: the cutoff, the species check, the notes."""

    def __init__(self, wrapped):
        self.terms = [t.model for t in wrapped]
        self.cutoff = max(t.cutoff for t in wrapped)

    def check_species(self, numbers) -> None:
        for m in self.terms:
            if hasattr(m, "check_species"):
                m.check_species(numbers)

    def default_input(self, name: str, numbers):
        """The first term's own default for an input (``default_input``), else None."""
        for m in self.terms:
            fn = getattr(m, "default_input", None)
            v = fn(name, numbers) if fn is not None else None
            if v is not None:
                return v
        return None

    @property
    def notes(self) -> list:
        return [n for m in self.terms for n in (getattr(m, "notes", None) or [])]

    def compute(self, *args, **kwargs):   # the contract's static part (models/contract.py)
        raise TypeError("a sum of models is computed through DistributedSum.compute")


class DistributedSum:
    """terms: the wrapped terms (``DistributedModel``), in the order they are summed."""

    config = None   # a full list for every term (a half list is one term's wish, not the sum's)

    def __init__(self, terms, units: Mapping[str, str] | None = None):
        """units: {output: unit} a term that names none is in (the caller's contract)."""
        if not terms:
            raise ValueError("a sum of models needs at least one term")
        self.terms = [t if isinstance(t, DistributedModel) else DistributedModel(t) for t in terms]
        self._check_units(dict(units or {}))
        self.model = TermsOfSum(self.terms)
        self._lists: dict[int, tuple] = {}
        self.last_raw: dict | None = None

    @property
    def cutoff(self) -> float:
        return max(t.cutoff for t in self.terms)

    def _check_units(self, default: dict) -> None:
        """ValueError (one line) when two terms declare different units for one output."""
        seen: dict[str, tuple[int, str]] = {}
        for k, term in enumerate(self.terms):
            declared = dict(getattr(term.config, "units", None) or {})
            for key in sorted(set(declared) | set(default)):
                unit = declared.get(key, default.get(key))
                if unit is None:
                    continue
                first = seen.setdefault(key, (k, unit))
                if not same_unit(first[1], unit):
                    raise ValueError(f"term {k + 1} of the sum ({type(term.model).__name__}) gives {key} in {unit}, "
                                     f"term {first[0] + 1} in {first[1]}: convert one term so every term gives "
                                     f"{key} in the same unit")

    @property
    def point_inputs(self) -> tuple:
        return tuple(dict.fromkeys(n for t in self.terms for n in t.point_inputs))

    @property
    def system_inputs(self) -> tuple:
        return tuple(dict.fromkeys(n for t in self.terms for n in t.system_inputs))

    def _list_for(self, k: int, term: DistributedModel, positions: torch.Tensor, cell: torch.Tensor, nl):
        """The edges of ``nl`` within ``term``'s cutoff + the skin (``nl`` itself for the widest)."""
        radius = term.cutoff + (float(nl.cutoff) - self.cutoff)
        if radius >= float(nl.cutoff):
            return nl
        cached = self._lists.get(k)
        if cached is not None and cached[0] is nl:
            return cached[1]
        with torch.no_grad():
            x = positions.detach()
            i, j = nl.centers(), nl.neighbors.long()
            r = (x.index_select(0, j) + nl.shift_vectors(cell.to(x.dtype)) - x.index_select(0, i)).norm(dim=1)
            keep = r < radius
            counts = torch.zeros(nl.n_query, dtype=torch.int64, device=keep.device).index_add_(0, i, keep.long())
            offsets = torch.zeros(nl.n_query + 1, dtype=nl.offsets.dtype, device=nl.offsets.device)
            offsets[1:] = torch.cumsum(counts, 0).to(offsets.dtype)
            sub = nl.replace(offsets=offsets, neighbors=nl.neighbors[keep].contiguous(),
                             shifts=nl.shifts[keep].contiguous(), cutoff=radius, packed=None)
        self._lists[k] = (nl, sub)
        return sub

    def compute(self, ctx, positions: torch.Tensor, numbers: torch.Tensor, nl,
                extras: Mapping[str, torch.Tensor] | None = None) -> dict:
        """The terms' outputs summed (``DistributedModel.compute``'s contract)."""
        total: dict | None = None
        for k, term in enumerate(self.terms):
            names = set(term.point_inputs) | set(term.system_inputs)
            mine = {n: v for n, v in (extras or {}).items() if n in names} or None
            out = term.compute(ctx, positions, numbers, self._list_for(k, term, positions, ctx.cell, nl), mine)
            missing = [key for key in REQUIRED if out.get(key) is None]
            if missing:
                raise ValueError(f"term {k + 1} of the sum ({type(term.model).__name__}) gives no "
                                 f"{', '.join(missing)}; every term must give energy and forces")
            if total is None:
                total = {key: v for key, v in out.items() if isinstance(v, torch.Tensor)}
                continue
            if out["forces"].dtype != total["forces"].dtype:
                raise ValueError(f"term {k + 1} of the sum ({type(term.model).__name__}) computes in "
                                 f"{out['forces'].dtype}, the terms before it in {total['forces'].dtype}: give "
                                 "every term the same precision")
            total = {key: v + out[key] for key, v in total.items()
                     if isinstance(out.get(key), torch.Tensor) and out[key].shape == v.shape}
        self.last_raw = total
        return total
