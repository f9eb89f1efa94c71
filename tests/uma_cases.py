"""Inputs of tests/test_uma.py: a small UMA checkpoint of the real architecture (fairchem's
``eSCNMDMoeBackbone`` with its mixture of linear experts and composition embedding, the
per-task ``DatasetSpecificMoEWrapper`` around ``MLP_EFS_Head``), random weights, written as
fairchem writes inference checkpoints (``MLIPInferenceCheckpoint``: model config, weights, EMA
weights, task configs with normalizers and element references), and a small structure.
Nothing is downloaded; ~2 s on 2 cores.

Usage (also as a script): ``python tests/uma_cases.py DIR`` writes DIR/uma.pt.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

TASKS = ("oc20", "omat", "omol")

#: the backbone of UMA-S (eSCN-MD with MoLE), shrunk: 2 layers, 16 channels, 4 experts, 4 Å
BACKBONE = {"model": "fairchem.core.models.uma.escn_moe.eSCNMDMoeBackbone", "max_num_elements": 100,
            "sphere_channels": 16, "lmax": 2, "mmax": 2, "otf_graph": True, "max_neighbors": 300,
            "cutoff": 4.0, "edge_channels": 16, "distance_function": "gaussian", "num_distance_basis": 16,
            "direct_forces": False, "regress_forces": True, "regress_stress": True, "num_layers": 2,
            "hidden_channels": 16, "norm_type": "rms_norm_sh", "act_type": "gate", "ff_type": "spectral",
            "chg_spin_emb_type": "rand_emb", "dataset_mapping": {t: t for t in TASKS}, "use_dataset_embedding": True,
            "num_experts": 4, "use_composition_embedding": True, "moe_layer_type": "pytorch",
            "model_version": 1.1}
HEADS = {"energyandforcehead": {"module": "fairchem.core.models.uma.escn_moe.DatasetSpecificMoEWrapper",
                                "head_cls": "fairchem.core.models.uma.escn_md.MLP_EFS_Head",
                                "dataset_mapping": {t: t for t in TASKS}, "head_kwargs": {"wrap_property": False}}}


def model_config(model_id: str = "UMA-S-1.1", **backbone) -> dict:
    """The ``model_config`` dict of the checkpoint (fairchem's HydraModel and its parts)."""
    return {"_target_": "fairchem.core.models.base.HydraModel", "backbone": {**BACKBONE, **backbone},
            "heads": HEADS, "pass_through_head_outputs": True, "otf_graph": True, "model_id": model_id}


def _refs(seed: int) -> list:
    """Per-element reference energies (eV), index = atomic number (what training fills in)."""
    return (-1.0 - np.random.default_rng(seed).random(100)).tolist()


def tasks_config(rmsd: float = 1.3) -> list[dict]:
    """Energy, forces and stress tasks per dataset, as fairchem's training writes them."""
    norm = "fairchem.core.modules.normalization.normalizer.Normalizer"
    out = []
    for k, name in enumerate(TASKS):
        level = {"energy": "system", "forces": "atom", "stress": "system"}
        dims = {"energy": [1], "forces": [3], "stress": [1, 9]}
        for prop in ("energy", "forces", "stress"):
            task = {"_target_": "fairchem.core.units.mlip_unit.mlip_unit.Task", "name": f"{name}_{prop}",
                    "level": level[prop], "property": prop, "datasets": [name],
                    "out_spec": {"_target_": "fairchem.core.units.mlip_unit.mlip_unit.OutputSpec",
                                 "dim": dims[prop], "dtype": "float32"},
                    "normalizer": {"_target_": norm, "mean": 0.0, "rmsd": rmsd}}
            if prop == "energy":
                task["element_references"] = {
                    "_target_": "fairchem.core.modules.normalization.element_references.ElementReferences",
                    "element_references": torch.tensor(_refs(k), dtype=torch.float64)}
            out.append(task)
    return out


def build(config: dict, seed: int = 0):
    """fairchem's HydraModel of ``config`` with random weights drawn from ``seed``; the MoLE
    expert weights and the small embeddings scaled up so every part moves the energy."""
    import warnings

    from fairchem.core.models.base import HydraModel

    cfg = {k: v for k, v in config.items() if k != "_target_"}
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = HydraModel(**cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "source_embedding" in name or "target_embedding" in name:
                    p.uniform_(-0.5, 0.5)   # fairchem initialises them at +-0.001
    return model.eval()


def make_checkpoint(folder: Path, name: str = "uma.pt", seed: int = 0, **config) -> Path:
    """``folder/name``: an ``MLIPInferenceCheckpoint`` of a random model (EMA = the weights)."""
    from fairchem.core.units.mlip_unit.api.inference import MLIPInferenceCheckpoint

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model_config(**config)
    model = build(cfg, seed)
    weights = model.state_dict()
    ema = {f"module.{k}": v.clone() for k, v in weights.items()}
    ema["n_averaged"] = torch.tensor(1)
    torch.save(MLIPInferenceCheckpoint(model_config=cfg, model_state_dict=weights, ema_state_dict=ema,
                                       tasks_config=tasks_config()), folder / name)
    return folder / name


def crystal(n: int = 3, seed: int = 1, a: float = 3.6, rattle: float = 0.08):
    """fcc Cu with ~30 % Ni, n x n x n cubic cells (4 n^3 atoms), rattled (Å)."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat((n, n, n))
    atoms.numbers[np.random.default_rng(seed).random(len(atoms)) < 0.3] = 28
    atoms.rattle(rattle, seed=seed)
    return atoms


if __name__ == "__main__":
    print(make_checkpoint(Path(sys.argv[1])))
