"""ORB (orb-models 0.5.5, unmodified) through the specs, against orb-models' own ``ORBCalculator``
(its k-d tree graph with the neighbour cap, its heads, for conservative models its autograd
forces and stress: an independent, single-process reference), in float64: orb-v3 direct and
conservative models and an orb-v2 network with random weights (tests/orb_cases.py), periodic and
open (direct: the net torque removed); our capped graph against orb-models' own graph builder; a
checkpoint in orb-models' release format (a bare state dict) loaded as data, and a released name
resolved from the local download cache only; the CLI on 1, 2 and 4 domains (real MPI ranks)
through 50 hot Langevin steps with migrations, and across a restart; OrbMol's charge/spin
conditioner (orb-v3 -omol) against ORBCalculator given atoms.info, and on 1 and 2 domains; a perfect lattice whose
neighbour cap cuts a shell of equal distances (the same cap on 1 and 4 domains); the refusals,
one line each (exit status 2 through the CLI); without orb-models, the install command in one
line (runs where orb-models is absent too).
"""
import importlib.util
import warnings

import numpy as np
import pytest
import torch
from ase.io import write
from conftest import run_engine
from family_checks import assert_install_line, assert_restart_bit_exact, save_hostile

from shardmd.engine.io.h5md_read import read_frames

HAVE_ORB = importlib.util.find_spec("orb_models") is not None
needs_orb = pytest.mark.skipif(not HAVE_ORB, reason="orb-models is not installed (pip install 'shardmd[orb]' in its "
                                                    "own environment)")
# orb_cases.orb_graph and write_v2_checkpoint import orb-models 0.5's featurization_utilities and SystemConfig, which
# orb-models 0.7 removed (its graph builder is in orb_models.common.atoms; the cap is no longer the network's)
ORB_05 = HAVE_ORB and importlib.util.find_spec("orb_models.forcefield.featurization_utilities") is not None
needs_orb_05 = pytest.mark.skipif(HAVE_ORB and not ORB_05, reason="orb_cases' helper uses orb-models 0.5 modules "
                                  "(featurization_utilities, SystemConfig) absent in 0.7")
TOL = 1e-10
CLI = ["run", "model=orb", "precision=float64", "steps=50", "dt=2.0", "temperature=900", "integrator=langevin",
       "trajectory.every=50", "thermo.every=0", "checkpoint.every=0", "quiet=true", "threads=1", "neighbor.skin=0.4"]


def _ours(**kw):
    from shardmd.engine.ase_calculator import ShardMDCalculator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ShardMDCalculator(model="orb", **kw)


def _close(got, want, tol=TOL, what=""):
    for k, (x, y) in enumerate(zip(got, want)):
        x, y = np.asarray(x, float), np.asarray(y, float)
        assert np.abs(x - y).max() <= tol * np.abs(y).max(), (what, k, np.abs(x - y).max(), np.abs(y).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A checkpoint of the random direct model in orb-models' release format, the structure."""
    from orb_cases import KWARGS, cuag, write_checkpoint

    from shardmd.models.orb import factory

    d = tmp_path_factory.mktemp("orb")
    ckpt = write_checkpoint(factory(**KWARGS), d / "orb-random.ckpt")
    write(d / "cuag.extxyz", cuag())
    return {"ckpt": ckpt, "xyz": d / "cuag.extxyz", "dir": d}


@needs_orb
@pytest.mark.parametrize("conservative", [False, True])
def test_random_model_equals_orb_calculator(conservative):
    """The engine on one domain (ShardMDCalculator) against ORBCalculator on the same weights:
    energy, forces and stress to 1e-10 relative (float64); per-atom energies sum to the energy."""
    from orb_cases import KWARGS, KWARGS_CONSERVATIVE, cuag, evaluate

    a = cuag(seed=2)
    ours = _ours(**(KWARGS_CONSERVATIVE if conservative else KWARGS))
    got = evaluate(ours, a)
    _close(got, evaluate(ours.model.ase_calculator(), a), what=f"conservative={conservative}")
    assert np.abs(got[1]).max() > 1e-3 and np.abs(got[2]).max() > 1e-2   # real forces and stress
    b = a.copy()
    b.calc = ours
    assert abs(b.get_potential_energies().sum() - got[0]) <= TOL * abs(got[0])
    assert torch.get_default_dtype() == torch.float32   # nothing of orb-models' leaked into the process


@needs_orb
@pytest.mark.parametrize("conservative", [False, True])
def test_open_cluster_equals_orb_calculator(conservative):
    """A non-periodic Cu/Ag cluster (orb-models: no cell; the direct head then also removes the
    net torque, through four more whole-system sums here): energy and forces to 1e-10."""
    from ase import Atoms
    from ase.cluster import Octahedron
    from orb_cases import KWARGS, KWARGS_CONSERVATIVE, default_dtype

    a = Octahedron("Cu", 4)
    a.rattle(0.1, seed=3)
    a.numbers[::3] = 47
    ours = _ours(**(KWARGS_CONSERVATIVE if conservative else KWARGS))
    got = []
    for calc in (ours, ours.model.ase_calculator()):
        b = Atoms(numbers=a.numbers, positions=a.positions, pbc=False)
        b.calc = calc
        with warnings.catch_warnings(), default_dtype(torch.float64):
            warnings.simplefilter("ignore")
            got.append((b.get_potential_energy(), b.get_forces()))
    _close(got[0], got[1], what=f"cluster, conservative={conservative}")
    torque = np.cross(a.positions - a.positions.mean(0), got[0][1]).sum(0)
    assert conservative or np.abs(torque).max() < 1e-12


@needs_orb
@needs_orb_05
@pytest.mark.parametrize("cap", [20, 7])
def test_capped_graph_is_orbs_graph(cap):
    """Our graph (models/orb_graph.py, from the engine's list) is orb-models' own
    compute_pbc_radius_graph: the same (sender, receiver, image) edges, at the released cap and at
    a cap that cuts deep into the first shells."""
    from orb_cases import KWARGS, cuag, orb_graph

    from shardmd.domain.neighbors import build_neighbor_list
    from shardmd.models.orb import factory
    from shardmd.models.orb_graph import capped_graph

    a = cuag(repeat=(3, 3, 3), seed=6, rattle=0.12)
    model = factory(**{**KWARGS, "max_neighbors": cap})
    x = torch.tensor(a.positions)
    cell = torch.tensor(a.cell.array)
    nl = build_neighbor_list(x, cell, (True, True, True), model.cutoff + 0.5)
    s, r, vec, n_out = capped_graph(x, cell, nl, model.cutoff, cap)
    assert n_out == len(s) and int(torch.bincount(s).max()) == cap
    shift = torch.round(torch.linalg.solve(cell.T, (vec - (x[r] - x[s])).T).T).long()
    ours = {(int(i), int(j), *map(int, k)) for i, j, k in zip(s, r, shift)}
    assert len(ours) == len(s) and ours == orb_graph(model, a)


@needs_orb
def test_checkpoint_is_loaded_as_data(files):
    """model.checkpoint=FILE (orb-models' release format: a bare state dict, weights_only) is the
    same network, the cap from model.max_neighbors or a released model's name; ORBCalculator on
    it agrees (1e-10)."""
    from orb_cases import cuag, evaluate

    from shardmd.models.orb import factory

    a = cuag(seed=5)
    ours = _ours(checkpoint=str(files["ckpt"]), max_neighbors=20)
    _close(evaluate(ours, a), evaluate(ours.model.ase_calculator(), a), what="checkpoint")
    state = torch.load(files["ckpt"], weights_only=True)
    mine = ours.model.net.state_dict()
    assert all(torch.equal(mine[k], v.double() if v.is_floating_point() else v) for k, v in state.items())
    named = files["dir"] / "orb-v3-direct-inf-omat-20250404.ckpt"   # a released model's file name: cap 120
    named.write_bytes(files["ckpt"].read_bytes())
    assert factory(checkpoint=str(named)).max_neighbors == 120


@needs_orb
def test_released_name_resolves_from_the_local_download_cache_only(files, tmp_path):
    """model.checkpoint=orb-v3-direct-20-omat takes the file orb-models' downloader (cached_path)
    left in its cache, with the name's cap (20); with nothing there, it says so (no download)."""
    import cached_path
    from cached_path.util import resource_to_filename

    from shardmd.models.orb import factory
    from shardmd.models.orb_files import import_orb

    url = import_orb().orb_v3_direct_20_omat.__defaults__[0]
    before = cached_path.get_cache_dir()
    cached_path.set_cache_dir(tmp_path)
    try:
        with pytest.raises(ValueError, match="not downloaded yet"):
            factory(checkpoint="orb-v3-direct-20-omat")
        (tmp_path / resource_to_filename(url)).write_bytes(files["ckpt"].read_bytes())
        model = factory(checkpoint="orb-v3-direct-20-omat")
    finally:
        cached_path.set_cache_dir(before)
    assert model.max_neighbors == 20 and model.path.parent == tmp_path


@needs_orb
@needs_orb_05
def test_orb_v2_file_equals_orb_calculator(tmp_path):
    """An orb-v2 network (Gaussian radial basis, unit vectors, layer norm, GraphHead stress, no
    ZBL) in a file named like a released v2 model (cap 20 from the name): ORBCalculator agrees."""
    from orb_cases import cuag, evaluate, write_v2_checkpoint

    ours = _ours(checkpoint=str(write_v2_checkpoint(tmp_path / "orb-d3-xs-v2-test.ckpt")))
    assert ours.model.kind == "v2" and ours.model.max_neighbors == 20
    a = cuag(seed=7)
    _close(evaluate(ours, a), evaluate(ours.model.ase_calculator(), a), what="orb-v2")


CHARGED = {"charge_spin": True, "charge": 1, "spin": 2}   # OrbMol's conditioner, a cation doublet


def _energy_forces(calc, atoms, info=None, pbc=False):
    """(energy eV, forces (n, 3) eV/Å) of a fresh evaluation under float64, ``info`` (charge,
    spin) set as orb-models' calculator reads them."""
    from ase import Atoms
    from orb_cases import default_dtype

    a = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=pbc, info=dict(info or {}))
    a.calc = calc
    with warnings.catch_warnings(), default_dtype(torch.float64):
        warnings.simplefilter("ignore")
        return a.get_potential_energy(), a.get_forces()


def _cluster():
    from ase.cluster import Octahedron

    a = Octahedron("Cu", 4)
    a.rattle(0.1, seed=5)
    a.numbers[::4] = 47
    return a


@needs_orb
@pytest.mark.parametrize("conservative", [False, True])
def test_charge_spin_conditioned_model_equals_orb_calculator(conservative, tmp_path):
    """OrbMol (orb-v3 -omol: orb-models' ChargeSpinConditioner, no stress) with random weights on
    an open Cu/Ag cluster, charge 1 and spin 2: energy and forces against ORBCalculator given
    atoms.info charge and spin (1e-10); another charge gives another energy; the weights saved in
    the release format load as a conditioned network (a released -omol name: cap 120)."""
    from orb_cases import KWARGS, KWARGS_CONSERVATIVE, write_checkpoint

    from shardmd.models.orb import factory

    a = _cluster()
    kw = {**(KWARGS_CONSERVATIVE if conservative else KWARGS), **CHARGED}
    ours = _ours(**kw)
    assert ours.model.charge_spin == (1.0, 2.0)
    got = _energy_forces(ours, a)
    _close(got, _energy_forces(ours.model.ase_calculator(), a, {"charge": 1.0, "spin": 2.0}),
           what=f"omol, conservative={conservative}")
    neutral = _energy_forces(_ours(**{**kw, "charge": 0}), a)
    assert abs(neutral[0] - got[0]) > 1e-6 and np.abs(got[1]).max() > 1e-3
    ckpt = write_checkpoint(ours.model, tmp_path / "omol-random.ckpt")
    loaded = _ours(checkpoint=str(ckpt), max_neighbors=20, charge=1, spin=2)
    _close(_energy_forces(loaded, a), got, tol=1e-6, what="omol checkpoint (float32 weights)")
    named = tmp_path / f"orb-v3-{'conservative' if conservative else 'direct'}-omol-20250820.ckpt"
    named.write_bytes(ckpt.read_bytes())
    model = factory(checkpoint=str(named), charge=-1, spin=0)
    assert model.max_neighbors == 120 and model.net.model.conditioner is not None and model.charge_spin == (-1.0, 0.0)


@needs_orb
def test_charge_and_spin_refusals_are_one_line(files, tmp_path):
    """A conditioned model without its charge or spin, a charge or spin given to a model without a
    conditioner, values that are not numbers: one line each, naming the key."""
    from orb_cases import KWARGS, write_checkpoint

    from shardmd.models.orb import factory

    ckpt = write_checkpoint(factory(**KWARGS, **CHARGED), tmp_path / "omol.ckpt")
    cases = [
        (dict(checkpoint=str(ckpt), max_neighbors=20), ["charge/spin-conditioned", "model.charge", "model.spin"]),
        (dict(checkpoint=str(ckpt), max_neighbors=20, charge=0), ["charge/spin-conditioned", "model.spin"]),
        (dict(checkpoint=str(files["ckpt"]), max_neighbors=20, charge=0, spin=1), ["not one", "leave them out"]),
        (dict(**KWARGS, charge=1), ["not one", "leave them out"]),
        (dict(**KWARGS, **{**CHARGED, "charge": "plus"}), ["model.charge='plus'", "a number"]),
        (dict(**KWARGS, **{**CHARGED, "spin": float("nan")}), ["model.spin=nan", "a number"]),
        (dict(**KWARGS, **{**CHARGED, "spin": True}), ["model.spin=True", "a number"]),
    ]
    for kw, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(**kw)
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (kw, msg)


@needs_orb
@pytest.mark.mpi
def test_conditioned_model_on_1_and_2_domains(files):
    """``model.charge_spin=true model.charge=1 model.spin=2`` (a random OrbMol network) through the
    CLI on 1 and 2 domains: 30 hot Langevin steps; the 2-domain trajectory equals one domain's
    (1e-10 Å) and the last frame's forces equal ORBCalculator's with the same charge and spin."""
    from orb_cases import KWARGS

    from shardmd.models.orb import factory

    d = files["dir"]
    model = [f"model.{k}={str(v).lower()}" for k, v in {**KWARGS, **CHARGED}.items()]
    base = [*CLI, *model, f"system.file={files['xyz']}", "steps=30", "trajectory.every=30"]
    for k in (1, 2):
        r = run_engine([*base, f"domains={k}", f"output=q{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    one, two = read_frames(d / "q1.h5"), read_frames(d / "q2.h5")
    assert np.abs(one[-1].positions - two[-1].positions).max() <= 1e-10
    ref = factory(**KWARGS, **CHARGED).ase_calculator()
    e, f = _energy_forces(ref, one[-1], {"charge": 1.0, "spin": 2.0}, pbc=True)
    assert abs(two[-1].get_potential_energy() - e) <= TOL * abs(e)
    assert np.abs(two[-1].get_forces() - f).max() <= TOL * np.abs(f).max()


# -- N domains ---------------------------------------------------------------------------------------
@needs_orb
@pytest.mark.mpi
def test_cli_on_1_2_and_4_domains(files):
    """``python -m engine run model=orb model.checkpoint=... domains=N`` (N real ranks): 50
    Langevin steps at 900 K with migrations; the frames' energies, forces and stress equal
    ORBCalculator's (1e-10) and the 2- and 4-domain trajectories equal one domain's (1e-10 Å)."""
    from orb_cases import evaluate

    from shardmd.models.orb import factory

    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", "model.max_neighbors=20", f"system.file={files['xyz']}"]
    for k, grid in ((1, []), (2, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=d, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    log = (d / "d4.log").read_text()
    assert "grid 2x2x1" in log and int(log.split(" atom migrations")[0].rsplit(" ", 1)[-1]) > 0, log
    ref = factory(checkpoint=str(files["ckpt"]), max_neighbors=20).ase_calculator()
    runs = {k: read_frames(d / f"d{k}.h5") for k in (1, 2, 4)}
    for k, frames in runs.items():
        assert [f.info["step"] for f in frames] == [0, 50]
        for f in frames:
            e, forces, _ = evaluate(ref, f)
            assert abs(f.get_potential_energy() - e) <= TOL * abs(e), k
            assert np.abs(f.get_forces() - forces).max() <= TOL * np.abs(forces).max(), k
        assert np.abs(frames[-1].positions - runs[1][-1].positions).max() <= 1e-10, k
    moved = runs[1][-1].get_positions(wrap=False) - runs[1][0].get_positions(wrap=False)
    assert np.sqrt((moved ** 2).sum(1).mean()) > 0.05


@needs_orb
@pytest.mark.mpi
def test_conservative_on_a_perfect_lattice_with_a_cut_shell(tmp_path):
    """A conservative model, cap 16, on a perfect fcc lattice: every atom's 18 nearest (12 + 6)
    lie in two shells of equal distances, so the cap chooses 4 of 6 equidistant atoms; the
    choice (and the forces it gives) are the same on 1 and 4 domains, and so are the 30 hot
    Langevin steps after it (1e-10)."""
    from orb_cases import KWARGS_CONSERVATIVE, cuag

    write(tmp_path / "fcc.extxyz", cuag(rattle=0.0))
    model = [f"model.{k}={str(v).lower()}" for k, v in KWARGS_CONSERVATIVE.items()]
    base = [*CLI, *model, "model.max_neighbors=16", f"system.file={tmp_path / 'fcc.extxyz'}", "steps=30",
            "trajectory.every=30"]
    for k, grid in ((1, []), (4, ["grid=[2,2,1]"])):
        r = run_engine([*base, f"domains={k}", *grid, f"output=d{k}.h5"], cwd=tmp_path, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    one, four = read_frames(tmp_path / "d1.h5"), read_frames(tmp_path / "d4.h5")
    assert np.abs(one[0].get_forces()).max() > 1e-4   # the cut shell breaks the lattice's symmetry
    for a, b in zip(one, four):
        assert abs(a.get_potential_energy() - b.get_potential_energy()) <= TOL * abs(a.get_potential_energy())
        assert np.abs(a.get_forces() - b.get_forces()).max() <= TOL * np.abs(a.get_forces()).max()
        assert np.abs(a.positions - b.positions).max() <= 1e-10


@needs_orb
@pytest.mark.mpi
def test_restart_on_two_domains_is_bit_exact(files):
    """20 steps straight == 10 + restart + 10 (Langevin, 2 domains, the checkpoint's model)."""
    d = files["dir"]
    base = [*CLI, f"model.checkpoint={files['ckpt']}", "model.max_neighbors=20", f"system.file={files['xyz']}",
            "trajectory.every=5", "domains=2"]
    assert_restart_bit_exact(base, d)


# -- files, refusals ----------------------------------------------------------------------------------
def _edited(files, name, edit):
    """A copy of the checkpoint (a state dict) with ``edit(state)`` applied."""
    sd = torch.load(files["ckpt"], map_location="cpu", weights_only=True)
    edit(sd)
    torch.save(sd, files["dir"] / name)
    return files["dir"] / name


@needs_orb
def test_file_refusals_are_one_line(files):
    """A hostile pickle (never unpickled), another family, a whole pickled module, a state dict
    without ORB's weights, a conditioner that is not orb-models', weights that do not fit, a missing
    weight, no neighbour cap, a TorchScript archive, a junk file, a missing file."""
    from shardmd.models.orb import factory

    d = files["dir"]
    marker = d / "MARKER"
    save_hostile(d / "evil.ckpt", marker)
    torch.save({"config": {"version": "0.13.0"}, "model_state_dict": {}}, d / "sevenn.ckpt")
    torch.save(torch.nn.Linear(2, 2), d / "module.ckpt")
    torch.save({"w": torch.zeros(3)}, d / "bare.ckpt")
    with warnings.catch_warnings():   # torch.jit.script is deprecated; such files still exist
        warnings.simplefilter("ignore")
        torch.jit.script(torch.nn.Linear(2, 2)).save(str(d / "scripted.ckpt"))
    (d / "junk.ckpt").write_bytes(b"not a checkpoint")
    cases = [
        (d / "evil.ckpt", ["posix.system", "trust_pickle=true"]),
        (d / "sevenn.ckpt", ["not an ORB checkpoint", "model=sevennet"]),
        (d / "module.ckpt", ["torch.nn", "not an ORB checkpoint"]),
        (d / "bare.ckpt", ["not an ORB checkpoint", "without ORB's weights"]),
        (_edited(files, "omol.ckpt", lambda s: s.update({"model.conditioner.w": torch.zeros(2)})),
         ["do not fit"]),
        (_edited(files, "shape.ckpt", lambda s: s.update({"heads.energy.mlp.NN-1.weight": torch.zeros(2, 16)})),
         ["do not fit", "heads.energy.mlp.NN-1.weight"]),
        (_edited(files, "missing.ckpt", lambda s: s.pop("heads.forces.mlp.NN-0.bias")),
         ["do not fit", "heads.forces.mlp.NN-0.bias"]),
        (d / "scripted.ckpt", ["TorchScript"]),
        (d / "junk.ckpt", ["not a loadable ORB checkpoint"]),
        (d / "nowhere.ckpt", ["no such file"]),
    ]
    for path, words in cases:
        with pytest.raises(ValueError) as exc:
            factory(checkpoint=str(path), max_neighbors=20)
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), (path.name, msg)
    with pytest.raises(ValueError, match="does not record its neighbour cap.*max_neighbors=20 or 120"):
        factory(checkpoint=str(files["ckpt"]))
    assert not marker.exists()


@needs_orb
def test_engine_refusals_are_one_line(files, tmp_path):
    """Through the engine: an element ORB has no embedding for, an unknown key, no checkpoint."""
    from shardmd.engine.config.compose import compose_config
    from shardmd.engine.errors import UserError
    from shardmd.engine.run.simulation import Simulation

    ck = [f"model.checkpoint={files['ckpt']}", "model.max_neighbors=20"]
    for element, args, words in (("Og", ck, ["does not know Og", "1..117"]),
                                 ("Cu", [*ck, "model.nope=3"], ["no parameter nope", "checkpoint"]),
                                 ("Cu", [], ["needs model.checkpoint=FILE.ckpt", "model.random=true"])):
        with pytest.raises(UserError) as exc:
            Simulation(compose_config(["model=orb", f"system.element={element}", "system.lattice=fcc",
                                       "system.a=4.4", "system.repeat=[3,3,3]", *args, "steps=1", "quiet=true",
                                       f"output={tmp_path / 'r.h5'}"])).run()
        msg = str(exc.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


@needs_orb
def test_cli_refuses_a_hostile_checkpoint_with_exit_status_2(files, tmp_path):
    """``python -m engine run model=orb model.checkpoint=evil.ckpt``: one line on stderr naming
    the refused global and the opt-in, exit status 2, the payload never run."""
    marker = tmp_path / "MARKER"
    save_hostile(tmp_path / "evil.ckpt", marker)
    r = run_engine(["run", "model=orb", f"model.checkpoint={tmp_path / 'evil.ckpt'}", "model.max_neighbors=20",
                    f"system.file={files['xyz']}", "steps=1", "output=r.h5"], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "trust_pickle=true" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not marker.exists()


def test_without_the_package_the_error_is_one_line_with_the_install_command(tmp_path):
    """orb-models hidden from the interpreter (or absent, as in the main environment): the engine
    refuses model=orb in one line giving the install command (exit status 2)."""
    assert_install_line(tmp_path, "orb_models", ["model=orb", "model.random=true"], "orb", "orb")


@needs_orb
def test_spec_saves_and_loads(tmp_path):
    """SPEC_ORB is a plain, saveable spec (no adapters: nothing of orb-models' is swapped)."""
    from shardmd.domain.api import MLIPSpec
    from shardmd.models.orb import SPEC_ORB

    SPEC_ORB.save(tmp_path / "orb_spec.json")
    back = MLIPSpec.load(tmp_path / "orb_spec.json")
    assert back == SPEC_ORB and back.distribution.third_party_helpers == ()
