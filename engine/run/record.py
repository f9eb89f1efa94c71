"""What a run stores of its configuration and model: the record the trajectory and the
checkpoints hold, the model identity a checkpoint names, the integrator state it keeps.

Values the configuration took from interpolations (``${oc.env:VAR}`` and any other ``${...}``)
are stored as their expressions, never resolved, with salted digests of the physics keys'
resolved values for the restart's comparison (engine/config/expressions.py).  The resolved
record (``stored=False``) is what a restart compares; it is never written.
"""
from __future__ import annotations

import json

from omegaconf import DictConfig

from shardmd.engine.config.compose import to_container
from shardmd.engine.config.expressions import (
    DIGESTS_KEY,
    digests,
    expression_paths,
    new_salt,
    redact_origin,
    redact_state,
    stored_config,
    stored_identity,
)
from shardmd.engine.io.checkpoint import PHYSICS_KEYS, model_identity_of


class RunRecord:
    """The stored forms of one run's configuration ``cfg`` and model ``origin``
    (``models.registry.model_origin`` or ``checkpoint.api_model_origin``).  One salt per run:
    the digests are computed once (scrypt, ~0.1 s each) and every checkpoint repeats them."""

    def __init__(self, cfg: DictConfig, origin: dict):
        self.cfg, self.origin = cfg, origin
        self.paths = expression_paths(cfg)
        #: the model node's expressions, by path below ``model`` (none for a model object)
        self.model_paths = {} if origin.get("api") else \
            {p[len("model."):]: e for p, e in self.paths.items() if p.startswith("model.")}
        self.stored_origin = redact_origin(origin, self.model_paths, to_container(cfg.model)) \
            if self.model_paths else origin
        self._salt = new_salt()
        self._digests: dict | None = None
        #: what the run is: ``md``, or ``minimize`` (stored as the key ``run``; MD's store none)
        self.kind = "md"

    def config(self, stored: bool = True) -> dict:
        """The configuration as the trajectory and checkpoint store it: expressions kept, the
        ``model`` node naming a model given as an object (its route ``api:<class>``, cutoff and
        tensor hash), ``model_identity`` (the model's origin as JSON) and, where a physics key
        holds an expression, ``resolved_digests``, and ``run`` for a minimisation; ``stored=False``:
        everything resolved (what a restart compares; never written)."""
        rec = stored_config(self.cfg) if stored else to_container(self.cfg)
        if self.origin.get("api"):
            rec["model"] = {"name": self.origin["route"], "cutoff": self.origin["cutoff"],
                            "tensors_sha256": self.origin["tensors_sha256"]}
        if self.kind != "md":
            rec["run"] = self.kind
        rec["model_identity"] = json.dumps(self.stored_origin if stored else self.origin, sort_keys=True, default=str)
        if stored and self.paths:
            if self._digests is None:
                self._digests = digests(self.config(stored=False), self.paths, PHYSICS_KEYS, self._salt)
            if self._digests:
                rec[DIGESTS_KEY] = self._digests
        return rec

    def identity(self) -> str:
        """The model identity a checkpoint stores: ``model_identity_of`` the origin, as a salted
        digest where the model node holds an expression (``expressions.identity_matches``)."""
        identity = model_identity_of(self.origin)
        return stored_identity(identity, self._salt) if self.model_paths else identity

    @property
    def model_name(self) -> str:
        return str(self.stored_origin["route"])

    def integrator_state(self, state: dict) -> dict:
        """An integrator state without the echoes of config values written as expressions."""
        return redact_state(state, self.paths)

    def shown(self, key: str, value) -> str:
        """``value`` of the config key ``key`` (dotted) as the log shows it: its expression
        where it was written as one."""
        return self.paths.get(key, str(value))

    def origin_line(self) -> str:
        """The model's origin in one line for the log (expressions as written)."""
        from shardmd.models.registry import origin_text

        return origin_text(self.stored_origin)
