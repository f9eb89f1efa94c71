"""Inputs of tests/test_allegro.py: a small Cu/Ag structure, and an Allegro checkpoint written the
way users get one, by ``nequip-train`` itself (a small model of Allegro's architecture, float64,
EMA weights, ZBL; two optimiser steps on EMT energies and forces of Cu/Ag cells, so its weights
are still essentially the random initial ones).  Everything offline; ~5 s on 2 cores.

Usage (also as a script): ``python tests/allegro_cases.py DIR`` writes DIR/allegro.ckpt.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

#: the random model of the tests that need no file (models/allegro.py ``factory`` keywords)
KWARGS = {"random": True, "species": ["Cu", "Ag"], "r_max": 4.0, "num_layers": 2, "l_max": 1,
          "num_scalar_features": 16, "num_tensor_features": 4, "seed": 7}

CONFIG = """\
run: [train]
cutoff_radius: 4.0
model_type_names: [Cu, Ag]
data:
  _target_: nequip.data.datamodule.ASEDataModule
  seed: 1
  split_dataset: {file_path: cuag.xyz, train: 4, val: 2}
  key_mapping: {REF_energy: total_energy, REF_forces: forces}
  transforms:
    - {_target_: nequip.data.transforms.NeighborListTransform, r_max: "${cutoff_radius}"}
    - _target_: nequip.data.transforms.ChemicalSpeciesToAtomTypeMapper
      model_type_names: ${model_type_names}
      chemical_species_to_atom_type_map: {Cu: Cu, Ag: Ag}
  train_dataloader: {_target_: torch.utils.data.DataLoader, batch_size: 2}
  val_dataloader: {_target_: torch.utils.data.DataLoader, batch_size: 2}
  stats_manager: {_target_: nequip.data.CommonDataStatisticsManager, type_names: "${model_type_names}"}
trainer:
  _target_: lightning.Trainer
  max_epochs: 1
  accelerator: cpu
  enable_progress_bar: false
  logger: false
  callbacks:
    - {_target_: lightning.pytorch.callbacks.ModelCheckpoint, dirpath: "${hydra:runtime.output_dir}", save_last: true}
training_module:
  _target_: nequip.train.EMALightningModule
  loss: {_target_: nequip.train.EnergyForceLoss, per_atom_energy: true, coeffs: {total_energy: 1.0, forces: 1.0}}
  val_metrics: {_target_: nequip.train.EnergyForceMetrics, coeffs: {per_atom_energy_mae: 1.0, forces_mae: 1.0}}
  optimizer: {_target_: torch.optim.Adam, lr: 0.001}
  model:
    _target_: allegro.model.AllegroModel
    seed: 456
    model_dtype: float64
    type_names: ${model_type_names}
    r_max: ${cutoff_radius}
    radial_chemical_embed: {_target_: allegro.nn.TwoBodyBesselScalarEmbed, num_bessels: 8}
    radial_chemical_embed_dim: 16
    scalar_embed_mlp_hidden_layers_width: 16
    l_max: 1
    num_layers: 2
    num_scalar_features: 16
    num_tensor_features: 4
    allegro_mlp_hidden_layers_width: 16
    readout_mlp_hidden_layers_width: 8
    avg_num_neighbors: ${training_data_stats:num_neighbors_mean}
    per_type_energy_shifts: ${training_data_stats:per_atom_energy_mean}
    per_type_energy_scales: ${training_data_stats:forces_rms}
    pair_potential: {_target_: nequip.nn.pair_potential.ZBL, units: metal, chemical_species: [Cu, Ag]}
global_options: {allow_tf32: false}
"""


def _tool(name: str) -> Path:
    """nequip's console script: beside this Python (a venv), else the first on PATH (a
    ``pip install --target`` puts it in the target's bin)."""
    here = Path(sys.executable).parent / name
    found = shutil.which(name)
    return here if here.exists() or found is None else Path(found)


def cuag(n: int = 3, seed: int = 1, a: float = 3.7, rattle: float = 0.08):
    """fcc Cu with ~40 % Ag on random sites, n x n x n cubic cells (4 n^3 atoms), rattled (Å)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat((n, n, n))
    atoms.numbers[np.random.default_rng(seed).random(len(atoms)) < 0.4] = 47
    atoms.rattle(rattle, seed=seed)
    return atoms


def training_data(path: Path, frames: int = 6) -> None:
    """Cu/Ag cells with EMT energies and forces (ASE's EMT: offline, instant) as extxyz."""
    from ase.calculators.emt import EMT
    from ase.io import write

    out = []
    for k in range(frames):
        atoms = cuag(2, seed=10 + k, rattle=0.1)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        out.append(atoms)
    write(path, out)


def make_checkpoint(folder: Path) -> Path:
    """``nequip-train`` on CONFIG in ``folder``; the checkpoint it wrote (``last.ckpt``) as
    ``folder/allegro.ckpt``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    training_data(folder / "cuag.xyz")
    (folder / "config.yaml").write_text(CONFIG)
    train = _tool("nequip-train")
    r = subprocess.run([str(train), "-cp", str(folder), "-cn", "config", f"hydra.run.dir={folder / 'train'}"],
                       cwd=folder, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"nequip-train failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    (folder / "train" / "last.ckpt").rename(folder / "allegro.ckpt")
    return folder / "allegro.ckpt"


def make_package(checkpoint: Path, out: Path) -> Path:
    """``nequip-package build`` of a checkpoint (a ``.nequip.zip``, as pretrained models come)."""
    tool = _tool("nequip-package")
    # the checkpoint names its training data relative to where nequip-train ran (packaging reads a frame)
    r = subprocess.run([str(tool), "build", str(checkpoint), str(out)], cwd=checkpoint.parent, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"nequip-package failed:\n{r.stderr[-3000:]}")
    return out


if __name__ == "__main__":
    print(make_checkpoint(Path(sys.argv[1])))
