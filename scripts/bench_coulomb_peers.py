"""The peers of scripts/bench_coulomb.py, each timed on the same rattled NaCl, and a reference
Ewald sum in torch (on any device):

- torch-pme: its EwaldCalculator / PMECalculator, given our alpha, k cutoff and at least our mesh;
- nvalchemi-toolkit-ops: ``ewald_summation`` / ``particle_mesh_ewald`` (Warp kernels), given our
  alpha, k cutoff and mesh spacing (its default B-spline order);
- torch-sim (torch-sim-atomistic): ``torch_sim.models.electrostatics.EwaldModel`` / ``PMEModel``,
  its own wrappers of those nvalchemi-toolkit-ops calls. They take a cutoff and an accuracy only:
  alpha, the k cutoff and the mesh come from nvalchemi's estimate, eta = (V^2/N)^(1/6)/sqrt(2 pi),
  alpha = 1/(sqrt(2) eta), whatever the cutoff, whose own real-space cutoff sqrt(-2 ln acc) eta
  is 24 Å at 4k ions and 33 Å at 32k. ``torch-sim`` runs them at our cutoff (10 Å);
  ``torch-sim-rc`` at that estimated cutoff. Their neighbour list (torchsim_nl) is built once and
  handed back on every call (its cost is printed beside the time).

Each function returns (seconds per call, energy eV, forces (n, 3) numpy); ``timed(call, reps,
device)`` times ``call`` (one warm-up, median of ``reps``, the device synchronised).
"""
from __future__ import annotations

import math
import statistics
import time

import numpy as np
import torch

K_E = 14.399645


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps, device):
    out = fn()
    sync(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _setup(atoms, charges, device, cutoff):
    from ase.neighborlist import neighbor_list

    i, j, s = neighbor_list("ijS", atoms, cutoff)
    t = dict(device=device)
    q = torch.tensor([charges[x] for x in atoms.get_chemical_symbols()], dtype=torch.float64, **t)
    return (torch.tensor(i, **t), torch.tensor(j, **t), torch.tensor(s, dtype=torch.float64, **t),
            torch.tensor(atoms.cell[:], **t), q, torch.tensor(atoms.positions, **t))


def _result(t, out):
    e, f = out
    return t, float(e), f.detach().cpu().numpy()


def torch_pme(atoms, method, params, charges, cutoff, device, reps):
    import torchpme

    i, j, s, cell, q, x0 = _setup(atoms, charges, device, cutoff)
    q = q[:, None]
    pot = torchpme.CoulombPotential(smearing=1 / (math.sqrt(2) * params["alpha"])).to(device, torch.float64)
    if method == "ewald":
        # its Ewald takes its k vectors as a mesh's FFT frequencies, |n_a| < ns_a / 2 with
        # ns_a = 2 |a| / lr_wavelength: pi / k_max reaches k_max; it holds a (k, atoms) phase matrix
        ns = torch.ceil(2 * params["k_max"] * torch.linalg.norm(cell, dim=1) / (2 * math.pi))
        if float(ns.prod()) * len(atoms) * 8 * 6 > 100e9:
            raise MemoryError(f"not run: its ({int(ns.prod())} k, {len(atoms)} atoms) phase matrices (> 100 GB)")
        calc = torchpme.EwaldCalculator(pot, lr_wavelength=math.pi / params["k_max"], full_neighbor_list=True)
    else:
        from torchpme.lib.kvectors import get_ns_mesh

        points = int(get_ns_mesh(cell.cpu(), 2 * params["mesh_spacing"]).prod())
        if points > 2 ** 24 and torch.device(device).type == "cpu":
            raise MemoryError("not run: torch-pme's power-of-two mesh over 256^3 points (GBs on this machine)")
        # its mesh has 2 |a| / mesh_spacing + 1 points a side, rounded up to a power of two:
        # twice our spacing gives it at least our mesh
        calc = torchpme.PMECalculator(pot, mesh_spacing=2 * params["mesh_spacing"], interpolation_nodes=7,
                                      full_neighbor_list=True)
    calc = calc.to(device, torch.float64)

    def call():
        x = x0.clone().requires_grad_(True)
        d = (x[j] + s @ cell - x[i]).norm(dim=1)
        e = K_E * (q * calc(q, cell, x, torch.stack([i, j], 1), d)).sum()
        (g,) = torch.autograd.grad(e, x)
        return e.detach(), -g

    return _result(*timed(call, reps, device))


def nvalchemi(atoms, method, params, charges, cutoff, device, reps):
    from nvalchemiops.torch.interactions.electrostatics import ewald, pme

    i, j, s, cell, q, x0 = _setup(atoms, charges, device, cutoff)
    order = torch.argsort(i, stable=True)
    i, j, s = i[order], j[order], s[order]
    ptr = torch.zeros(len(atoms) + 1, dtype=torch.int32, device=device)
    ptr[1:] = torch.cumsum(torch.bincount(i, minlength=len(atoms)), 0)
    nl = torch.stack([i, j]).to(torch.int32)
    kw = dict(alpha=params["alpha"], neighbor_list=nl, neighbor_ptr=ptr, neighbor_shifts=s.to(torch.int32))

    def call():
        x = x0.clone().requires_grad_(True)
        if method == "ewald":
            e = ewald.ewald_summation(x, q, cell[None], k_cutoff=params["k_max"], **kw)
        else:
            e = pme.particle_mesh_ewald(x, q, cell[None], mesh_spacing=params["mesh_spacing"], **kw)
        e = K_E * e.sum()
        (g,) = torch.autograd.grad(e, x)
        return e.detach(), -g

    return _result(*timed(call, reps, device))


def torch_sim(atoms, method, charges, cutoff, accuracy, device, reps, own_cutoff=False):
    """torch-sim's EwaldModel / PMEModel: energy, forces and stress (its model computes all three)."""
    try:
        import torch_sim as ts
    except (ImportError, SyntaxError):   # torch-sim 0.6 installs on Python >= 3.12 only
        return torch_sim_calls(atoms, method, charges, cutoff, accuracy, device, reps, own_cutoff)
    from nvalchemiops.torch.interactions.electrostatics import estimate_ewald_parameters
    from torch_sim.models.electrostatics import EwaldModel, PMEModel
    from torch_sim.neighbors import torchsim_nl

    state = ts.io.atoms_to_state(atoms, device=torch.device(device), dtype=torch.float64)
    state.atom_extras["partial_charges"] = torch.tensor([charges[x] for x in atoms.get_chemical_symbols()],
                                                        dtype=torch.float64, device=device)
    est = estimate_ewald_parameters(state.positions, state.row_vector_cell, accuracy=accuracy)
    if own_cutoff:
        cutoff = float(est.real_space_cutoff.max())
    built = {}

    def neighbours(*args, **kw):   # its list, built on the first call and handed back after
        if "nl" not in built:
            built["nl"] = torchsim_nl(*args, **kw)
            built["args"] = (args, kw)
        return built["nl"]

    model = (EwaldModel if method == "ewald" else PMEModel)(cutoff, accuracy=accuracy, device=torch.device(device),
                                                            dtype=torch.float64, neighbor_list_fn=neighbours)

    def call():
        out = model(state)
        return out["energy"].sum(), out["forces"]

    t, e, f = _result(*timed(call, reps, device))
    args, kw = built["args"]
    t_nl, _ = timed(lambda: torchsim_nl(*args, **kw), 1, device)
    pairs = built["nl"][0].shape[1]
    note = (f"r_c {cutoff:.1f} Å, alpha {float(est.alpha.max()):.3f}/Å, {pairs / len(atoms):.0f} pairs/atom; "
            f"its list {t_nl * 1e3:.0f} ms more a call")
    return t, e, f, note


def torch_sim_calls(atoms, method, charges, cutoff, accuracy, device, reps, own_cutoff=False):
    """What torch-sim 0.6.2's EwaldModel / PMEModel.forward compute, where torch-sim does not
    install (Python < 3.12): the same nvalchemi-toolkit-ops calls with the same arguments
    (cutoff and accuracy only, PME's B-splines of order 4, forces and virial from its kernels) and
    its sort of the list into CSR rows on every call; the list: its torchsim_nl's (nvalchemi's
    all-pairs list), built once."""
    from nvalchemiops.torch.interactions.electrostatics import (
        estimate_ewald_parameters,
        ewald_summation,
        particle_mesh_ewald,
    )
    from nvalchemiops.torch.neighbors.batch_naive import batch_naive_neighbor_list

    cell0 = torch.tensor(atoms.cell[:], dtype=torch.float64, device=device)
    est = estimate_ewald_parameters(torch.tensor(atoms.positions, device=device), cell0, accuracy=accuracy)
    if own_cutoff:
        cutoff = float(est.real_space_cutoff.max())
    pairs = len(atoms) ** 2 * 4 * math.pi / 3 * cutoff ** 3 / atoms.get_volume()
    if pairs > 5e7:
        raise MemoryError(f"not run: {pairs / 1e6:.0f} M pairs within its r_c {cutoff:.1f} Å")
    n = len(atoms)
    batch = torch.zeros(n, dtype=torch.int32, device=device)
    x, cell = torch.tensor(atoms.positions, device=device), cell0
    q = torch.tensor([charges[a] for a in atoms.get_chemical_symbols()], dtype=torch.float64, device=device)
    nl, _, s = batch_naive_neighbor_list(positions=x, cutoff=cutoff, batch_idx=batch, cell=cell[None],
                                         pbc=torch.ones(1, 3, dtype=torch.bool, device=device),
                                         return_neighbor_list=True)
    (i, j), s = nl.long(), s.to(torch.float64)   # as torchsim_nl hands them to the model

    def call():
        order = torch.argsort(i, stable=True)   # transforms.build_csr_neighbor_list, in every forward
        ptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        ptr[1:] = torch.bincount(i, minlength=n).cumsum(0).to(torch.int32)
        kw = dict(neighbor_list=torch.stack([i[order], j[order]]).to(torch.int32), neighbor_ptr=ptr,
                  neighbor_shifts=s[order].to(torch.int32), compute_forces=True, compute_virial=True,
                  accuracy=accuracy)
        if method == "ewald":
            out = ewald_summation(positions=x, charges=q, cell=cell[None], batch_idx=batch, **kw)
        else:
            out = particle_mesh_ewald(positions=x, charges=q, cell=cell[None], batch_idx=None, spline_order=4, **kw)
        return K_E * out[0].sum(), K_E * out[1]

    t, e, f = _result(*timed(call, reps, device))
    return t, e, f, (f"r_c {cutoff:.1f} Å, alpha {float(est.alpha.max()):.3f}/Å; its calls to nvalchemi-toolkit-ops "
                     f"(torch-sim needs Python >= 3.12)")


def reference(positions, cell, charges, alpha=0.3, tol=1e-11, device="cpu", rows=1024):
    """(energy eV, forces (n, 3) numpy) of an Ewald sum converged to ``tol``: tests/coulomb_systems.py's
    ``reference_ewald`` (every image of every pair within sqrt(-ln tol)/alpha, analytic forces) in torch,
    float64, blocks of ``rows`` atoms, on ``device``."""
    f64 = dict(dtype=torch.float64, device=device)
    x, cell, q = (torch.as_tensor(np.asarray(a), **f64) for a in (positions, cell, charges))
    n, s = len(x), math.sqrt(-math.log(tol))
    rc, kc = s / alpha, 2 * alpha * s
    vol = float(torch.linalg.det(cell).abs())
    inv = torch.linalg.inv(cell)
    recip = 2 * math.pi * inv.T
    reach = [int(math.ceil(rc * float(w))) for w in torch.linalg.norm(inv, dim=0)]
    images = torch.cartesian_prod(*[torch.arange(-m, m + 1, **f64) for m in reach]) @ cell
    energy, forces = torch.zeros((), **f64), torch.zeros(n, 3, **f64)
    for shift in images:
        for a in range(0, n, rows):
            d = x[None, :, :] + shift - x[a:a + rows, None, :]            # d[i, j] = x_j + shift - x_i
            r = torch.linalg.norm(d, dim=2)
            mask = (r < rc) & (r > 1e-12)
            rs = torch.where(mask, r, torch.ones_like(r))
            qq = q[a:a + rows, None] * q[None, :]
            erfc = torch.special.erfc(alpha * rs)
            energy += 0.5 * K_E * torch.where(mask, qq * erfc / rs, 0.0).sum()
            g = torch.where(mask, qq * (erfc / rs ** 2 + 2 * alpha / math.sqrt(math.pi)
                                        * torch.exp(-(alpha * rs) ** 2) / rs) / rs, 0.0)
            forces[a:a + rows] -= K_E * torch.einsum("ij,ijc->ic", g, d)
    m = [int(math.ceil(kc / float(b))) + 1 for b in torch.linalg.norm(recip, dim=1)]
    grid = torch.cartesian_prod(torch.arange(0, m[0] + 1), torch.arange(-m[1], m[1] + 1), torch.arange(-m[2], m[2] + 1))
    half = (grid[:, 0] > 0) | ((grid[:, 0] == 0) & (grid[:, 1] > 0)) | ((grid[:, 0] == 0) & (grid[:, 1] == 0)
                                                                         & (grid[:, 2] > 0))
    kv = grid[half].to(**f64) @ recip
    k2 = (kv * kv).sum(1)
    kv, k2 = kv[k2 < kc * kc], k2[k2 < kc * kc]
    for b in range(0, len(kv), 2048):
        kb, gb = kv[b:b + 2048], torch.exp(-k2[b:b + 2048] / (4 * alpha * alpha)) / k2[b:b + 2048]
        phase = x @ kb.T
        cos, sin = torch.cos(phase), torch.sin(phase)
        c, sn = q @ cos, q @ sin
        energy += K_E * 4 * math.pi / vol * (gb * (c * c + sn * sn)).sum()
        forces += K_E * 8 * math.pi / vol * q[:, None] * ((sin * (gb * c) - cos * (gb * sn)) @ kb)
    energy -= K_E * alpha / math.sqrt(math.pi) * (q * q).sum()
    energy -= K_E * math.pi * q.sum() ** 2 / (2 * vol * alpha * alpha)
    return float(energy), forces.cpu().numpy()
