"""The shipped default MACE model (models/data/cu_mace_small.model) and its JSON card.

The model was trained on EMT copper (scripts/make_mace_data.py,
scripts/train_default_mace.py); these tests check it loads with mace-torch's own loaders,
reproduces EMT on configurations generated here (never read from the training files),
and that its model card describes it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mace")
import mace  # noqa: F401  (must come before MACECalculator's torch.load of e3nn objects)
import torch

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "data" / "cu_mace_small.model"
CARD = REPO / "models" / "data" / "cu_mace_small.json"
DATA = REPO / "scripts" / "data" / "mace_cu"

# Acceptance on one held-out configuration, in units of the card's test-split errors.
# Energy: one configuration's per-atom error is a single draw from a distribution whose
# rms is the reported RMSE, so 3x RMSE (~99.7 % if Gaussian) plus a 1 meV/atom floor
# (the test split has only ~20 configurations, so its RMSE is itself uncertain).
# Forces: the rms over the ~300 force components of one configuration is an average,
# close to the population RMSE; 2x covers configuration-to-configuration variation
# (hotter/more distorted configurations have larger errors), plus a 5 meV/A floor.
E_FACTOR, E_FLOOR_MEV = 3.0, 1.0
F_FACTOR, F_FLOOR_MEV = 2.0, 5.0


@pytest.fixture(scope="module")
def card():
    assert CARD.exists(), f"missing {CARD}"
    return json.loads(CARD.read_text())


@pytest.fixture(scope="module")
def model():
    """Through the engine's safe loader (weights_only=True under its allow-list), as the
    engine loads it by default: the shipped file must never need model.trust_pickle."""
    from shardmd.models.mace_safe_load import load_safely

    assert MODEL.exists(), f"missing {MODEL}"
    return load_safely(MODEL, map_location="cpu")


@pytest.fixture(scope="module")
def calc():
    from mace.calculators import MACECalculator

    return MACECalculator(model_paths=str(MODEL), device="cpu", default_dtype="float64")


def test_file_size_and_hash(card):
    assert MODEL.stat().st_size < 5 * 1024 * 1024
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == card["file_sha256"]


def test_loads_with_safe_loader(model):
    assert type(model).__name__ == "ScaleShiftMACE"
    assert float(model.r_max) > 0
    assert [int(z) for z in model.atomic_numbers] == [29]


def test_loads_with_mace_calculator(calc):
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.59, cubic=True)
    atoms.calc = calc
    e = atoms.get_potential_energy()
    f = atoms.get_forces()
    assert np.isfinite(e)
    assert np.abs(f).max() < 1e-6  # perfect lattice: forces vanish by symmetry


def _held_out_configs():
    """Fresh configurations, fixed seeds, none of them from the training files."""
    from ase.build import bulk, fcc100

    rng = np.random.default_rng(20261130)
    crystal = bulk("Cu", "fcc", a=3.60, cubic=True).repeat(3)  # 108 atoms
    crystal.positions += rng.normal(0.0, 0.06, crystal.positions.shape)
    slab = fcc100("Cu", size=(3, 3, 4), a=3.59, vacuum=6.0)  # 36 atoms
    slab.pbc = True
    slab.positions += rng.normal(0.0, 0.05, slab.positions.shape)
    return {"rattled_bulk_108": crystal, "rattled_slab_100": slab}


@pytest.mark.parametrize("name", ["rattled_bulk_108", "rattled_slab_100"])
def test_matches_emt_on_held_out_configuration(name, calc, card):
    from ase.calculators.emt import EMT

    atoms = _held_out_configs()[name]
    ref = atoms.copy()
    ref.calc = EMT()
    e_ref = ref.get_potential_energy() / len(ref)
    f_ref = ref.get_forces()

    atoms.calc = calc
    e = atoms.get_potential_energy() / len(atoms)
    f = atoms.get_forces()

    te = card["test_errors"]
    de_mev = 1e3 * abs(e - e_ref)
    f_rmse_mev = 1e3 * float(np.sqrt(np.mean((f - f_ref) ** 2)))
    e_tol = E_FACTOR * te["energy_rmse_meV_per_atom"] + E_FLOOR_MEV
    f_tol = F_FACTOR * te["forces_rmse_meV_per_A"] + F_FLOOR_MEV
    assert de_mev < e_tol, f"{name}: |dE| {de_mev:.2f} meV/atom > {e_tol:.2f}"
    assert f_rmse_mev < f_tol, f"{name}: force RMSE {f_rmse_mev:.1f} meV/A > {f_tol:.1f}"


def test_card_fields(card):
    for key in ("name", "file", "file_sha256", "elements", "atomic_numbers", "dtype",
                "architecture", "data", "test_errors", "training", "date", "versions",
                "seed", "rebuild_command"):
        assert key in card, key
    arch = card["architecture"]
    for key in ("num_channels", "hidden_irreps", "max_ell", "correlation",
                "num_interactions", "r_max", "num_parameters"):
        assert key in arch, key
    for key in ("energy_rmse_meV_per_atom", "energy_mae_meV_per_atom",
                "forces_rmse_meV_per_A", "forces_mae_meV_per_A", "stress_rmse_meV_per_A3"):
        assert key in card["test_errors"], key
        assert card["test_errors"][key] >= 0
    assert len(card["data"]["sha256"]) == 64
    assert card["training"]["wall_time_s"] > 0
    assert "mace-torch" in card["versions"] and "torch" in card["versions"]
    assert "train_default_mace.py" in card["rebuild_command"]
    assert "make_mace_data.py" in card["rebuild_command"]
    # the targets the model was accepted against (EMT, test split)
    assert card["test_errors"]["energy_rmse_meV_per_atom"] <= 5.0
    assert card["test_errors"]["forces_rmse_meV_per_A"] <= 50.0


def test_card_matches_model(card, model):
    from ase.data import atomic_numbers

    zs = [int(z) for z in model.atomic_numbers]
    assert card["atomic_numbers"] == zs
    assert [atomic_numbers[s] for s in card["elements"]] == zs
    assert card["architecture"]["r_max"] == pytest.approx(float(model.r_max))
    assert card["architecture"]["num_interactions"] == int(model.num_interactions)
    assert card["architecture"]["num_parameters"] == sum(p.numel() for p in model.parameters())
    dtype = next(model.parameters()).dtype
    assert card["dtype"] == {torch.float64: "float64", torch.float32: "float32"}[dtype]


def test_card_data_hash_matches_shipped_data(card):
    files = [DATA / n for n in ("train.xyz", "valid.xyz", "test.xyz")]
    if not all(f.exists() for f in files):
        pytest.skip("training data not present (scripts/make_mace_data.py regenerates it)")
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    assert h.hexdigest() == card["data"]["sha256"]
