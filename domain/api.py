"""The model-facing surface of ShardMD's distribution layer: import from here only.

    from shardmd.domain.api import ShardTensor, MLIPSpec, SPEC_MPNN_HALO, OpAdapter, ScatterOutputs

See docs/distributed.md for the mechanism and the bring-your-own-model workflow.
"""
from . import handlers as _handlers  # noqa: F401  (registers the built-in handlers)
from .adapters import (
    AdapterScope,
    AllReduceSum,
    GatherInputs,
    GatherInputsFull,
    JitAdapter,
    MethodAdapter,
    OpAdapter,
    PythonAdapter,
    ReverseOutputs,
    ScatterOutputs,
    SliceOutputsOwned,
    SliceOwned,
    Transform,
    TransformError,
)
from .collectives import all_reduce_sum, all_to_all_v
from .compile_policy import CompilePolicy, GraphPadder
from .distributed_model import DistributedModel, ModelConfig, NeighborConfig, StorageIdNeighborList
from .distributed_sum import DistributedSum, same_unit
from .graphed_call import GraphedCall
from .neighbor_kernels import ZERO_SHIFT, packed_neighbor, packed_shift_code, shift_of_code
from .neighbors import NeighborList
from .runtime import Scope, current_scope, grad_leaf, refresh_halo, scatter_to_owners, seed_once, system_sum, to_local
from .shard_tensor import (
    GroupConfig,
    HaloMeta,
    ShardMeta,
    ShardTensor,
    defer_dynamo,
    dispatch_trace,
    register_handler,
    registered_handlers,
    shard_like,
    unregister_handler,
)
from .spec import (
    PRESETS,
    SPEC_MPNN_HALO,
    SPEC_MPNN_SHARDED,
    SPEC_PAIR_HALO,
    DistributionSpec,
    HaloStorage,
    MLIPSpec,
    OutputKind,
    ShardedStorage,
    SpecImportRefused,
    SpecLoadError,
)
from .warp_setup import as_array, as_mat33, as_vec3, as_vec3i, init_warp, retarget, scalar_type, wp_device

# Model-vocabulary names of the intent helpers (the mechanism keeps neutral names in
# runtime.py; see docs/distributed.md, "Intent helpers").
refresh_neighbors = refresh_halo      # halo rows re-copied from their owners (forward exchange)
autograd_target = grad_leaf           # the autograd leaf behind the promoted positions / inputs
current_dd_context = current_scope    # the active Scope (counts, storage, spec, compile policy)


def trace_and_validate(*args, **kwargs):
    """See :func:`shardmd.domain.validate.trace_and_validate` (imported lazily)."""
    from .validate import trace_and_validate as _tv

    return _tv(*args, **kwargs)


__all__ = [
    "AdapterScope", "AllReduceSum", "CompilePolicy", "DistributedModel", "DistributedSum", "DistributionSpec",
    "GatherInputs",
    "GatherInputsFull", "GraphPadder", "GraphedCall", "GroupConfig", "HaloMeta", "HaloStorage", "JitAdapter",
    "MLIPSpec", "MethodAdapter", "ModelConfig", "NeighborConfig", "OpAdapter", "OutputKind", "PRESETS",
    "PythonAdapter",
    "ReverseOutputs", "SPEC_MPNN_HALO", "SPEC_MPNN_SHARDED", "SPEC_PAIR_HALO", "ScatterOutputs", "Scope", "ShardMeta",
    "ShardTensor", "ShardedStorage", "SliceOutputsOwned", "SliceOwned", "SpecImportRefused", "SpecLoadError",
    "StorageIdNeighborList",
    "Transform", "TransformError", "all_reduce_sum", "all_to_all_v", "autograd_target", "current_dd_context",
    "current_scope", "defer_dynamo", "dispatch_trace", "grad_leaf", "refresh_halo", "refresh_neighbors",
    "register_handler",
    "registered_handlers", "same_unit", "scatter_to_owners", "seed_once", "shard_like", "system_sum", "to_local",
    "trace_and_validate",
    "unregister_handler",
    # The spatial machinery a model's own kernels build on (a Warp pair kernel reads the packed
    # neighbour list; the LJ model is written this way), re-exported so that models never import
    # domain internals (tests/test_contracts.py enforces it).
    "NeighborList", "ZERO_SHIFT", "as_array", "as_mat33", "as_vec3", "as_vec3i", "init_warp", "packed_neighbor",
    "packed_shift_code", "retarget", "scalar_type", "shift_of_code", "wp_device",
]
