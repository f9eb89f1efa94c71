#!/usr/bin/env python
"""Train ShardMD's default small MACE model for Cu on the EMT data of make_mace_data.py.

Uses mace-torch's own trainer (mace.cli.run_train.run, i.e. what `mace_run_train`
runs) with a fixed argument list, then evaluates the shipped model on the test split
with mace's ASE calculator and writes a JSON model card beside it.

    python scripts/make_mace_data.py --seed 0
    python scripts/train_default_mace.py --seed 0 --device cpu     # ~7-10 min on 2 idle cores
    python scripts/train_default_mace.py --seed 0 --device cuda

Outputs
    models/data/cu_mace_small.model   the stage-two (SWA) model saved by mace, on CPU,
                                      float64 (shardmd.models.mace.load_mace, or
                                      torch.load(..., weights_only=False) after `import mace`
                                      for a file you trust; MACECalculator(model_paths=...))
    models/data/cu_mace_small.json    model card (architecture, data hash, test errors,
                                      versions, wall time, rebuild command)
    runs/mace_cu_small/               mace's own logs, checkpoints, results (git-ignored)

Determinism: python/numpy/torch are seeded (mace seeds numpy and torch again with the
same seed), CPU training uses a fixed thread count (--threads, default 2), so a re-run
with the same seed, data and thread count on the same machine is expected to repeat;
CUDA training is not bit-reproducible (atomic scatter-adds).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "scripts" / "data" / "mace_cu"
MODEL_OUT = REPO / "models" / "data" / "cu_mace_small.model"
WORK = REPO / "runs" / "mace_cu_small"
NAME = "cu_mace_small"
DATA_FILES = ("train.xyz", "valid.xyz", "test.xyz")


def data_sha256(folder: Path) -> tuple[str, dict]:
    """SHA-256 of train.xyz + valid.xyz + test.xyz concatenated (as make_mace_data.py)."""
    total = hashlib.sha256()
    per = {}
    for name in DATA_FILES:
        b = (folder / name).read_bytes()
        total.update(b)
        per[name] = hashlib.sha256(b).hexdigest()
    return total.hexdigest(), per


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def emt_isolated_atom_energy() -> float:
    from ase import Atoms
    from ase.calculators.emt import EMT

    atom = Atoms("Cu", positions=[[0.0, 0.0, 0.0]], cell=[20.0] * 3, pbc=True)
    atom.calc = EMT()
    return float(atom.get_potential_energy())


def evaluate(model_path, xyz_path, device="cpu", dtype="float64"):
    """Errors of a saved MACE model vs the REF_* labels of an extxyz file.

    Returns a dict: energy RMSE/MAE (meV/atom), forces RMSE/MAE (meV/A, over all
    Cartesian components), stress RMSE/MAE (meV/A^3, over the 6 Voigt components of
    periodic cells), plus the raw arrays under "_arrays" for plotting.
    """
    import mace  # noqa: F401  (before e3nn objects are unpickled)
    from ase.io import read
    from mace.calculators import MACECalculator

    calc = MACECalculator(model_paths=str(model_path), device=device, default_dtype=dtype)
    e_ref, e_pred, f_ref, f_pred, s_ref, s_pred, nat = [], [], [], [], [], [], []
    for atoms in read(str(xyz_path), index=":"):
        ref_e = atoms.info["REF_energy"]
        ref_f = atoms.arrays["REF_forces"].copy()
        ref_s = np.asarray(atoms.info["REF_stress"], dtype=float).reshape(-1)
        atoms.calc = calc
        e_ref.append(ref_e / len(atoms))
        e_pred.append(atoms.get_potential_energy() / len(atoms))
        f_ref.append(ref_f)
        f_pred.append(atoms.get_forces())
        s_ref.append(ref_s)
        s_pred.append(atoms.get_stress(voigt=True))
        nat.append(len(atoms))
    e_ref, e_pred = np.array(e_ref), np.array(e_pred)
    f_ref, f_pred = np.concatenate(f_ref), np.concatenate(f_pred)
    s_ref, s_pred = np.array(s_ref), np.array(s_pred)
    de, df, ds = e_pred - e_ref, f_pred - f_ref, s_pred - s_ref
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
    mae = lambda x: float(np.mean(np.abs(x)))  # noqa: E731
    return {
        "n_configs": int(len(nat)),
        "n_atoms": int(sum(nat)),
        "energy_rmse_meV_per_atom": 1e3 * rms(de),
        "energy_mae_meV_per_atom": 1e3 * mae(de),
        "forces_rmse_meV_per_A": 1e3 * rms(df),
        "forces_mae_meV_per_A": 1e3 * mae(df),
        "forces_max_abs_err_meV_per_A": 1e3 * float(np.abs(df).max()),
        "stress_rmse_meV_per_A3": 1e3 * rms(ds),
        "stress_mae_meV_per_A3": 1e3 * mae(ds),
        "_arrays": {"e_ref": e_ref, "e_pred": e_pred, "f_ref": f_ref, "f_pred": f_pred,
                    "s_ref": s_ref, "s_pred": s_pred},
    }


def mace_argv(a, e0: float) -> list[str]:
    start_swa = a.stage_two_start
    argv = [
        f"--name={NAME}",
        f"--seed={a.seed}",
        f"--work_dir={WORK}",
        f"--model_dir={WORK}",
        f"--train_file={a.data / 'train.xyz'}",
        f"--valid_file={a.data / 'valid.xyz'}",
        f"--test_file={a.data / 'test.xyz'}",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--stress_key=REF_stress",
        f"--E0s={{29: {e0!r}}}",
        "--model=MACE",
        f"--hidden_irreps={a.hidden_irreps}",
        "--MLP_irreps=16x0e",
        f"--max_ell={a.max_ell}",
        f"--correlation={a.correlation}",
        f"--num_interactions={a.num_interactions}",
        f"--r_max={a.r_max}",
        "--num_radial_basis=8",
        "--num_cutoff_basis=5",
        "--scaling=rms_forces_scaling",
        "--loss=stress",
        "--energy_weight=1.0",
        "--forces_weight=100.0",
        "--stress_weight=100.0",
        "--swa",
        f"--start_swa={start_swa}",
        "--swa_energy_weight=1000.0",
        "--swa_forces_weight=100.0",
        "--swa_stress_weight=100.0",
        f"--swa_lr={a.lr / 10}",
        "--ema",
        "--ema_decay=0.99",
        "--optimizer=adam",
        "--amsgrad",
        f"--lr={a.lr}",
        "--scheduler=ExponentialLR",
        f"--lr_scheduler_gamma={a.lr_gamma}",
        f"--batch_size={a.batch_size}",
        "--valid_batch_size=8",
        f"--max_num_epochs={a.epochs}",
        "--patience=1000",
        "--eval_interval=1",
        "--error_table=PerAtomRMSEstressvirials",
        f"--default_dtype={a.dtype}",
        f"--device={a.device}",
        "--save_cpu",
        "--num_workers=0",
        "--pin_memory=False",
        "--plot=False",
        "--log_level=INFO",
    ]
    return argv


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (CPU runs)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=MODEL_OUT)
    p.add_argument("--epochs", type=int, default=29)
    p.add_argument("--stage-two-start", type=int, default=23,
                   help="epoch at which stage two (energy weight 1000, lr/10) starts")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--lr-gamma", type=float, default=0.96, help="ExponentialLR per epoch")
    p.add_argument("--hidden-irreps", default="32x0e")
    p.add_argument("--max-ell", type=int, default=2)
    p.add_argument("--correlation", type=int, default=2)
    p.add_argument("--num-interactions", type=int, default=2)
    p.add_argument("--r-max", type=float, default=5.0)
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run in runs/mace_cu_small from its latest "
                        "checkpoint (mace --restart_latest) up to --epochs")
    p.add_argument("--skip-train", action="store_true",
                   help="reuse the model already in runs/mace_cu_small and only redo the "
                        "copy + model card (training wall time then read from the card)")
    a = p.parse_args(argv)
    a.data = a.data.resolve()
    a.out = a.out.resolve()

    # ------------------------------------------------------------ determinism
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import mace
    import torch
    from mace import tools
    from mace.cli.run_train import run as mace_run

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
        torch.set_num_interop_threads(1)

    # ------------------------------------------------------------ data + E0
    for name in DATA_FILES:
        if not (a.data / name).exists():
            sys.exit(f"missing {a.data / name}: run scripts/make_mace_data.py first")
    digest, per_file = data_sha256(a.data)
    e0 = emt_isolated_atom_energy()
    print(f"data {a.data}  sha256 {digest}\nE0(Cu, EMT isolated atom) = {e0} eV", flush=True)

    margv = mace_argv(a, e0) + (["--restart_latest"] if a.resume else [])
    phases_file = WORK / "phases.json"  # one record per (possibly resumed) training run
    if not a.skip_train:
        if not a.resume:
            if WORK.exists():  # mace loads the latest checkpoint it finds: start clean
                shutil.rmtree(WORK)
            WORK.mkdir(parents=True)
            phases_file.write_text("[]\n")
        elif not phases_file.exists():
            sys.exit(f"--resume: no earlier run in {WORK}")
        (WORK / "mace_argv.txt").write_text("\n".join(margv) + "\n")
        t0 = time.time()
        mace_run(tools.build_default_arg_parser().parse_args(margv))
        phase_wall = time.time() - t0
        phases = json.loads(phases_file.read_text())
        phases.append({"argv": sys.argv[1:] if argv is None else list(argv),
                       "wall_s": round(phase_wall, 1), "completed": True,
                       "end": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()})
        phases_file.write_text(json.dumps(phases, indent=2) + "\n")
        print(f"training wall time {phase_wall:.0f} s", flush=True)
    phases = json.loads(phases_file.read_text())
    wall = sum(ph["wall_s"] for ph in phases)

    trained = WORK / f"{NAME}_stagetwo.model"
    if not trained.exists():
        trained = WORK / f"{NAME}.model"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(trained, a.out)

    # ------------------------------------------------------------ card
    from mace.tools.scripts_utils import extract_config_mace_model

    # through the engine's safe loader: the shipped model must load without trust_pickle, so a
    # model that needs a class outside its allow-list fails here, not in users' first run
    from shardmd.models.mace_safe_load import load_safely

    model = load_safely(a.out, map_location="cpu")
    cfg = extract_config_mace_model(model)
    n_params = int(sum(p_.numel() for p_ in model.parameters()))
    errors = {}
    for split in ("test", "valid", "train"):
        res = evaluate(a.out, a.data / f"{split}.xyz", device="cpu", dtype="float64")
        res.pop("_arrays")
        errors[split] = res
        print(f"{split:5s}: E RMSE {res['energy_rmse_meV_per_atom']:.2f} meV/atom, "
              f"F RMSE {res['forces_rmse_meV_per_A']:.1f} meV/A, "
              f"S RMSE {res['stress_rmse_meV_per_A3']:.3f} meV/A^3", flush=True)

    import ase
    import e3nn

    try:
        from importlib.metadata import version
        mace_version = version("mace-torch")
    except Exception:  # noqa: BLE001 - no metadata: fall back to the module attribute
        mace_version = getattr(mace, "__version__", "unknown")
    hidden = str(cfg["hidden_irreps"])
    channels = int(hidden.split("x")[0])
    rebuild = [
        f"python scripts/make_mace_data.py --seed {a.seed}",
        ("python scripts/train_default_mace.py " + " ".join(
            shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])
            if x not in ("--skip-train", "--resume"))).strip(),
    ]
    card = {
        "name": NAME,
        "file": str(a.out.relative_to(REPO)) if a.out.is_relative_to(REPO) else str(a.out),
        "file_sha256": file_sha256(a.out),
        "file_size_bytes": a.out.stat().st_size,
        "description": "Small MACE model for Cu trained on ASE's EMT potential "
                       "(reproduces EMT, not DFT).",
        "reference_potential": "ase.calculators.emt.EMT",
        "elements": ["Cu"],
        "atomic_numbers": [int(z) for z in model.atomic_numbers.tolist()],
        "dtype": a.dtype,
        "architecture": {
            "model_class": type(model).__name__,
            "num_channels": channels,
            "hidden_irreps": hidden,
            "MLP_irreps": str(cfg["MLP_irreps"]),
            "max_ell": int(cfg["max_ell"]),
            "correlation": int(np.ravel(cfg["correlation"])[0]),
            "num_interactions": int(cfg["num_interactions"]),
            "r_max": float(model.r_max),
            "num_bessel": int(cfg["num_bessel"]),
            "num_polynomial_cutoff": int(cfg["num_polynomial_cutoff"]),
            "interaction_cls": cfg["interaction_cls"].__name__,
            "avg_num_neighbors": float(cfg["avg_num_neighbors"]),
            "atomic_energies_eV": [float(x) for x in np.asarray(cfg["atomic_energies"]).ravel()],
            "atomic_inter_scale": float(np.asarray(cfg.get("atomic_inter_scale", 1.0)).ravel()[0]),
            "atomic_inter_shift": float(np.asarray(cfg.get("atomic_inter_shift", 0.0)).ravel()[0]),
            "num_parameters": n_params,
        },
        "data": {
            "folder": str(a.data.relative_to(REPO)) if a.data.is_relative_to(REPO) else str(a.data),
            "sha256": digest,
            "sha256_note": "SHA-256 of train.xyz + valid.xyz + test.xyz concatenated in that order",
            "files_sha256": per_file,
            "units": {"energy": "eV per configuration", "forces": "eV/A",
                      "stress": "eV/A^3, Voigt-6 (xx, yy, zz, yz, xz, xy)"},
            "E0_eV": e0,
        },
        "test_errors": errors["test"],
        "valid_errors": errors["valid"],
        "train_errors": errors["train"],
        "errors_note": "energy per atom; forces over all Cartesian components; stress over "
                       "the 6 Voigt components; evaluated on CPU in float64 with "
                       "mace.calculators.MACECalculator",
        "training": {
            "wall_time_s": round(wall, 1),
            "wall_time_note": "sum of training_phases (mace training + its own test "
                              "evaluation; not data generation); strongly affected by "
                              "other jobs on a shared machine (see the phases' notes)",
            "device": a.device,
            "torch_threads": torch.get_num_threads() if a.device == "cpu" else None,
            "cpu": platform.processor() or platform.machine(),
            "epochs": a.epochs,
            "stage_two_start_epoch": a.stage_two_start,
            "batch_size": a.batch_size,
            "lr": a.lr,
            "lr_scheduler": f"ExponentialLR gamma={a.lr_gamma}",
            "loss": "mace --loss=stress: energy 1, forces 100, stress 100; "
                    "stage two (mace --swa): energy 1000, forces 100, stress 100, lr/10",
            "ema_decay": 0.99,
            "mace_run_train_args": margv,
        },
        "seed": a.seed,
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "versions": {
            "mace-torch": mace_version,
            "torch": torch.__version__,
            "e3nn": e3nn.__version__,
            "ase": ase.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "rebuild_command": " && ".join(rebuild),
        "training_phases": phases,
        "good_for": "Cu near EMT physics: bulk fcc, vacancies, surfaces, strained/sheared "
                    "cells within ~+-4 %, liquid at EMT-like conditions",
        "not_for": "real Cu (DFT) accuracy, other elements, extreme compression, "
                   "anything far from the training data",
    }
    card_path = a.out.with_suffix(".json")
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    size_mb = a.out.stat().st_size / 1e6
    print(f"wrote {a.out} ({size_mb:.2f} MB, {n_params} parameters) and {card_path}")


if __name__ == "__main__":
    main()
