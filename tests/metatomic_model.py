"""metatrain's PET with random weights, exported as a metatomic model file (built offline: no
download).  The architecture is PET's own (metatrain.pet); only its sizes are small, so that
tests on two cores stay short.  Needs metatrain (``pip install metatrain``)."""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

#: PET's sizes for the tests: two GNN layers of a 3 Å cutoff (metatrain declares an interaction
#: range of 6 Å; the receptive field is 9 Å, models/metatomic.py ``pet_range``)
SMALL = {"cutoff": 3.0, "cutoff_width": 0.5, "d_pet": 16, "d_head": 16, "d_node": 32, "d_feedforward": 32,
         "num_heads": 2, "num_attention_layers": 1, "num_gnn_layers": 2}


def build_pet(path, species=(28, 29), seed: int = 0, dtype: torch.dtype = torch.float64, **hypers) -> Path:
    """Write a PET with random weights (drawn from ``seed``) for ``species`` (atomic numbers)
    to ``path`` (metatomic's AtomisticModel.save); energy in eV, lengths in Å."""
    from metatomic.torch import ModelMetadata
    from metatrain.utils.architectures import get_default_hypers, import_architecture
    from metatrain.utils.data import DatasetInfo
    from metatrain.utils.data.target_info import get_energy_target_info

    model_hypers = copy.deepcopy(get_default_hypers("pet")["model"])
    model_hypers.update(SMALL)
    model_hypers.update(hypers)
    info = DatasetInfo(length_unit="angstrom", atomic_types=sorted(int(z) for z in species),
                       targets={"energy": get_energy_target_info("energy", {"quantity": "energy", "unit": "eV"})})
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = import_architecture("pet").__model__(model_hypers, info).to(dtype)
        exported = model.export(metadata=ModelMetadata(name="PET, random weights"))
        exported.save(str(path))
    return Path(path)


if __name__ == "__main__":
    import sys

    print(build_pet(sys.argv[1] if len(sys.argv) > 1 else "pet_random.pt"))
