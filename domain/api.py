"""The model-facing surface of ShardMD's distribution layer: import from here only.

    from shardmd.domain.api import ShardTensor, MLIPSpec, SPEC_MPNN_HALO, OpAdapter, ScatterOutputs

See docs/distributed.md for the mechanism and the bring-your-own-model workflow.
"""
from . import handlers as _handlers  # noqa: F401  (registers the built-in handlers)
from .adapters import (AdapterScope, AllReduceSum, GatherInputs, GatherInputsFull, MethodAdapter, OpAdapter,
                       PythonAdapter, ReverseOutputs, ScatterOutputs, SliceOutputsOwned, SliceOwned, Transform,
                       TransformError)
from .collectives import all_reduce_sum, all_to_all_v
from .distributed_model import DistributedModel, ModelConfig, NeighborConfig, StorageIdNeighborList
from .runtime import Scope, current_scope, scatter_to_owners, system_sum, to_local
from .shard_tensor import (GroupConfig, HaloMeta, ShardMeta, ShardTensor, dispatch_trace, register_handler,
                           registered_handlers, shard_like, unregister_handler)
from .spec import (PRESETS, SPEC_MPNN_HALO, SPEC_MPNN_SHARDED, SPEC_PAIR_HALO, DistributionSpec, HaloStorage,
                   MLIPSpec, OutputKind, ShardedStorage, SpecLoadError)


def trace_and_validate(*args, **kwargs):
    """See :func:`shardmd.domain.validate.trace_and_validate` (imported lazily)."""
    from .validate import trace_and_validate as _tv

    return _tv(*args, **kwargs)


__all__ = [
    "AdapterScope", "AllReduceSum", "DistributedModel", "DistributionSpec", "GatherInputs", "GatherInputsFull",
    "GroupConfig", "HaloMeta", "HaloStorage", "MLIPSpec", "MethodAdapter", "ModelConfig", "NeighborConfig",
    "OpAdapter", "OutputKind", "PRESETS", "PythonAdapter", "ReverseOutputs", "SPEC_MPNN_HALO", "SPEC_MPNN_SHARDED",
    "SPEC_PAIR_HALO", "ScatterOutputs", "Scope", "ShardMeta", "ShardTensor", "ShardedStorage", "SliceOutputsOwned",
    "SliceOwned", "SpecLoadError", "StorageIdNeighborList", "Transform", "TransformError", "all_reduce_sum",
    "all_to_all_v", "current_scope", "dispatch_trace", "register_handler", "registered_handlers",
    "scatter_to_owners", "shard_like", "system_sum", "to_local", "trace_and_validate", "unregister_handler",
]
