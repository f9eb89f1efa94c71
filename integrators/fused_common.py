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


def retarget(cmd, index: int, t, same_layout: bool) -> None:
    """Point array argument ``index`` of a recorded launch at tensor ``t``: where it has the
    layout (shape, dtype and strides) of the array there before (``same_layout``), the packed
    struct copied with ``t``'s address, not ``t`` wrapped and packed again. The same as
    shardmd.domain.warp_setup's re-pointing (its docstrings say why), which this layer may not
    import. The launch keeps no reference to ``t``."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)
    if set_ctype is None or not same_layout:
        cmd.set_param_at_index(index, warp().from_torch(t, dtype=cmd.kernel.adj.args[index].type.dtype))
        bare(cmd, index)
        return
    packed = cmd.params[index + 1]
    c = type(packed).from_buffer_copy(packed)
    c.data = t.data_ptr()
    set_ctype(index, c)


def bare(cmd, index: int) -> None:
    """Argument ``index`` of a recorded launch as its packed struct alone: the launch keeps the
    Warp array it was given (for Warp's graph capture), and that array references its tensor."""
    set_ctype = getattr(cmd, "set_param_at_index_from_ctype", None)
    if set_ctype is not None:
        set_ctype(index, type(cmd.params[index + 1]).from_buffer_copy(cmd.params[index + 1]))
