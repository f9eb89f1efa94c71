"""Inputs of tests/test_aimnet2.py: a small AIMNet2 of the package's real architecture with random
weights, written the way users get a model file, by aimnet's own exporter (``aimnet export``:
the v2 ``.pt`` format, a plain dict of tensors, the model's YAML and its metadata, with the
long-range Coulomb term stripped to the embedded short-range part and ``needs_coulomb`` set), and
a periodic water box.  Everything offline; ~2 s on 2 cores.

Usage (also as a script): ``python tests/aimnet2_cases.py DIR`` writes DIR/aimnet2.pt.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

#: species of the random model (H, C, N, O: what AIMNet2's organic models cover, smaller)
SPECIES = (1, 6, 7, 8)
#: the self-atomic energies baked into the atomic shifts (eV; of the order of wB97M's)
SAE = {1: -13.6, 6: -1029.0, 7: -1485.0, 8: -2042.0}

#: AIMNet2's own configuration (aimnet/models/aimnet2.yaml: 3 passes, d2features, the energy
#: MLP, atomic shift and sum, LRCoulomb), every width cut down so the tests stay fast
MODEL_YAML = """\
class: aimnet.models.AIMNet2
kwargs:
  nfeature: 8
  d2features: true
  ncomb_v: 6
  hidden:
    - [48, 32]
    - [48, 32]
    - [48, 32, 32]
  aim_size: 32
  aev:
    rc_s: 5.0
    nshifts_s: 8
  outputs:
    energy_mlp:
      class: aimnet.modules.Output
      kwargs:
        n_in: 32
        n_out: 1
        key_in: aim
        key_out: energy
        mlp:
          activation_fn: torch.nn.GELU
          last_linear: true
          hidden: [16]
    atomic_shift:
      class: aimnet.modules.AtomicShift
      kwargs:
        key_in: energy
        key_out: energy
    atomic_sum:
      class: aimnet.modules.AtomicSum
      kwargs:
        key_in: energy
        key_out: energy
    lrcoulomb:
      class: aimnet.modules.LRCoulomb
      kwargs:
        rc: 4.6
        key_in: charges
        key_out: energy
"""

#: the released wB97M-D3 models' DFT-D3(BJ) output (aimnet/models/aimnet2_dftd3_wb97m.yaml: s6 1 by
#: default, cutoff 15 Å and smoothing over its last 20 % from the calculator's defaults)
WB97M_D3 = {"s8": 0.3908, "a1": 0.5660, "a2": 3.1280}
DFTD3_YAML = """\
    dftd3:
      class: aimnet.modules.DFTD3
      kwargs:
        s8: {s8}
        a1: {a1}
        a2: {a2}
""".format(**WB97M_D3)


def make_model_file(folder: Path, seed: int = 3, name: str = "aimnet2.pt", dispersion: bool = False) -> Path:
    """A random-weight AIMNet2 exported by aimnet's own ``export_model`` (its v2 ``.pt``) as
    ``folder/name``; ``dispersion``: the YAML also has the released models' DFTD3 output
    (wB97M's D3(BJ) parameters), which the exporter strips to ``needs_dispersion`` and
    ``d3_params``, as in the released files.  The charge-related output weights are scaled up so that the partial
    charges (and so the Coulomb terms and charge equilibration) matter in the energy, the energy
    head's down so that short hot MD runs stay stable."""
    import torch
    import yaml
    from aimnet.config import build_module
    from aimnet.train.export_model import export_model

    config = MODEL_YAML + DFTD3_YAML if dispersion else MODEL_YAML
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_module(yaml.safe_load(config))
        with torch.no_grad():
            for mlp in list(model.mlps)[:-1]:   # the passes that predict charges: larger charges
                [m for m in mlp if isinstance(m, torch.nn.Linear)][-1].weight.mul_(2.0)
            model.outputs.energy_mlp.mlp[-1].weight.mul_(0.2)   # a gentler surface: MD stays stable
    torch.save(model.state_dict(), folder / "weights.pt")
    (folder / "model.yaml").write_text(config)
    (folder / "model.sae").write_text("".join(f"{z}: {e}\n" for z, e in SAE.items()))
    export_model.main([str(folder / "weights.pt"), str(folder / name), "--model", str(folder / "model.yaml"),
                       "--sae", str(folder / "model.sae")], standalone_mode=False)
    return folder / name


def water_box(n: int = 3, seed: int = 1, spacing: float = 3.1, rattle: float = 0.05, offset: float = 0.0):
    """n x n x n water molecules on a cubic grid (``spacing`` Å apart, random orientations),
    periodic, rattled (Å), shifted by ``offset`` Å along x and y (1.5: the molecules of an even
    n sit on the planes that split the box into 2 x 2 domains, so atoms migrate at once)."""
    from ase import Atoms
    from ase.build import molecule

    rng = np.random.default_rng(seed)
    base = molecule("H2O")
    atoms = Atoms(cell=np.eye(3) * n * spacing, pbc=True)
    for ix in range(n):
        for iy in range(n):
            for iz in range(n):
                w = base.copy()
                w.rotate(rng.uniform(0, 360), rng.normal(size=3) + 1e-3, center="COP")
                w.translate(np.array([ix, iy, iz]) * spacing + spacing / 2 - w.get_center_of_mass())
                atoms += w
    atoms.rattle(rattle, seed=seed)
    atoms.translate([offset, offset, 0.0])
    atoms.wrap()
    return atoms


if __name__ == "__main__":
    print(make_model_file(Path(sys.argv[1])))
