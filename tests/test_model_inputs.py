"""What a model sees: the system's cell and pbc on every rank, and the inputs it declares
(per-atom charges from the structure file's initial_charges, the total charge from
system.charge; engine/run/model_inputs.py), on 1, 2 and 4 domains over MD steps with
migrations, against a brute-force single-process float64 evaluation (tests/charge_model.py:
every pair over explicit images, no neighbour list); a restart keeps the charges bit for bit;
bad inputs are refused in one line through the CLI."""
import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import WorldTask, run_engine, run_in_process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import charge_model as C  # noqa: E402

from shardmd.engine.io.h5md import read_frames  # noqa: E402

TOTAL = 0.7
ARGS = ["model=py:charge_model:make", "steps=40", "dt=2", "temperature=300", "neighbor.skin=0.3", "trajectory.every=10",
        "trajectory.fields=[position,velocity,force,energies]", "thermo.every=0", "quiet=true",
        "checkpoint.every=0", "threads=1", f"system.charge={TOTAL}"]
TOL = 1e-10


def _sample_file(factory) -> Path:
    """The extxyz input (108 Ar atoms, random initial_charges), written once per session."""
    path = factory.getbasetemp() / "charges.extxyz"
    if not path.exists():
        from ase.io import write

        write(path, C.sample())
    return path


def world_tasks(item):
    if item.originalname == "test_k_domains_equal_brute_force":
        k = item.callspec.params["k"]
        return [WorldTask(k, f"inputs_run{k}", "model_inputs", [
            *ARGS, lambda f: f"system.file={_sample_file(f)}", "model.record={out}/seen", "output={out}/run.h5"])]
    if item.originalname == "test_restart_keeps_the_charges_bit_exact":
        file = lambda f: f"system.file={_sample_file(f)}"  # noqa: E731
        return [WorldTask(2, "inputs_run2", "model_inputs", [
                    *ARGS, file, "model.record={out}/seen", "output={out}/run.h5"]),
                WorldTask(2, "inputs_split2", "model_inputs", [*ARGS[:1], "steps=20", *ARGS[2:], file,
                                                               "output={out}/split.h5"]),
                # system.charges on a restart is not read: the checkpoint's charges are kept
                WorldTask(2, "inputs_restart2", "model_inputs", [
                    *ARGS, file, "restart=auto", "system.charges={Ar: 0.3}", "output={out}/../inputs_split2/split.h5"])]
    return []


def _file_charges(path) -> np.ndarray:
    from ase.io import read

    return read(path).get_initial_charges()   # as the file holds them (the writer rounds)


def _assert_frames_equal_brute_force(h5, charges):
    frames = read_frames(h5)
    assert [f.info["step"] for f in frames] == [0, 10, 20, 30, 40]
    worst = {"forces": 0.0, "energies": 0.0, "energy": 0.0}
    for f in frames:
        ref = C.brute_force(f.positions, f.cell.array, f.pbc, charges, TOTAL)
        worst["forces"] = max(worst["forces"], np.abs(f.get_forces() - ref["forces"]).max())
        worst["energies"] = max(worst["energies"], np.abs(f.get_potential_energies() - ref["energies"]).max())
        worst["energy"] = max(worst["energy"], abs(f.get_potential_energy() - ref["energy"]))
    print(f"{h5.name}: largest |difference| from brute force over {len(frames)} frames: "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    assert max(worst.values()) <= TOL, worst
    # the charges move the atoms: the same run without them is another trajectory
    neutral = C.brute_force(frames[-1].positions, frames[-1].cell.array, frames[-1].pbc, 0 * charges, 0.0)
    assert np.abs(frames[-1].get_forces() - neutral["forces"]).max() > 1e-3
    return frames


def _assert_saw_the_system(prefix: Path, ranks: int, cell):
    files = sorted(prefix.parent.glob(prefix.name + ".*"))
    assert len(files) == ranks, files
    for p in files:
        seen = [json.loads(line) for line in p.read_text().splitlines()]
        assert seen and all(s["pbc"] == [True, True, True] for s in seen), (p, seen)
        assert all(np.array_equal(np.asarray(s["cell"]), cell) for s in seen), p


def test_brute_force_reference_is_independent_of_the_model():
    """The reference against the model on a list of its own (one process) and finite differences."""
    import torch

    from shardmd.domain.neighbors import build_neighbor_list

    a = C.sample((2, 2, 2))
    a.wrap()
    q = a.get_initial_charges()
    ref = C.brute_force(a.positions, a.cell.array, a.pbc, q, TOTAL)
    x = torch.tensor(a.positions, requires_grad=True)
    h = torch.tensor(a.cell.array)
    nl = build_neighbor_list(x.detach(), h, (True,) * 3, C.CUTOFF + 0.5)
    out = C.make().compute(x, h, (True,) * 3, torch.tensor(a.numbers), nl, charges=torch.tensor(q),
                           charge=torch.tensor([TOTAL], dtype=torch.float64))
    forces = -torch.autograd.grad(out["energy"], x)[0].numpy()
    assert np.abs(forces - ref["forces"]).max() < 1e-13
    step = 1e-5
    for atom, axis in ((0, 0), (5, 2)):
        e = []
        for sign in (1, -1):
            p = a.positions.copy()
            p[atom, axis] += sign * step
            e.append(C.brute_force(p, a.cell.array, a.pbc, q, TOTAL)["energy"])
        assert abs(-(e[0] - e[1]) / (2 * step) - ref["forces"][atom, axis]) < 1e-7
    # the total charge enters the energy and the forces
    other = C.brute_force(a.positions, a.cell.array, a.pbc, q, -TOTAL)
    assert np.abs(other["forces"] - ref["forces"]).max() > 1e-4


def test_one_domain_equals_brute_force(tmp_path, tmp_path_factory):
    from shardmd.engine import Simulation, compose_config

    src = _sample_file(tmp_path_factory)
    sim = Simulation(compose_config([*ARGS, f"system.file={src}", f"output={tmp_path}/run.h5"]))
    sim.run()
    assert sim.model.seen and all(s[0] == [True] * 3 for s in sim.model.seen)
    _assert_frames_equal_brute_force(tmp_path / "run.h5", _file_charges(src))
    assert "inputs" not in h5py.File(tmp_path / "run.h5", "r")   # the trajectory is unchanged
    with h5py.File(sorted((tmp_path / "run.ckpt").glob("step-*.h5"))[-1], "r") as f:
        assert np.array_equal(f["inputs/atoms/charges"][()], _file_charges(src))
        assert f["inputs/system/charge"][()].tolist() == [TOTAL]


@pytest.mark.mpi
@pytest.mark.parametrize("k", [2, 4])
def test_k_domains_equal_brute_force(k, mpi_world, tmp_path_factory):
    out = mpi_world(k, f"inputs_run{k}")
    src = _sample_file(tmp_path_factory)
    frames = _assert_frames_equal_brute_force(out / "run.h5", _file_charges(src))
    _assert_saw_the_system(out / "seen", k, frames[0].cell.array)
    log = (out / "run.log").read_text()
    assert f"domains {k}" in log
    migrations = int(log.split(" atom migrations")[0].rsplit(None, 1)[-1])
    print(f"{k} domains: {migrations} atom migrations")
    assert migrations > 0, log


@pytest.mark.mpi
def test_restart_keeps_the_charges_bit_exact(mpi_world, tmp_path_factory):
    full = read_frames(mpi_world(2, "inputs_run2") / "run.h5")[-1]
    split = mpi_world(2, "inputs_split2")
    mpi_world(2, "inputs_restart2")
    cont = read_frames(split / "split.h5")
    assert [f.info["step"] for f in cont][-1] == 40
    last = cont[-1]
    for get in (lambda a: a.positions, lambda a: a.get_velocities(), lambda a: a.get_forces(),
                lambda a: a.get_potential_energies()):
        assert np.array_equal(get(last), get(full))
    with h5py.File(sorted((split / "split.ckpt").glob("step-*.h5"))[-1], "r") as f:
        assert np.array_equal(f["inputs/atoms/charges"][()], _file_charges(_sample_file(tmp_path_factory)))


# -- bad input: one line through the CLI ---------------------------------------------------------
def _write(path, atoms):
    from ase.io import write

    write(path, atoms)
    return path


def _cli(tmp_path, capfd, monkeypatch, *extra):
    code, lines = run_in_process(["run", *ARGS[:1], "steps=2", "quiet=true", f"output={tmp_path}/o.h5", *extra],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_file_without_charges_names_the_array_and_the_key(tmp_path, capfd, monkeypatch):
    a = C.sample((2, 2, 2))
    a.set_initial_charges(None)
    src = _write(tmp_path / "plain.extxyz", a)
    line = _cli(tmp_path, capfd, monkeypatch, f"system.file={src}")
    assert "charges" in line and "initial_charges" in line and "system.charges=" in line, line
    # the same system with the charges given by element runs
    code, lines = run_in_process(["run", *ARGS[:1], "steps=2", "quiet=true", f"output={tmp_path}/ok.h5",
                                  f"system.file={src}", "system.charges={Ar: 0.2}"], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    with h5py.File(sorted((tmp_path / "ok.ckpt").glob("step-*.h5"))[-1], "r") as f:
        assert f["inputs/atoms/charges"][()].tolist() == [0.2] * len(a)
        assert f["inputs/system/charge"][()].tolist() == [0.0]   # no system.charge, no file entry: 0


def test_builder_without_charges_is_refused(tmp_path, capfd, monkeypatch):
    line = _cli(tmp_path, capfd, monkeypatch, "system.repeat=[2,2,2]")
    assert "the starting system has no initial_charges" in line and "system.charges=" in line, line


def test_non_finite_charges_are_refused(tmp_path, capfd, monkeypatch):
    a = C.sample((2, 2, 2))
    q = a.get_initial_charges()
    q[7] = np.nan
    a.set_initial_charges(q)
    line = _cli(tmp_path, capfd, monkeypatch, f"system.file={_write(tmp_path / 'nan.extxyz', a)}")
    assert "charges of atom id 7 is nan (not finite)" in line, line


def test_a_charges_list_of_the_wrong_length_is_refused(tmp_path, capfd, monkeypatch):
    src = _write(tmp_path / "q.extxyz", C.sample((2, 2, 2)))
    line = _cli(tmp_path, capfd, monkeypatch, f"system.file={src}", "system.charges=[0.1,-0.1]")
    assert "system.charges has 2 values but the system holds 32 atoms" in line, line
    line = _cli(tmp_path, capfd, monkeypatch, f"system.file={src}", "system.charges={Na: 1.0}")
    assert "system.charges gives no value for Ar" in line, line
    line = _cli(tmp_path, capfd, monkeypatch, f"system.file={src}", "system.charges={Ar: .nan}")
    assert "system.charges" in line and "finite" in line, line


def test_charges_in_a_damaged_checkpoint_are_refused(tmp_path, tmp_path_factory):
    from shardmd.engine.errors import UserError
    from shardmd.engine.io.checkpoint import read_checkpoint
    from shardmd.engine.run.simulation import Simulation

    src = _sample_file(tmp_path_factory)
    from shardmd.engine import compose_config

    Simulation(compose_config([*ARGS[:1], "steps=0", "quiet=true", f"system.file={src}",
                               f"output={tmp_path}/run.h5"])).run()
    good = sorted((tmp_path / "run.ckpt").glob("step-*.h5"))[-1]
    assert np.array_equal(read_checkpoint(good)["inputs"]["atoms"]["charges"], _file_charges(src))
    cases = {"nan": ("charges", lambda q: np.where(np.arange(len(q)) == 3, np.nan, q), "non-finite"),
             "short": ("charges", lambda q: q[:-1], "expected (108,)"),
             "name": ("bad name!", lambda q: q, "not a valid input name")}
    for tag, (name, change, says) in cases.items():
        bad = tmp_path / f"{tag}.h5"
        shutil.copy(good, bad)
        with h5py.File(bad, "r+") as f:
            q = f["inputs/atoms/charges"][()]
            del f["inputs/atoms/charges"]
            f["inputs/atoms"].create_dataset(name, data=change(q))
        with pytest.raises(UserError) as exc:
            read_checkpoint(bad)
        assert says in exc.value.one_line() and "\n" not in str(exc.value), (tag, exc.value.one_line())


def test_a_model_without_inputs_sees_the_system_and_writes_no_inputs(tmp_path):
    """Morse declares no inputs: no inputs/ in its checkpoint; on 1 domain it is called as before."""
    from shardmd.engine import Simulation, compose_config

    sim = Simulation(compose_config(["model=morse", "system.repeat=[3,3,3]", "steps=2", "quiet=true",
                                     f"output={tmp_path}/m.h5"]))
    assert sim.state.inputs == {} and sim.state.system_inputs == {}
    sim.run()
    with h5py.File(sorted((tmp_path / "m.ckpt").glob("step-*.h5"))[-1], "r") as f:
        assert "inputs" not in f


@pytest.mark.slow
@pytest.mark.mpi
def test_self_launched_cli_on_two_domains(tmp_path, tmp_path_factory):
    """python -m engine run model=py:charge_model:make domains=2, from a folder holding the model."""
    shutil.copy(HERE / "charge_model.py", tmp_path / "charge_model.py")
    src = _sample_file(tmp_path_factory)
    r = run_engine(["run", *ARGS, f"system.file={src}", "domains=2", "output=cli.h5"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_frames_equal_brute_force(tmp_path / "cli.h5", _file_charges(src))


def test_ase_calculator_passes_the_atoms_charges():
    """ShardMDCalculator gives the model the Atoms' initial charges and info charge; new charges
    are a new system (rebuilt), and an Atoms object without them is refused in one line."""
    from shardmd.engine.ase_calculator import ShardMDCalculator

    a = C.sample((2, 2, 2))
    a.wrap()
    a.info["charge"] = TOTAL
    calc = ShardMDCalculator(model="py:charge_model:make")
    a.calc = calc
    ref = C.brute_force(a.positions, a.cell.array, a.pbc, a.get_initial_charges(), TOTAL)
    assert np.abs(a.get_forces() - ref["forces"]).max() <= 1e-12
    assert abs(a.get_potential_energy() - ref["energy"]) <= 1e-12
    q = a.get_initial_charges()
    q[0] += 0.3
    a.set_initial_charges(q)
    ref = C.brute_force(a.positions, a.cell.array, a.pbc, q, TOTAL)
    assert np.abs(a.get_forces() - ref["forces"]).max() <= 1e-12 and calc.stats["builds"] == 2
    a.set_initial_charges(None)
    with pytest.raises(ValueError, match="has no initial_charges .or charges. array") as exc:
        a.get_forces()
    assert "\n" not in str(exc.value)


def test_per_system_inputs_come_from_the_config_then_the_file_then_defaults():
    from shardmd.engine import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.run import model_inputs
    from shardmd.engine.run.state import State

    class Declares:   # what DistributedModel offers the engine
        point_inputs, system_inputs, model = (), ("charge", "spin"), None

    atoms = C.sample((1, 1, 1))
    atoms.info["spin"] = 3
    atoms.info["charge"] = 2.0
    got = model_inputs.complete(compose_config(["model=lj", "system.charge=-1"]), State.from_atoms(atoms),
                                Declares(), atoms).system_inputs
    assert {k: v.tolist() for k, v in got.items()} == {"charge": [-1.0], "spin": [3.0]}   # config, then file
    got = model_inputs.complete(compose_config(["model=lj"]), State.from_atoms(atoms), Declares(), None).system_inputs
    assert {k: v.tolist() for k, v in got.items()} == {"charge": [0.0], "spin": [1.0]}    # defaults
    Declares.system_inputs = ("field",)
    with pytest.raises(UserError, match="takes the per-system input field and .* has no field entry"):
        model_inputs.complete(compose_config(["model=lj"]), State.from_atoms(atoms), Declares(), atoms)
    atoms.info["field"] = [0.1, 0.2, 0.3]   # any other name: the file's info entry, (1, F)
    got = model_inputs.complete(compose_config(["model=lj"]), State.from_atoms(atoms), Declares(), atoms)
    assert got.system_inputs["field"].tolist() == [[0.1, 0.2, 0.3]]


def test_a_checkpoint_as_the_structure_keeps_its_charges(tmp_path, tmp_path_factory):
    """system.file=<checkpoint>: its charges and total charge are the new run's."""
    from shardmd.engine import Simulation, compose_config
    from shardmd.engine.io.ase_io import checkpoint_atoms

    src = _sample_file(tmp_path_factory)
    Simulation(compose_config([*ARGS[:1], "steps=0", "quiet=true", f"system.file={src}", "system.charge=-2",
                               f"output={tmp_path}/a.h5"])).run()
    ckpt = sorted((tmp_path / "a.ckpt").glob("step-*.h5"))[-1]
    atoms = checkpoint_atoms(str(ckpt))
    assert np.array_equal(atoms.get_initial_charges(), _file_charges(src)) and atoms.info["charge"] == -2.0
    sim = Simulation(compose_config([*ARGS[:1], "steps=0", "quiet=true", f"system.file={ckpt}",
                                     f"output={tmp_path}/b.h5"]))
    assert sim.state.system_inputs["charge"].tolist() == [-2.0]
    assert np.array_equal(sim.state.inputs["charges"][np.argsort(sim.state.ids.numpy())].numpy(), _file_charges(src))
