"""The Warp kernels of integrators/fused.py (its docstring says what each replaces and why the
bits are the same).  Imported on first use only: loading this module initialises Warp."""
from __future__ import annotations

from .fused_common import CHUNK, warp

wp = warp()
f64 = wp.float64


@wp.func_native("return fma(a, b, c);")
def fma(a: f64, b: f64, c: f64) -> f64:   # a * b + c, one rounding (torch's add with alpha)
    ...


@wp.kernel(enable_backward=False)
def v_press(v: wp.array2d(dtype=f64), f0: f64, f1: f64, f2: f64, od3: f64, od4: f64, od5: f64,
            mdthalf: f64, tri: int):
    # npt.py's _v_press: v *= f; (tri) vx += ((vy od5 + vz od4) (-dthalf)), vy += (vz (-dthalf)) od3; v *= f
    i = wp.tid()
    vx = v[i, 0] * f0
    vy = v[i, 1] * f1
    vz = v[i, 2] * f2
    if tri != 0:
        a = vy * od5
        b = vz * od4
        a = a + b
        a = a * mdthalf
        vx = vx + a
        a = vz * mdthalf
        a = a * od3
        vy = vy + a
    v[i, 0] = vx * f0
    v[i, 1] = vy * f1
    v[i, 2] = vz * f2


@wp.kernel(enable_backward=False)
def remap(x: wp.array2d(dtype=f64), m00: f64, m10: f64, m20: f64, m11: f64, m21: f64, m22: f64):
    # npt.py's x.mul_(m00).add_(y, alpha=m10).add_(z, alpha=m20); y.mul_(m11).add_(z, alpha=m21); z.mul_(m22)
    i = wp.tid()
    a = x[i, 0]
    b = x[i, 1]
    c = x[i, 2]
    x[i, 0] = fma(m20, c, fma(m10, b, a * m00))
    x[i, 1] = fma(m21, c, b * m11)
    x[i, 2] = c * m22


@wp.func
def words(c: f64, lo_scale: f64):
    h = wp.floor(c)
    return wp.int64(h), wp.int64(wp.rint((c - h) * lo_scale))   # rint: half to even, as torch.round


vec12l = wp.types.vector(length=12, dtype=wp.int64)


@wp.func
def add_tensor_words(s: vec12l, vx: f64, vy: f64, vz: f64, m: f64, lo_scale: f64):
    # the words of (v_a v_b) m, xx yy zz xy xz yz, added to s (high words 0-5, low words 6-11)
    r = s
    h, lo = words((vx * vx) * m, lo_scale)
    r[0] += h
    r[6] += lo
    h, lo = words((vy * vy) * m, lo_scale)
    r[1] += h
    r[7] += lo
    h, lo = words((vz * vz) * m, lo_scale)
    r[2] += h
    r[8] += lo
    h, lo = words((vx * vy) * m, lo_scale)
    r[3] += h
    r[9] += lo
    h, lo = words((vx * vz) * m, lo_scale)
    r[4] += h
    r[10] += lo
    h, lo = words((vy * vz) * m, lo_scale)
    r[5] += h
    r[11] += lo
    return r


@wp.func
def mv2_words(vx: f64, vy: f64, vz: f64, m: f64, scale: f64, hi_scale: f64, lo_scale: f64):
    # the words of ((m ((vx vx + vy vy) + vz vz)) scale) hi_scale
    a = vx * vx
    b = vy * vy
    c = vz * vz
    x = a + b
    x = x + c
    x = m * x
    x = x * scale
    x = x * hi_scale
    return words(x, lo_scale)


@wp.kernel(enable_backward=False)
def kinetic_tensor(v: wp.array2d(dtype=f64), m: wp.array(dtype=f64), n: int, lo_scale: f64,
                   out: wp.array2d(dtype=wp.int64)):
    # exact_kinetic_tensor's words of (v_a v_b) m, xx yy zz xy xz yz, summed over a chunk
    t = wp.tid()
    s = vec12l(wp.int64(0))
    for i in range(t * CHUNK, wp.min(t * CHUNK + CHUNK, n)):
        s = add_tensor_words(s, v[i, 0], v[i, 1], v[i, 2], m[i], lo_scale)
    for k in range(12):
        out[t, k] = s[k]


@wp.kernel(enable_backward=False)
def mv2(v: wp.array2d(dtype=f64), m: wp.array(dtype=f64), n: int, scale: f64, hi_scale: f64,
        lo_scale: f64, out: wp.array2d(dtype=wp.int64)):
    # exact_mv2_sum's columns path: x = ((vx vx + vy vy) + vz vz); x = ((m x) MVV_TO_EV) 2^32; words
    t = wp.tid()
    sh = wp.int64(0)
    sl = wp.int64(0)
    for i in range(t * CHUNK, wp.min(t * CHUNK + CHUNK, n)):
        h, lo = mv2_words(v[i, 0], v[i, 1], v[i, 2], m[i], scale, hi_scale, lo_scale)
        sh += h
        sl += lo
    out[t, 0] = sh
    out[t, 1] = sl


# -- whole half steps of npt.py (the same operations as its torch path, in its order) ----------------
@wp.func
def press(vx: f64, vy: f64, vz: f64, fac: wp.vec3d, od: wp.vec3d, mdthalf: f64, tri: int):
    # _v_press on one atom (od: omega_dot yz xz xy, Voigt 3 4 5)
    vx = vx * fac[0]
    vy = vy * fac[1]
    vz = vz * fac[2]
    if tri != 0:
        a = vy * od[2]
        b = vz * od[1]
        a = a + b
        a = a * mdthalf
        vx = vx + a
        a = vz * mdthalf
        a = a * od[0]
        vy = vy + a
    return vx * fac[0], vy * fac[1], vz * fac[2]


@wp.func
def kick(v: f64, f: f64, m: f64, alpha: f64):
    # velocities.add_(forces / masses[:, None], alpha=alpha): the quotient rounded, then fma
    q = f / m
    return fma(alpha, q, v)


@wp.kernel(enable_backward=False)
def press_kick(v: wp.array2d(dtype=f64), f: wp.array2d(dtype=f64), m: wp.array(dtype=f64), fac: wp.vec3d,
               od: wp.vec3d, mdthalf: f64, tri: int, alpha: f64):
    # first_half: _v_press, then the half kick
    i = wp.tid()
    vx, vy, vz = press(v[i, 0], v[i, 1], v[i, 2], fac, od, mdthalf, tri)
    mi = m[i]
    v[i, 0] = kick(vx, f[i, 0], mi, alpha)
    v[i, 1] = kick(vy, f[i, 1], mi, alpha)
    v[i, 2] = kick(vz, f[i, 2], mi, alpha)


@wp.func
def apply_remap(a: f64, b: f64, c: f64, r: wp.vec3d, s: wp.vec3d, iso: int):
    # npt.py's remap of one atom: iso x *= e (r[0]); else the lower-triangular product, r the
    # diagonal (m00 m11 m22), s the rest (m10 m20 m21)
    if iso != 0:
        return a * r[0], b * r[0], c * r[0]
    return fma(s[1], c, fma(s[0], b, a * r[0])), fma(s[2], c, b * r[1]), c * r[2]


@wp.kernel(enable_backward=False)
def remap_drift_remap(x: wp.array2d(dtype=f64), v: wp.array2d(dtype=f64), r1: wp.vec3d, s1: wp.vec3d,
                      dt: f64, r2: wp.vec3d, s2: wp.vec3d, iso: int):
    # first_half: remap, x += dt v (positions.add_(velocities, alpha=dt): fma), remap
    i = wp.tid()
    a, b, c = apply_remap(x[i, 0], x[i, 1], x[i, 2], r1, s1, iso)
    a = fma(dt, v[i, 0], a)
    b = fma(dt, v[i, 1], b)
    c = fma(dt, v[i, 2], c)
    a, b, c = apply_remap(a, b, c, r2, s2, iso)
    x[i, 0] = a
    x[i, 1] = b
    x[i, 2] = c


@wp.kernel(enable_backward=False)
def kick_press_measure(v: wp.array2d(dtype=f64), f: wp.array2d(dtype=f64), m: wp.array(dtype=f64), n: int,
                       alpha: f64, fac: wp.vec3d, od: wp.vec3d, mdthalf: f64, tri: int, tensor: int,
                       mscale: f64, scale: f64, hi_scale: f64, lo_scale: f64, out: wp.array2d(dtype=wp.int64)):
    # second_half: the half kick, _v_press, then the words of the kinetic tensor (tensor != 0, as
    # kinetic_tensor with m mscale) or of m v^2 (as mv2), summed over the chunk
    t = wp.tid()
    s = vec12l(wp.int64(0))
    for i in range(t * CHUNK, wp.min(t * CHUNK + CHUNK, n)):
        mi = m[i]
        vx, vy, vz = press(kick(v[i, 0], f[i, 0], mi, alpha), kick(v[i, 1], f[i, 1], mi, alpha),
                           kick(v[i, 2], f[i, 2], mi, alpha), fac, od, mdthalf, tri)
        v[i, 0] = vx
        v[i, 1] = vy
        v[i, 2] = vz
        if tensor != 0:
            s = add_tensor_words(s, vx, vy, vz, mi * mscale, lo_scale)
        else:
            h, lo = mv2_words(vx, vy, vz, mi, scale, hi_scale, lo_scale)
            s[0] += h
            s[1] += lo
    for k in range(12):
        out[t, k] = s[k]


# -- the barostat's box check (engine/run/rank_domain.py: RankDomain.displacement) -----------------------
@wp.func
def strain_d2(x: wp.array2d(dtype=f64), x0: wp.array2d(dtype=f64), i: int, t0: wp.vec3d, t1: wp.vec3d,
              t2: wp.vec3d):
    # |x_i - x0_i T|^2 (T's rows t0 t1 t2)
    a = x0[i, 0]
    b = x0[i, 1]
    c = x0[i, 2]
    dx = x[i, 0] - (a * t0[0] + b * t1[0] + c * t2[0])
    dy = x[i, 1] - (a * t0[1] + b * t1[1] + c * t2[1])
    dz = x[i, 2] - (a * t0[2] + b * t1[2] + c * t2[2])
    return dx * dx + dy * dy + dz * dz


@wp.kernel(enable_backward=False)
def strain_displacement(x: wp.array2d(dtype=f64), x0: wp.array2d(dtype=f64), t0: wp.vec3d, t1: wp.vec3d,
                        t2: wp.vec3d, n: int, nan: f64, out: wp.array(dtype=f64)):
    # max over a chunk of |x - x0 T|^2 (T's rows t0 t1 t2); NaN when any is NaN (as torch's amax)
    t = wp.tid()
    m = f64(0.0)
    bad = int(0)
    for i in range(t * CHUNK, wp.min(t * CHUNK + CHUNK, n)):
        d2 = strain_d2(x, x0, i, t0, t1, t2)
        if d2 != d2:
            bad = 1
        m = wp.max(m, d2)
    out[t] = wp.where(bad != 0, nan, m)


# -- the per-step list and health check in one pass (engine/run/rank_domain.py: RankDomain.check_and_stop) ------
@wp.kernel(enable_backward=False)
def check_measure(x: wp.array2d(dtype=f64), x0: wp.array2d(dtype=f64), t0: wp.vec3d, t1: wp.vec3d, t2: wp.vec3d,
                  v: wp.array2d(dtype=f64), n: int, nan: f64, out: wp.array2d(dtype=f64)):
    # a chunk's max of |x - x0 T|^2 and of |v|^2 (T's rows t0 t1 t2); each NaN when any of its terms is
    t = wp.tid()
    m = f64(0.0)
    s = f64(0.0)
    bad_m = int(0)
    bad_s = int(0)
    for i in range(t * CHUNK, wp.min(t * CHUNK + CHUNK, n)):
        d2 = strain_d2(x, x0, i, t0, t1, t2)
        if d2 != d2:
            bad_m = 1
        m = wp.max(m, d2)
        v2 = v[i, 0] * v[i, 0] + v[i, 1] * v[i, 1] + v[i, 2] * v[i, 2]
        if v2 != v2:
            bad_s = 1
        s = wp.max(s, v2)
    out[t, 0] = wp.where(bad_m != 0, nan, m)
    out[t, 1] = wp.where(bad_s != 0, nan, s)
