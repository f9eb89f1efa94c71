"""The Warp kernels of integrators/fused.py (its docstring says what each replaces and why the
bits are the same).  Imported on first use only: loading this module initialises Warp.

Layout: per-atom rows are ``vec3d`` arrays (one address per row, not three: ~1.7x faster than
2-d indexing on the CPU); every scalar a kernel needs comes in one float64 array ``p`` (the last argument) (its
entries named where the kernel reads them, integers held exactly), read once per chunk, so
that a step changes array contents, never the launch's packed arguments; each thread walks a
chunk of ``CHUNK`` atoms (integrators/fused.py fills ``p`` and launches)."""
from __future__ import annotations

from .fused_common import CHUNK, warp

wp = warp()
f64 = wp.float64
rows = wp.array(dtype=wp.vec3d)
vec12l = wp.types.vector(length=12, dtype=wp.int64)


@wp.func_native("return fma(a, b, c);")
def fma(a: f64, b: f64, c: f64) -> f64:   # a * b + c, one rounding (torch's add with alpha)
    ...


@wp.func
def span(t: int, n: int):
    # the atoms of chunk t: [t CHUNK, min(t CHUNK + CHUNK, n))
    return t * CHUNK, wp.min(t * CHUNK + CHUNK, n)


@wp.func
def press(v: wp.vec3d, fac: wp.vec3d, od: wp.vec3d, mdthalf: f64, tri: int):
    # npt.py's _v_press on one atom: v *= f; (tri) vx += ((vy od5 + vz od4) (-dthalf)),
    # vy += (vz (-dthalf)) od3; v *= f   (od: omega_dot yz xz xy, Voigt 3 4 5)
    vx = v[0] * fac[0]
    vy = v[1] * fac[1]
    vz = v[2] * fac[2]
    if tri != 0:
        a = vy * od[2]
        b = vz * od[1]
        a = a + b
        a = a * mdthalf
        vx = vx + a
        a = vz * mdthalf
        a = a * od[0]
        vy = vy + a
    return wp.vec3d(vx * fac[0], vy * fac[1], vz * fac[2])


@wp.func
def vec(p: wp.array(dtype=f64), k: int):
    return wp.vec3d(p[k], p[k + 1], p[k + 2])


@wp.kernel(enable_backward=False)
def v_press(v: rows, p: wp.array(dtype=f64)):
    # p: f (3), od yz xz xy (3), -dthalf, tri, n
    lo, hi = span(wp.tid(), int(p[8]))
    fac = vec(p, 0)
    od = vec(p, 3)
    mdthalf = p[6]
    tri = int(p[7])
    for i in range(lo, hi):
        v[i] = press(v[i], fac, od, mdthalf, tri)


@wp.func
def apply_remap(x: wp.vec3d, r: wp.vec3d, s: wp.vec3d, iso: int):
    # npt.py's remap of one atom: iso x *= e (r[0]); else the lower-triangular product, r the
    # diagonal (m00 m11 m22), s the rest (m10 m20 m21):
    # x.mul_(m00).add_(y, alpha=m10).add_(z, alpha=m20); y.mul_(m11).add_(z, alpha=m21); z.mul_(m22)
    if iso != 0:
        return wp.vec3d(x[0] * r[0], x[1] * r[0], x[2] * r[0])
    return wp.vec3d(fma(s[1], x[2], fma(s[0], x[1], x[0] * r[0])), fma(s[2], x[2], x[1] * r[1]), x[2] * r[2])


@wp.kernel(enable_backward=False)
def remap(x: rows, p: wp.array(dtype=f64)):
    # p: diagonal m00 m11 m22 (3), m10 m20 m21 (3), n
    lo, hi = span(wp.tid(), int(p[6]))
    r = vec(p, 0)
    s = vec(p, 3)
    for i in range(lo, hi):
        x[i] = apply_remap(x[i], r, s, 0)


@wp.func
def words(c: f64, lo_scale: f64):
    h = wp.floor(c)
    return wp.int64(h), wp.int64(wp.rint((c - h) * lo_scale))   # rint: half to even, as torch.round


@wp.func
def add_tensor_words(s: vec12l, v: wp.vec3d, m: f64, lo_scale: f64):
    # the words of (v_a v_b) m, xx yy zz xy xz yz, added to s (high words 0-5, low words 6-11)
    r = s
    h, lo = words((v[0] * v[0]) * m, lo_scale)
    r[0] += h
    r[6] += lo
    h, lo = words((v[1] * v[1]) * m, lo_scale)
    r[1] += h
    r[7] += lo
    h, lo = words((v[2] * v[2]) * m, lo_scale)
    r[2] += h
    r[8] += lo
    h, lo = words((v[0] * v[1]) * m, lo_scale)
    r[3] += h
    r[9] += lo
    h, lo = words((v[0] * v[2]) * m, lo_scale)
    r[4] += h
    r[10] += lo
    h, lo = words((v[1] * v[2]) * m, lo_scale)
    r[5] += h
    r[11] += lo
    return r


@wp.func
def mv2_words(v: wp.vec3d, m: f64, scale: f64, hi_scale: f64, lo_scale: f64):
    # the words of ((m ((vx vx + vy vy) + vz vz)) scale) hi_scale
    a = v[0] * v[0]
    b = v[1] * v[1]
    c = v[2] * v[2]
    x = a + b
    x = x + c
    x = m * x
    x = x * scale
    x = x * hi_scale
    return words(x, lo_scale)


@wp.kernel(enable_backward=False)
def kinetic_tensor(v: rows, m: wp.array(dtype=f64), out: wp.array2d(dtype=wp.int64), p: wp.array(dtype=f64)):
    # exact_kinetic_tensor's words of (v_a v_b) m, xx yy zz xy xz yz, summed over a chunk; p: lo_scale, n
    t = wp.tid()
    lo, hi = span(t, int(p[1]))
    lo_scale = p[0]
    s = vec12l(wp.int64(0))
    for i in range(lo, hi):
        s = add_tensor_words(s, v[i], m[i], lo_scale)
    for k in range(12):
        out[t, k] = s[k]


@wp.kernel(enable_backward=False)
def mv2(v: rows, m: wp.array(dtype=f64), out: wp.array2d(dtype=wp.int64), p: wp.array(dtype=f64)):
    # exact_mv2_sum's columns path: x = ((vx vx + vy vy) + vz vz); x = ((m x) MVV_TO_EV) 2^32; words
    # p: scale, hi_scale, lo_scale, n
    t = wp.tid()
    lo, hi = span(t, int(p[3]))
    scale = p[0]
    hi_scale = p[1]
    lo_scale = p[2]
    sh = wp.int64(0)
    sl = wp.int64(0)
    for i in range(lo, hi):
        h, lw = mv2_words(v[i], m[i], scale, hi_scale, lo_scale)
        sh += h
        sl += lw
    out[t, 0] = sh
    out[t, 1] = sl


# (the whole half steps of npt.py, NVE's and the list check: integrators/fused_native.py)


# -- the barostat's box check (engine/run/rank_domain.py: RankDomain.displacement) -----------------------
@wp.func
def strain_d2(x: wp.vec3d, a: wp.vec3d, t0: wp.vec3d, t1: wp.vec3d, t2: wp.vec3d):
    # |x - a T|^2 (T's rows t0 t1 t2)
    dx = x[0] - (a[0] * t0[0] + a[1] * t1[0] + a[2] * t2[0])
    dy = x[1] - (a[0] * t0[1] + a[1] * t1[1] + a[2] * t2[1])
    dz = x[2] - (a[0] * t0[2] + a[1] * t1[2] + a[2] * t2[2])
    return dx * dx + dy * dy + dz * dz


@wp.kernel(enable_backward=False)
def strain_displacement(x: rows, x0: rows, out: wp.array(dtype=f64), p: wp.array(dtype=f64)):
    # max over a chunk of |x - x0 T|^2; NaN when any is NaN (as torch's amax); p: T's rows (9), NaN, n
    t = wp.tid()
    lo, hi = span(t, int(p[10]))
    t0 = vec(p, 0)
    t1 = vec(p, 3)
    t2 = vec(p, 6)
    m = f64(0.0)
    bad = int(0)
    for i in range(lo, hi):
        d2 = strain_d2(x[i], x0[i], t0, t1, t2)
        if d2 != d2:
            bad = 1
        m = wp.max(m, d2)
    out[t] = wp.where(bad != 0, p[9], m)
