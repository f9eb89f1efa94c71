"""The terms of ``model=sum``: each term's node completed from its model's schema, as
``model=<name>`` would give it (its defaults, its keys' types), before the terms are built.

``model.terms=[{name: lj}, {name: coulomb, method: pme}]`` names each term and the keys it
changes; a term of a registered or ``py:`` model (no schema here) is passed to its factory as
written, as ``model=<name> model.<key>=...`` is.
"""
from __future__ import annotations

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from shardmd.engine.config.choices import MODELS, Custom
from shardmd.engine.errors import UserError


def with_term_defaults(node: dict) -> dict:
    """``node`` (the model node as a plain dict) with every term of a sum completed; other
    models unchanged.  UserError (one line) for a key a term's model does not have."""
    if node.get("name") != "sum":
        return node
    terms = []
    for k, term in enumerate(node.get("terms") or []):
        cls = MODELS.get(term.get("name")) if isinstance(term, dict) else None
        if cls is None or cls is Custom:
            terms.append(term)
            continue
        base = OmegaConf.structured(cls)
        unknown = sorted(set(term) - set(base.keys()))
        if unknown:
            keys = ", ".join(k2 for k2 in base.keys() if k2 != "name")
            raise UserError(f"model.terms[{k}]: {unknown[0]} is not a key of model={term['name']} (its keys: "
                            f"{keys}); correct the term")
        try:
            merged = OmegaConf.merge(base, term)
        except OmegaConfBaseException as exc:
            raise UserError(f"model.terms[{k}] ({term['name']}): {' '.join(str(exc).split()[:12])}; correct the "
                            "value") from None
        terms.append(OmegaConf.to_container(merged))
    return {**node, "terms": terms}
