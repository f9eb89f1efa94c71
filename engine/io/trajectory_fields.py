"""Per-atom model outputs in trajectory frames: ``trajectory.fields=[position, energies]``.

The trajectory field ``energy`` (``energies`` is accepted for it, the key the models return)
holds each atom's potential energy, (n,) per frame in eV; the run gathers it from the model's
``out["energies"]`` (owned rows, the state's memory order) with the frame's other arrays.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md_units import FIELD_ALIASES

#: trajectory field -> the model's output key (also ``H5MDWriter.write_frame``'s keyword)
MODEL_FIELDS = {"energy": "energies"}


def model_outputs(results: Mapping[str, Any], fields: Iterable[str], model: Any) -> dict[str, Any]:
    """{output key: (n_owned,) tensor} of the per-atom model outputs ``fields`` asks for (for
    ``RankDomain.gather(extra=)``).  A model that does not return one: one-line UserError
    (exit status 2) naming the model and the field; every rank raises it alike."""
    out = {}
    for f in fields:
        key = MODEL_FIELDS.get(FIELD_ALIASES.get(f, f))
        if key is None:
            continue
        value = results.get(key)
        if value is None:
            name = getattr(model, "name", None) or type(model).__name__
            raise UserError(f"trajectory.fields has {f!r} but model {name!r} returns no per-atom {key!r} "
                            f"(out[{key!r}], (n,) eV); drop {f} from trajectory.fields or use a model that "
                            "returns them")
        out[key] = value
    return out
