"""Warp initialisation and torch <-> Warp array views (no copies).

One place decides how Warp is started (quietly, once) and how torch tensors are
viewed as Warp arrays, so every kernel module shares the same conventions:

- float32 tensors map to ``wp.float32`` / ``wp.vec3f`` / ``wp.mat33f``,
  float64 tensors to ``wp.float64`` / ``wp.vec3d`` / ``wp.mat33d``;
- a torch device ``cpu`` maps to Warp's ``cpu``, ``cuda:k`` to ``cuda:k``.
"""
from __future__ import annotations

import ctypes
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
    _repoint(cmd, index, t, t.shape == like.shape and t.dtype == like.dtype and t.stride() == like.stride())


def _repoint(cmd, index: int, t: torch.Tensor, same_layout: bool) -> None:
    """:func:`retarget` told whether ``t`` has the layout of the array there before; either way
    the launch keeps no reference to ``t`` (:func:`_bare`)."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)   # (not in older Warp)
    if set_ctype is None or not same_layout:
        cmd.set_param_at_index(index, _wrap_like(cmd, index, t))
        _bare(cmd, index)
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
    init_warp().launch(_concrete(kernel, dtype, inputs), dim=dim, device=device, inputs=inputs)


def _concrete(kernel, dtype: torch.dtype, inputs: list):
    """The overload of generic ``kernel`` for ``dtype``, inferred from ``inputs`` (Warp values) once."""
    key = (kernel, dtype)
    concrete = _overloads.get(key)
    if concrete is None:
        concrete = _overloads[key] = kernel.add_overload(kernel.infer_argument_types(inputs))
    return concrete


def as_view(t: torch.Tensor):
    """``t`` as the Warp array its shape names: (n,) scalars, (n, 3) vec3 (float) or vec3i
    (int32), (k, 3, 3) mat33: the domain's kernels' array arguments."""
    if t.dim() == 1:
        return as_array(t)
    if t.dim() == 2 and t.shape[1] == 3:
        return as_vec3i(t) if t.dtype == torch.int32 else as_vec3(t)
    if t.dim() == 3 and tuple(t.shape[1:]) == (3, 3):
        return as_mat33(t)
    raise TypeError(f"no Warp view for a tensor of shape {tuple(t.shape)} and {t.dtype}")


def as_views(args: list) -> list:
    """``args`` with every tensor replaced by its :func:`as_view`."""
    return [as_view(a) if torch.is_tensor(a) else a for a in args]


def _same_value(a, b) -> bool:
    """Whether two non-array arguments pack the same: Python numbers, Warp vectors (ctypes
    arrays: their bytes, ~0.3 us where Warp's own comparison takes ~5) and Warp scalars
    (``.value``); anything else counts as changed."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (bool, int, float)):
        return a == b
    if isinstance(a, ctypes.Array):
        return bytes(a) == bytes(b)
    return hasattr(a, "value") and a.value == b.value


class KeptLaunch:
    """One call site's CPU launches of a kernel generic over the float type, recorded once
    (Warp's ``record_cmd``) and replayed: a later call re-points the array arguments whose
    tensor has another address (~1 us each: the packed array struct copied with the new
    address; wrapped again only when the shape or strides changed), sets the values that
    changed and the launch size, instead of wrapping every tensor (``from_torch``, ~10-20 us
    each) and packing every argument again; ~0.2-0.4 ms a call for a neighbour build's
    kernels, several a build. Inputs: as :func:`launch_generic`'s, with every array argument
    given as its torch tensor (viewed by its shape: :func:`as_view`).

    No tensor is held between calls (a module's launch would otherwise keep the last build's
    arrays, its edge list among them, alive after its simulation is gone): each argument's
    address, shape, strides and dtype are kept, and a CPU launch has finished when the call
    returns. A new tensor at the old address with the old layout needs nothing set: the
    packed pointer is its own."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.cmd = None
        self.held: list = []   # per argument: (address, shape, strides, dtype) of a tensor, else the value
        self.sig = None
        self.dim = None

    def __call__(self, dtype: torch.dtype, dim: int, device: str, inputs: list) -> None:
        if device != "cpu":
            raise ValueError(f"KeptLaunch replays CPU launches only (got device {device!r})")
        inputs = [a.contiguous() if torch.is_tensor(a) else a for a in inputs]   # a strided input: copied
        sig = (dtype, tuple(torch.is_tensor(a) for a in inputs))
        cmd = self.cmd
        if cmd is None or sig != self.sig:
            wrapped = as_views(inputs)
            cmd = self.cmd = init_warp().launch(_concrete(self.kernel, dtype, wrapped), dim=dim, device=device,
                                                inputs=wrapped, record_cmd=True)
            self.held, self.sig, self.dim = [_layout(a) if torch.is_tensor(a) else a for a in inputs], sig, dim
            cmd.launch()
            for i, a in enumerate(inputs):
                if torch.is_tensor(a):
                    _bare(cmd, i)
            return
        if dim != self.dim:
            cmd.set_dim(dim)
            self.dim = dim
        held = self.held
        for i, a in enumerate(inputs):
            h = held[i]
            if torch.is_tensor(a):
                lay = _layout(a)
                if lay != h:
                    _repoint(cmd, i, a, same_layout=lay[1:] == h[1:])
                    held[i] = lay
            elif a is not h and not _same_value(a, h):
                cmd.set_param_at_index(i, a)
                held[i] = a
        cmd.launch()   # ``inputs`` (this call's tensors, copies included) alive until it returns


def _bare(cmd, i: int) -> None:
    """Argument i of a recorded launch as its packed struct alone: the launch keeps the Warp
    array it was given (for Warp's graph capture), and that array references its tensor."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)
    if set_ctype is not None:
        set_ctype(i, type(cmd.params[i + 1]).from_buffer_copy(cmd.params[i + 1]))


def _layout(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
