"""``malloc=keep``: glibc's allocator told to keep the memory a CPU run frees, for the next step
(why and the measurements: docs/design.md, "The CPU allocator"). Large blocks come from the heap
instead of a fresh mmap each (``M_MMAP_MAX`` 0), the heap is not trimmed below 2 GiB and grows
by 1 GiB at a time. Process-wide and once per process (every rank sets its own); nothing is set
where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
_SET: list[bool] = []


def keep_freed_memory() -> bool:
    """Set glibc's options (module docstring) once per process; False where they cannot be set."""
    if _SET:
        return _SET[0]
    ok = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        ok = all(mallopt(k, v) == 1 for k, v in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1),
                                                 (M_TOP_PAD, 2**30)))
    except (OSError, AttributeError):   # not glibc (musl, macOS): nothing to set
        ok = False
    _SET.append(ok)
    return ok


__all__ = ["keep_freed_memory"]
