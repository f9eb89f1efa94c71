"""One pass over the atoms instead of several: Warp CPU kernels for the thermostats' and NPT's
per-atom work, bit for bit the torch expressions they replace (integrators/npt.py,
integrators/nose_hoover.py).

Why: each torch operation is a pass over the arrays, and on the CPU at large N the passes that
do not vectorise (a broadcast over rows of 3, strided columns) dominate: npt tri's kinetic tensor
took ~10 passes over (6, N) terms, its ``nh_v_press`` 7 (twice a step), its remap 5 (twice).
Figures: docs/benchmarks.md, "NPT step against NVE at 256k", after the fused passes; the design
reasoning: docs/design.md, "NPT under decomposition".

Same bits: every kernel does the same IEEE operations in the same order as the torch code.
torch's ``add_(y, alpha=a)`` is a fused multiply-add (fma(a, y, x): checked against exact
rational arithmetic), so the kernels call ``fma`` there and nowhere else; Warp's CPU code is one
statement per operation, which the compiler does not contract (tests/test_npt.py compares
each kernel with its torch expression on random data).  Products and the floor / round-half-even
of the fixed-point words are the same operations, and the words are summed as int64 (exact in
any order), in chunks of ``CHUNK`` atoms, one partial sum per chunk.

Used on the CPU for contiguous float64 arrays (:func:`usable`); elsewhere (CUDA, float32) the
torch code runs: on a GPU the passes are cheap, and Warp's CUDA compiler contracts multiply-adds.
Units are those of the callers (Å, Å/fs, amu, eV).
"""
from __future__ import annotations

import torch

from .fused_common import CHUNK, bare, retarget
from .fused_common import warp as _warp

ENABLED = True  # False: always the torch code (tests compare the two)

_kernels: dict = {}
_F64 = torch.float64   # usable()'s test, one module lookup less a call


def usable(*tensors: torch.Tensor) -> bool:
    """True when the fused kernels serve these arrays: CPU, float64, contiguous, Warp present."""
    if not ENABLED:
        return False
    for t in tensors:   # a loop, not all() over a generator: called a few times a step
        if t.dtype is not _F64 or not t.is_cpu or not t.is_contiguous():
            return False
    return bool(_kernels) or (_warp() is not None and bool(_get()))


#: kernel name -> [recorded launch, the tensors it points at, its scalars' array (numpy view, tensor), chunks]
_recorded: dict = {}


def _run(name: str, chunks: int, tensors: list, scalars: tuple) -> None:
    """Launch kernel ``name`` over ``chunks`` chunks of atoms with ``tensors`` (its array arguments
    in order, all but the last) and ``scalars`` (its last, the ``p`` array: fused_kernels.py's
    docstring). The launch is recorded once (Warp's ``record_cmd``) and replayed: a step writes
    the scalars into the kept array (~1 us) and re-points only the tensors that are new (the
    forces, each step), instead of wrapping every tensor (``from_torch``) and packing every
    argument again (a Warp vector alone ~13 us)."""
    kept = _recorded.get(name)
    if kept is None or kept[4] != chunks:
        wp = _warp()
        kernel = _get()[name]
        p = torch.empty(len(scalars), dtype=torch.float64)
        inputs = [wp.from_torch(a, dtype=kernel.adj.args[i].type.dtype) for i, a in enumerate(tensors)]
        cmd = wp.launch(kernel, dim=chunks, device="cpu", inputs=[*inputs, wp.from_torch(p)], record_cmd=True)
        # no tensor kept (a module's launch would keep the last run's arrays alive): their layouts,
        # and the recorded arrays (which reference the tensors) replaced by their bare structs
        kept = _recorded[name] = [cmd, [_layout(a) for a in tensors], p.numpy(), p, chunks]
        for i in range(len(tensors)):
            bare(cmd, i)
    cmd, held, pn = kept[0], kept[1], kept[2]
    for i, a in enumerate(tensors):
        h = held[i]
        if a.data_ptr() != h[0] or a.shape != h[1]:
            lay = _layout(a)
            retarget(cmd, i, a, same_layout=lay[1:] == h[1:])
            held[i] = lay
    pn[:] = scalars
    cmd.launch()   # a CPU launch: done when it returns, while the caller still holds the tensors


def _layout(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


def _get() -> dict:
    """The kernels (integrators/fused_kernels.py, the hot ones integrators/fused_native.py; Warp
    compiles them once into its cache)."""
    if not _kernels:
        from . import fused_kernels as k
        from . import fused_native as c

        _kernels.update(v_press=k.v_press, remap=k.remap, kinetic_tensor=k.kinetic_tensor, mv2=k.mv2,
                        strain_displacement=k.strain_displacement,
                        scale_kick_drift=c.scale_kick_drift, kick_press_measure=c.kick_press_measure,
                        check_measure=c.check_measure, scale=c.scale, press_kick_drift=c.press_kick_drift)
    return _kernels


def v_press(velocities: torch.Tensor, f: list[float], od: list[float], dthalf: float, tri: bool) -> None:
    """npt.py's ``_v_press`` in one pass, in place: velocities (N, 3) Å/fs, f the three factors,
    od omega_dot (Voigt, 1/fs; tri's tilt terms use od[3:6]), dthalf fs."""
    n = velocities.shape[0]
    _run("v_press", _chunks(n), [velocities], (*f[:3], od[3], od[4], od[5], -dthalf, int(tri), n))


def remap(positions: torch.Tensor, m: list[list[float]]) -> None:
    """x' = x m for a lower-triangular m (rows), in place on positions (N, 3) Å, as npt.py's remap."""
    n = positions.shape[0]
    _run("remap", _chunks(n), [positions], (m[0][0], m[1][1], m[2][2], m[1][0], m[2][0], m[2][1], n))


def _chunks(n: int) -> int:
    return max(-(-n // CHUNK), 1)


def _total(part: torch.Tensor) -> torch.Tensor:
    """The column sums of the chunks' partial sums (a view of the one row where there is one)."""
    return part[0] if part.shape[0] == 1 else part.sum(0)


def kinetic_words(velocities: torch.Tensor, m_scaled: torch.Tensor, lo: float, out: torch.Tensor) -> torch.Tensor:
    """(12,) int64: the local sums of the hi words (xx yy zz xy xz yz) then the lo words of
    (v_a v_b) m_scaled; velocities (N, 3), m_scaled (N,) (m MVV_TO_EV 2^32), ``out`` a kept
    (>= chunks, 12) int64 work array (the result may be a view of it)."""
    n = velocities.shape[0]
    part = out[:_chunks(n)]
    _run("kinetic_tensor", part.shape[0], [velocities, m_scaled, part], (lo, n))
    return _total(part)


def mv2_words(velocities: torch.Tensor, masses: torch.Tensor, scale: float, hi: float, lo: float,
              out: torch.Tensor) -> torch.Tensor:
    """(2,) int64: the local sums of the hi and lo words of ((m (v.v)) scale) hi, v.v by column
    adds; velocities (N, 3), masses (N,), ``out`` a kept (>= chunks, 2) int64 work array (the
    result may be a view of it)."""
    n = velocities.shape[0]
    part = out[:_chunks(n)]
    _run("mv2", part.shape[0], [velocities, masses, part], (scale, hi, lo, n))
    return _total(part)


def chunks(n: int) -> int:
    """Rows of the work array :func:`kinetic_words` and :func:`mv2_words` need for n atoms."""
    return _chunks(n)


# -- whole half steps of npt.py ------------------------------------------------------------------
def scale(velocities: torch.Tensor, factor: float) -> None:
    """velocities *= factor in place ((N, 3) Å/fs): the thermostat chain's scaling, torch's ``mul_``'s bits."""
    n = velocities.shape[0]
    _run("scale", _chunks(n), [velocities], (factor, n))


def scale_kick_drift(positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor,
                     pre: float, alpha: float, dt: float, drift: bool = True) -> None:
    """A thermostat's or NVE's first half in one pass, in place: v *= pre (1.0: unchanged, exactly),
    v += alpha F / m, then (``drift``) x += dt v; positions, velocities, forces (N, 3) Å, Å/fs, eV/Å,
    masses (N,) amu, alpha = dt/2 FORCE_TO_ACCEL.  drift=False: the kick alone (``positions``
    unread: the velocities may stand in)."""
    n = velocities.shape[0]
    _run("scale_kick_drift", _chunks(n), [positions, velocities, forces, masses], (pre, alpha, dt, int(drift), n))


def _remap_args(m) -> tuple:
    """(diagonal (3), m10 m20 m21 (3)) of a remap, and iso: a float (iso's scale) or a lower-triangular matrix."""
    if isinstance(m, float):
        return (m, m, m, 0.0, 0.0, 0.0), 1
    return (m[0][0], m[1][1], m[2][2], m[1][0], m[2][0], m[2][1]), 0


def press_kick_drift(positions: torch.Tensor, velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor,
                     f: list[float], od: list[float], dthalf: float, tri: bool, alpha: float, pre: float, m1,
                     dt: float, m2) -> None:
    """npt.py's whole first half on the atoms in one pass, in place: the thermostat chain's scaling
    (v *= pre), ``_v_press`` (factors f, omega_dot od, dthalf fs) and v += alpha F / m (alpha = dt/2
    FORCE_TO_ACCEL) on each row's velocity, then its position remapped (m1), drifted (x += dt v)
    and remapped (m2); m1, m2: iso's scale factor (float) or the lower-triangular matrix (rows) of
    x' = x m.  (N, 3) Å, Å/fs, eV/Å; (N,) amu."""
    a1, iso = _remap_args(m1)
    a2, _ = _remap_args(m2)
    n = velocities.shape[0]
    _run("press_kick_drift", _chunks(n), [positions, velocities, forces, masses],
         (pre, *f[:3], od[3], od[4], od[5], -dthalf, int(tri), alpha, *a1, dt, *a2, iso, n))


def kick_press_measure(velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor, alpha: float,
                       f: list[float], od: list[float], dthalf: float, tri: bool, tensor: bool,
                       consts: tuple[float, float, float, float], out: torch.Tensor) -> torch.Tensor:
    """npt.py's second half on the velocities, in place (v += alpha F / m, ``_v_press``), with the
    local fixed-point sums of what it measures next: (12,) int64, the kinetic tensor's hi then lo
    words (``tensor``, as :func:`kinetic_words`), else m v^2's hi and lo words first (as
    :func:`mv2_words`).  consts: (MVV_TO_EV 2^32, MVV_TO_EV, 2^32, 2^31); ``out`` a kept
    (>= chunks, 12) int64 work array (the result may be a view of it)."""
    n = velocities.shape[0]
    part = out[:_chunks(n)]
    _run("kick_press_measure", part.shape[0], [velocities, forces, masses, part],
         (alpha, *f[:3], od[3], od[4], od[5], -dthalf, int(tri), int(tensor), *consts, n))
    return _total(part)


def strain_displacement(x: torch.Tensor, x0: torch.Tensor, t: list[list[float]], out: torch.Tensor) -> torch.Tensor:
    """0-d: max over the rows of |x - x0 T| (Å; NaN if any is), the barostat's box check
    (engine/run/rank_domain.py) in one pass; x, x0 (N, 3) Å, t (3, 3) rows, ``out`` a kept (>= chunks,)
    float64 work array.  Not bit for bit the torch expression (mm, sub, norm): the products and
    sums of each row in another order, a few ulps of the displacement, which only decides whether
    a list is rebuilt (its trigger is (skin - ||T - I|| R) / 2, not a bound to the ulp)."""
    n = x.shape[0]
    part = out[:_chunks(n)]
    _run("strain_displacement", part.shape[0], [x, x0, part], (*t[0], *t[1], *t[2], float("nan"), n))
    return part.amax().sqrt()


def check_measure(x: torch.Tensor, x0: torch.Tensor, t: list[list[float]], v: torch.Tensor,
                  out: torch.Tensor) -> tuple[float, float]:
    """(max over the rows of |x - x0 T|^2 (Å^2), max of |v|^2 ((Å/fs)^2)), each NaN if any of
    its terms is: the list's check (:func:`strain_displacement`, T = I for a fixed cell) and the
    health measure's speed (engine/run/health.py) in one pass and one read; x, x0, v (N, 3), t
    (3, 3) rows, ``out`` a kept contiguous float64 work array of at least 2 :func:`chunks` elements
    (one of exactly (chunks, 2) is used as it is)."""
    n = x.shape[0]
    c = _chunks(n)
    part = out if out.shape == (c, 2) else out.view(-1)[: 2 * c].view(-1, 2)
    _run("check_measure", part.shape[0], [x, x0, v, part], (*t[0], *t[1], *t[2], float("nan"), n))
    pn = part.numpy()   # read as numpy: a torch call after a kernel costs its cold dispatch (~10 us)
    if c == 1:
        return float(pn[0, 0]), float(pn[0, 1])
    m = pn.max(0)   # NaN if any is, as torch's amax
    return float(m[0]), float(m[1])
