"""Warp initialisation and torch <-> Warp array views (no copies).

One place decides how Warp is started (quietly, once) and how torch tensors are
viewed as Warp arrays, so every kernel module shares the same conventions:

- float32 tensors map to ``wp.float32`` / ``wp.vec3f`` / ``wp.mat33f``,
  float64 tensors to ``wp.float64`` / ``wp.vec3d`` / ``wp.mat33d``;
- a torch device ``cpu`` maps to Warp's ``cpu``, ``cuda:k`` to ``cuda:k``.
"""
from __future__ import annotations

import os

import torch

_initialised = False


def init_warp():
    """Import and initialise Warp once, quietly; return the ``warp`` module."""
    global _initialised
    import warp as wp

    if not _initialised:
        if not os.environ.get("SHARDMD_WARP_VERBOSE"):
            # warp >= 1.10 has log_level; older releases have config.quiet
            if hasattr(wp.config, "log_level"):
                wp.config.log_level = getattr(wp, "LOG_WARNING", 30)
            else:
                wp.config.quiet = True
        _init_hiding_driver_warning(wp)
        _initialised = True
    return wp


def _init_hiding_driver_warning(wp) -> None:
    """``wp.init()``, dropping the native "no CUDA driver" warning on CPU-only machines."""
    import sys
    import tempfile

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        wp.init()
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            wp.init()
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    kept = [ln for ln in text.splitlines() if "CUDA driver" not in ln]
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")


def wp_device(t: torch.Tensor) -> str:
    """Warp device string for the device of tensor ``t``."""
    if t.device.type == "cuda":
        return f"cuda:{t.device.index if t.device.index is not None else torch.cuda.current_device()}"
    return "cpu"


def scalar_type(dtype: torch.dtype):
    """Warp scalar type for a torch floating dtype."""
    wp = init_warp()
    if dtype == torch.float64:
        return wp.float64
    if dtype == torch.float32:
        return wp.float32
    raise TypeError(f"unsupported floating dtype {dtype}: use torch.float32 or torch.float64")


def vec3_type(dtype: torch.dtype):
    wp = init_warp()
    return wp.vec3d if dtype == torch.float64 else wp.vec3f


def mat33_type(dtype: torch.dtype):
    wp = init_warp()
    return wp.mat33d if dtype == torch.float64 else wp.mat33f


def as_vec3(t: torch.Tensor):
    """View a contiguous ``(n, 3)`` float tensor as a Warp ``vec3`` array (shared memory)."""
    wp = init_warp()
    return wp.from_torch(t.contiguous(), dtype=vec3_type(t.dtype))


def as_mat33(t: torch.Tensor):
    """View a contiguous ``(n, 3, 3)`` float tensor as a Warp ``mat33`` array (shared memory)."""
    wp = init_warp()
    return wp.from_torch(t.contiguous(), dtype=mat33_type(t.dtype))


def as_vec3i(t: torch.Tensor):
    """View a contiguous ``(n, 3)`` int32 tensor as a Warp ``vec3i`` array (shared memory)."""
    wp = init_warp()
    return wp.from_torch(t.contiguous(), dtype=wp.vec3i)


def as_array(t: torch.Tensor):
    """View a contiguous 1-d tensor as a Warp array of its own scalar type (shared memory)."""
    wp = init_warp()
    return wp.from_torch(t.contiguous())


def retarget(cmd, index: int, t: torch.Tensor, like: torch.Tensor) -> None:
    """Point array argument ``index`` of a recorded launch (``wp.launch(..., record_cmd=True)``)
    at tensor ``t``, where it pointed at ``like``: the packed array struct copied with ``t``'s
    address (~1 us), instead of wrapping ``t`` and packing it again (``from_torch`` and Warp's
    pack, ~10-20 us; a small CPU step re-points a few arrays a step). ``t`` must have ``like``'s
    shape, dtype and strides (then the struct's other fields are ``t``'s), else it is wrapped;
    the caller keeps ``t`` alive while the launch may run, as it did ``like``."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)
    if set_ctype is None or t.shape != like.shape or t.dtype != like.dtype or t.stride() != like.stride():
        cmd.set_param_at_index(index, _wrap_like(cmd, index, t))
        return
    packed = cmd.params[index + 1]
    c = type(packed).from_buffer_copy(packed)
    c.data = t.data_ptr()
    set_ctype(index, c)


def _wrap_like(cmd, index: int, t: torch.Tensor):
    """``t`` wrapped as the Warp array type of the launch's argument ``index``."""
    wp = init_warp()
    return wp.from_torch(t, dtype=cmd.kernel.adj.args[index].type.dtype)   # strided as it is: an output stays t


_overloads: dict = {}


def launch_generic(kernel, dtype: torch.dtype, dim: int, device: str, inputs: list) -> None:
    """``wp.launch`` of a kernel generic over the float type, with its concrete overload for
    ``dtype`` resolved once: Warp infers a generic kernel's argument types and looks the
    overload up at every launch (~50-100 us of Python on the CPU, a sizeable part of a small
    system's neighbour build). The inputs' types must follow from ``dtype`` alone."""
    wp = init_warp()
    key = (kernel, dtype)
    concrete = _overloads.get(key)
    if concrete is None:
        concrete = _overloads[key] = kernel.add_overload(kernel.infer_argument_types(inputs))
    wp.launch(concrete, dim=dim, device=device, inputs=inputs)
