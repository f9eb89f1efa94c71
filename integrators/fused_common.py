"""What integrators/fused.py and its kernels (integrators/fused_kernels.py) share: the chunk
of atoms per partial sum, and Warp, loaded quietly on first use. Its own module so that the
kernels need not import the module that imports them."""
from __future__ import annotations

CHUNK = 4096   # atoms per partial sum of the fixed-point words

_wp = None     # the warp module once loaded; False when it cannot be


def warp():
    """Warp, initialised quietly (the engine has usually done it already); None without it."""
    global _wp
    if _wp is None:
        try:
            import warp as wp
        except ImportError:
            _wp = False
            return None
        if hasattr(wp.config, "log_level"):
            wp.config.log_level = getattr(wp, "LOG_WARNING", 30)
        else:
            wp.config.quiet = True
        wp.init()
        _wp = wp
    return _wp or None


def retarget(cmd, index: int, t, like) -> None:
    """Point array argument ``index`` of a recorded launch at tensor ``t`` where it pointed at
    ``like`` (same shape, dtype and strides): the packed struct copied with ``t``'s address,
    not ``t`` wrapped and packed again. The same as shardmd.domain.warp_setup.retarget (its
    docstring says why), which this layer may not import."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)
    if set_ctype is None or t.shape != like.shape or t.dtype != like.dtype or t.stride() != like.stride():
        cmd.set_param_at_index(index, warp().from_torch(t, dtype=cmd.kernel.adj.args[index].type.dtype))
        return
    packed = cmd.params[index + 1]
    c = type(packed).from_buffer_copy(packed)
    c.data = t.data_ptr()
    set_ctype(index, c)

