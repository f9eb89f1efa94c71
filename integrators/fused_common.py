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
