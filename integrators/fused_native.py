"""The hot per-step kernels of integrators/fused.py as plain C++ loops (Warp ``func_native``):
the half steps of NVE, Nosé-Hoover and NPT, the barostat's thermostat scaling and the engine's
per-step list check.  Imported on first use only (loading it initialises Warp).

Why: Warp's generated code indexes every array through its shape and strides (a negative index
allowed, a multiply per access) and copies the 12-word accumulator of a sum at each atom; the
same loop over raw rows is 2-2.5x faster (4,000 atoms: NPT's second half 45 -> 19 us a launch,
docs/design.md, "A small system's step is its layers").  Rows are contiguous ``(n, 3)`` float64
(fused.usable checks it), so row i's component k is ``data[3 i + k]``.

Same bits as integrators/fused_kernels.py's Warp code, which these replace one for one: one IEEE
operation per statement (the compiler contracts a multiply-add only within one expression), an
explicit ``fma`` where torch's ``add_(y, alpha=a)`` fuses one, the same order.  Each kernel is
launched over chunks of ``CHUNK`` atoms (one partial sum per chunk), its scalars in the float64
array ``p`` (the last argument; integers held exactly), as fused_kernels.py's.
"""
from __future__ import annotations

from .fused_common import CHUNK, warp

wp = warp()
f64 = wp.float64
rows = wp.array(dtype=wp.vec3d)

# -- shared C++ pieces (pasted into the snippets: a snippet is one function's body) ------------------------
_ROWS = """
    const int n = (int)pp[{n}];
    const int lo = t * {chunk}, hi = lo + {chunk} < n ? lo + {chunk} : n;
"""
# v *= f (per axis), tri's tilt terms, v *= f again: npt.py's _v_press on one atom (x, y, z)
_PRESS = """
        x = x * f0; y = y * f1; z = z * f2;
        if (tri != 0) {
            double a = y * od2; double b = z * od1; a = a + b; a = a * mdthalf; x = x + a;
            a = z * mdthalf; a = a * od0; y = y + a;
        }
        x = x * f0; y = y * f1; z = z * f2;
"""
# velocities.add_(forces / masses[:, None], alpha=alpha): the quotient rounded, then fma
_KICK = """
        { double q = pf[3 * i] / mi; x = fma(alpha, q, x); }
        { double q = pf[3 * i + 1] / mi; y = fma(alpha, q, y); }
        { double q = pf[3 * i + 2] / mi; z = fma(alpha, q, z); }
"""
# a visit of each row: the arrays as raw rows, the atom's mass and velocity (x, y, z) times {pre}
_VISIT = """
    double* pv = (double*)v.data; const double* pf = (const double*)f.data; const double* pm = m.data;
    for (int i = lo; i < hi; ++i) {{
        const double mi = pm[i];
        double x = pv[3 * i]{pre}, y = pv[3 * i + 1]{pre}, z = pv[3 * i + 2]{pre};
"""
_STORE_V = """
        pv[3 * i] = x; pv[3 * i + 1] = y; pv[3 * i + 2] = z;
"""
# the fixed-point words of c: floor, and the rest rounded half to even (torch.round)
_WORDS = ("{{ double h_ = wp::floor({c}); double r_ = {c} - h_; r_ = r_ * ls; "
          "{hi} += (wp::int64)h_; {lo} += (wp::int64)wp::rint(r_); }}")


def _snippet(body: str, n: int) -> str:
    return _ROWS.format(n=n, chunk=CHUNK) + body


# -- scale_kick_drift: NVE's and Nosé-Hoover's first half (and second: drift 0) ---------------------------
_SCALE_KICK_DRIFT = _snippet("""
    const double pre = pp[0], alpha = pp[1], dt = pp[2];
    const int drift = (int)pp[3];
    double* px = (double*)xr.data;""" + _VISIT.format(pre=" * pre") + _KICK + _STORE_V + """
        if (drift != 0) {
            px[3 * i] = fma(dt, x, px[3 * i]); px[3 * i + 1] = fma(dt, y, px[3 * i + 1]);
            px[3 * i + 2] = fma(dt, z, px[3 * i + 2]);
        }
    }
""", 4)


@wp.func_native(_SCALE_KICK_DRIFT)
def _scale_kick_drift(xr: rows, v: rows, f: rows, m: wp.array(dtype=f64), pp: wp.array(dtype=f64), t: int):
    ...


@wp.kernel(enable_backward=False)
def scale_kick_drift(x: rows, v: rows, f: rows, m: wp.array(dtype=f64), p: wp.array(dtype=f64)):
    # p: pre, alpha, dt, drift, n  (v *= pre; v += alpha F / m; drift: x += dt v)
    _scale_kick_drift(x, v, f, m, p, wp.tid())


# x' = x m: iso the scale r0; else x.mul_(m00).add_(y, alpha=m10).add_(z, alpha=m20); y.mul_(m11).add_(z,
# alpha=m21); z.mul_(m22) (x first: it reads the old y, z)
_REMAP = """
        if (iso != 0) {{ x = x * {r}0; y = y * {r}0; z = z * {r}0; }}
        else {{
            double a = x * {r}0; a = fma({s}0, y, a); x = fma({s}1, z, a);
            a = y * {r}1; y = fma({s}2, z, a); z = z * {r}2;
        }}
"""


# -- press_kick_drift: the whole first half of npt.py in one pass --------------------------------------------
# the chain's scaling (v *= pre), _v_press, the half kick; then remap, x += dt v, remap (x' = x m below)
_PRESS_KICK_DRIFT = _snippet("""
    const double pre = pp[0], f0 = pp[1], f1 = pp[2], f2 = pp[3], od0 = pp[4], od1 = pp[5], od2 = pp[6];
    const double mdthalf = pp[7], alpha = pp[9];
    const int tri = (int)pp[8];
    const double r10 = pp[10], r11 = pp[11], r12 = pp[12], s10 = pp[13], s11 = pp[14], s12 = pp[15], dt = pp[16];
    const double r20 = pp[17], r21 = pp[18], r22 = pp[19], s20 = pp[20], s21 = pp[21], s22 = pp[22];
    const int iso = (int)pp[23];
    double* px = (double*)xr.data;""" + _VISIT.format(pre=" * pre") + _PRESS + _KICK + _STORE_V + """
        const double vx = x, vy = y, vz = z;
        x = px[3 * i]; y = px[3 * i + 1]; z = px[3 * i + 2];
""" + _REMAP.format(r="r1", s="s1") + """
        x = fma(dt, vx, x); y = fma(dt, vy, y); z = fma(dt, vz, z);
""" + _REMAP.format(r="r2", s="s2") + """
        px[3 * i] = x; px[3 * i + 1] = y; px[3 * i + 2] = z;
    }
""", 24)


@wp.func_native(_PRESS_KICK_DRIFT)
def _press_kick_drift(xr: rows, v: rows, f: rows, m: wp.array(dtype=f64), pp: wp.array(dtype=f64), t: int):
    ...


@wp.kernel(enable_backward=False)
def press_kick_drift(x: rows, v: rows, f: rows, m: wp.array(dtype=f64), p: wp.array(dtype=f64)):
    # p: pre, fac (3), od yz xz xy (3), -dthalf, tri, alpha, r1 (3), s1 (3), dt, r2 (3), s2 (3), iso, n
    _press_kick_drift(x, v, f, m, p, wp.tid())


# -- kick_press_measure: second half's velocities and the words of what it measures (npt.py) ---------------
_KICK_PRESS_MEASURE = _snippet("""
    const double alpha = pp[0], f0 = pp[1], f1 = pp[2], f2 = pp[3], od0 = pp[4], od1 = pp[5], od2 = pp[6];
    const double mdthalf = pp[7], mscale = pp[10], scale = pp[11], hs = pp[12], ls = pp[13];
    const int tri = (int)pp[8], tensor = (int)pp[9];
    wp::int64 s[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};""" + _VISIT.format(pre="") + _KICK + _PRESS + _STORE_V + """
        if (tensor != 0) {   // the words of (v_a v_b) (m mscale): xx yy zz xy xz yz, hi 0-5, lo 6-11
            const double w = mi * mscale;
            double c;
            c = x * x; c = c * w; """ + _WORDS.format(c="c", hi="s[0]", lo="s[6]") + """
            c = y * y; c = c * w; """ + _WORDS.format(c="c", hi="s[1]", lo="s[7]") + """
            c = z * z; c = c * w; """ + _WORDS.format(c="c", hi="s[2]", lo="s[8]") + """
            c = x * y; c = c * w; """ + _WORDS.format(c="c", hi="s[3]", lo="s[9]") + """
            c = x * z; c = c * w; """ + _WORDS.format(c="c", hi="s[4]", lo="s[10]") + """
            c = y * z; c = c * w; """ + _WORDS.format(c="c", hi="s[5]", lo="s[11]") + """
        } else {   // ((m ((x x + y y) + z z)) scale) hs
            double a = x * x; double b = y * y; double c = z * z;
            double e = a + b; e = e + c; e = mi * e; e = e * scale; e = e * hs;
            """ + _WORDS.format(c="e", hi="s[0]", lo="s[1]") + """
        }
    }
    wp::int64* po = (wp::int64*)((char*)out.data + (size_t)t * out.strides[0]);
    for (int k = 0; k < 12; ++k) po[k] = s[k];
""", 14)


@wp.func_native(_KICK_PRESS_MEASURE)
def _kick_press_measure(v: rows, f: rows, m: wp.array(dtype=f64), out: wp.array2d(dtype=wp.int64),
                        pp: wp.array(dtype=f64), t: int):
    ...


@wp.kernel(enable_backward=False)
def kick_press_measure(v: rows, f: rows, m: wp.array(dtype=f64), out: wp.array2d(dtype=wp.int64),
                       p: wp.array(dtype=f64)):
    # p: alpha, fac (3), od yz xz xy (3), -dthalf, tri, tensor, mscale, scale, hi_scale, lo_scale, n
    _kick_press_measure(v, f, m, out, p, wp.tid())


# -- scale: the thermostat chain's scaling of the velocities (npt.py's second half: v.mul_(factor)) ------------
_SCALE = _snippet("""
    const double c = pp[0];
    double* pv = (double*)v.data;
    for (int i = 3 * lo; i < 3 * hi; ++i) pv[i] = pv[i] * c;
""", 1)


@wp.func_native(_SCALE)
def _scale(v: rows, pp: wp.array(dtype=f64), t: int):
    ...


@wp.kernel(enable_backward=False)
def scale(v: rows, p: wp.array(dtype=f64)):
    # p: factor, n
    _scale(v, p, wp.tid())


# -- check_measure: the engine's per-step list check and health measure (engine/run/rank_domain.py) ----------
_CHECK_MEASURE = _snippet("""
    const double* px = (const double*)xr.data; const double* pa = (const double*)x0.data;
    const double* pv = (const double*)v.data;
    const double t00 = pp[0], t01 = pp[1], t02 = pp[2], t10 = pp[3], t11 = pp[4], t12 = pp[5];
    const double t20 = pp[6], t21 = pp[7], t22 = pp[8];
    double mx = 0.0, sx = 0.0;
    int bad_m = 0, bad_s = 0;
    for (int i = lo; i < hi; ++i) {   // |x - a T|^2 (T's rows t0 t1 t2), |v|^2
        const double a0 = pa[3 * i], a1 = pa[3 * i + 1], a2 = pa[3 * i + 2];
        double e, u;
        e = a0 * t00; u = a1 * t10; e = e + u; u = a2 * t20; e = e + u; const double dx = px[3 * i] - e;
        e = a0 * t01; u = a1 * t11; e = e + u; u = a2 * t21; e = e + u; const double dy = px[3 * i + 1] - e;
        e = a0 * t02; u = a1 * t12; e = e + u; u = a2 * t22; e = e + u; const double dz = px[3 * i + 2] - e;
        double d2 = dx * dx; u = dy * dy; d2 = d2 + u; u = dz * dz; d2 = d2 + u;
        if (d2 != d2) bad_m = 1;
        mx = mx > d2 ? mx : d2;
        const double w0 = pv[3 * i], w1 = pv[3 * i + 1], w2 = pv[3 * i + 2];
        double v2 = w0 * w0; u = w1 * w1; v2 = v2 + u; u = w2 * w2; v2 = v2 + u;
        if (v2 != v2) bad_s = 1;
        sx = sx > v2 ? sx : v2;
    }
    double* po = (double*)((char*)out.data + (size_t)t * out.strides[0]);
    po[0] = bad_m ? pp[9] : mx;
    po[1] = bad_s ? pp[9] : sx;
""", 10)


@wp.func_native(_CHECK_MEASURE)
def _check_measure(xr: rows, x0: rows, v: rows, out: wp.array2d(dtype=f64), pp: wp.array(dtype=f64), t: int):
    ...


@wp.kernel(enable_backward=False)
def check_measure(x: rows, x0: rows, v: rows, out: wp.array2d(dtype=f64), p: wp.array(dtype=f64)):
    # a chunk's max of |x - x0 T|^2 and of |v|^2; each NaN when any of its terms is; p: T's rows (9), NaN, n
    _check_measure(x, x0, v, out, p, wp.tid())
