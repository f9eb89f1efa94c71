"""The observables' registry (engine/observables/): an observable registered in one place (a
module of the user's named by ``observables.modules``, or ``register_observable`` in Python)
shows in the thermo table, the trajectory (h5py and our reader), ``plot`` and ``info``; on two
domains its value is the one-domain value and the numpy value of the trajectory's positions;
the key is refused without ``allow_code=true``; bad declarations and values are one line; the
built-in columns and trajectory rows are what they were."""
import itertools
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
from conftest import cli_in_process, run_engine

from shardmd.engine.errors import UserError
from shardmd.engine.io.h5md import read_frames, read_observables
from shardmd.engine.observables import get, register_observable, registry, unregister_observable

RUN = ["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "thermo.every=5", "trajectory.every=10",
       "thermo.progress=false", "threads=1"]
_count = itertools.count()

#: the user's module: a sum (per-rank partials), a max, a none (system-wide), a derived, an expensive one
MODULE = '''
import numpy as np
from shardmd.engine.observables import register_observable

@register_observable("{p}r2", unit="Å^2", h5md_unit="Angstrom+2", reduce="sum", description="sum of |r|^2")
def r2(view):
    return float((view.positions ** 2).sum())

@register_observable("{p}xmax", unit="Å", h5md_unit="Angstrom", reduce="max")
def xmax(view):
    return view.positions[:, 0].max() if view.n_local else -np.inf

@register_observable("{p}lx", unit="Å", h5md_unit="Angstrom", reduce="none", when=["trajectory"])
def lx(view):
    return view.cell[0, 0]

@register_observable("{p}pe_atom", unit="eV", reduce="derived", depends=["potential_energy"])
def pe_atom(view):
    return view.values["potential_energy"] / view.n_atoms

@register_observable("{p}vsum", unit="Å/fs", h5md_unit="Angstrom fs-1", reduce="sum", cost="expensive",
                     shape=(3,))
def vsum(view):
    return view.velocities.sum(axis=0)
'''


@pytest.fixture
def clean_registry():
    """Observables a test registers are taken out again (the registry is the process's)."""
    before = set(registry._REGISTRY)
    yield
    for name in reversed([n for n in registry._REGISTRY if n not in before]):
        unregister_observable(name)


def _module(tmp_path, body=MODULE):
    """A module of the user's in tmp_path (a name of its own: imports are cached per process)."""
    k = next(_count)
    name, prefix = f"userobs_{k}_{tmp_path.name[-12:]}".replace("-", "_"), f"u{k}_"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body.replace("{p}", prefix)))
    return name, prefix


def _table(stdout: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln.split() for ln in stdout.splitlines()]
    i = next(i for i, ln in enumerate(lines) if ln[:1] == ["Step"])
    rows = list(itertools.takewhile(lambda ln: ln and ln[0].isdigit(), lines[i + 1:]))
    return lines[i], rows


def test_builtin_columns_and_rows_are_unchanged(tmp_path, capfd, monkeypatch):
    r = cli_in_process([*RUN, "output=b.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    header = next(ln for ln in r.stdout.splitlines() if "Step" in ln)
    assert header == ("      Step    Time(ps)     Temp(K)      PotEng(eV)    KinEng(eV)      TotEng(eV)   Press(bar)"
                      "    Volume(A3)")
    with h5py.File(tmp_path / "b.h5") as f:
        assert sorted(f["observables"]) == ["conserved_energy", "dt", "kinetic_energy", "potential_energy",
                                            "pressure", "stress", "temperature", "total_energy"]
        units = {k: f["observables"][k]["value"].attrs["unit"] for k in f["observables"]}
        assert units["pressure"] == units["stress"] == "eV Angstrom-3" and units["temperature"] == "K"
        pe, ke = f["observables/potential_energy/value"][()], f["observables/kinetic_energy/value"][()]
        np.testing.assert_array_equal(f["observables/total_energy/value"][()], pe + ke)
    _, rows = _table(r.stdout)
    assert [row[0] for row in rows] == ["0", "5", "10", "15", "20"] and all(len(row) == 8 for row in rows)


def test_a_config_module_shows_everywhere(tmp_path, capfd, monkeypatch, clean_registry):
    mod, p = _module(tmp_path)
    r = cli_in_process([*RUN, f"observables.modules=[{mod}:r2,{mod}]", "allow_code=true"], tmp_path, capfd,
                       monkeypatch)
    assert r.returncode == 0, r.stderr
    # the thermo table: cheap ones with thermo in `when`, not the trajectory-only or expensive ones
    header, rows = _table(r.stdout)
    assert header[-3:] == [f"{p}r2(Å^2)", f"{p}xmax(Å)", f"{p}pe_atom(eV)"] and len(header) == 11
    assert f"Observables from observables.modules: {mod}:r2 ({p}r2);" in r.stdout
    log = (tmp_path / "run.log").read_text().splitlines()
    assert sum("allow_code=true allows" in ln and "observables.modules" in ln for ln in log) == 1
    # the trajectory, through h5py and through our reader, against numpy on its own positions
    frames = read_frames(tmp_path / "run.h5")
    pos = np.stack([f.positions for f in frames])
    with h5py.File(tmp_path / "run.h5") as f:
        g = f[f"observables/{p}r2"]
        assert g["value"].attrs["unit"] == "Angstrom+2" and list(g["step"][()]) == [0, 10, 20]
        np.testing.assert_allclose(g["value"][()], (pos ** 2).sum(axis=(1, 2)), rtol=1e-12)
        np.testing.assert_allclose(f[f"observables/{p}lx/value"][()], [fr.cell[0, 0] for fr in frames], rtol=1e-14)
        vel = f["particles/all/velocity/value"][()]   # Å/fs
        np.testing.assert_allclose(f[f"observables/{p}vsum/value"][()], vel.sum(axis=1), rtol=1e-10, atol=1e-12)
    obs = read_observables(tmp_path / "run.h5")
    np.testing.assert_allclose(obs[f"{p}xmax"][2], pos[:, :, 0].max(axis=1), rtol=1e-14)
    np.testing.assert_allclose(obs[f"{p}pe_atom"][2], obs["potential_energy"][2] / 108, rtol=1e-14)
    # the table's values are the trajectory's (at the frames' steps)
    r2_col = {int(row[0]): float(row[-3]) for row in rows}
    np.testing.assert_allclose([r2_col[s] for s in (0, 10, 20)], obs[f"{p}r2"][2], rtol=1e-5)
    # info and plot: here, where the module is imported, with the registry's words; in a fresh
    # process (the usual case) with the file's unit and where the observable came from
    r = cli_in_process(["info", "run.h5"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 0 and f"{p}r2 (3)" in r.stdout, r.stdout
    assert f"  {p}r2: Angstrom+2; sum of |r|^2 ({mod}:r2; reduce sum; cheap)" in r.stdout.splitlines(), r.stdout
    r = run_engine(["info", "run.h5"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"  {p}r2: Angstrom+2; not built in: registered by the run's observables.modules=[{mod}:r2,{mod}]" \
        in r.stdout.splitlines(), r.stdout
    assert "  temperature: K; 2 K / (dof kB) (built-in; reduce derived; cheap)" in r.stdout.splitlines()
    from shardmd.engine.io.inspect_files import plot_series

    panels = dict(plot_series(str(tmp_path / "run.h5")))
    np.testing.assert_allclose(panels[f"{p}r2 (Å^2)"][f"{p}r2"][1], (pos ** 2).sum(axis=(1, 2)), rtol=1e-12)
    r = run_engine(["plot", "run.h5", "p.png"], tmp_path)
    assert r.returncode == 0, r.stderr
    from PIL import Image

    desc = Image.open(tmp_path / "p.png").info["Description"]
    assert f"{p}r2 (Angstrom+2): {p}r2" in desc and f"{p}xmax (Angstrom): {p}xmax" in desc, desc
    assert desc.startswith("energy (eV): potential energy, kinetic energy, total energy; total-energy drift")


def test_a_python_registration_reaches_the_run(tmp_path, monkeypatch, clean_registry):
    from shardmd.engine import Simulation, compose_config

    monkeypatch.chdir(tmp_path)

    @register_observable(unit="eV/Å", h5md_unit="eV Angstrom-1", reduce="max")
    def fmax_test(view):
        return float(np.sqrt((view.forces ** 2).sum(axis=1)).max())

    assert get("fmax_test").origin.endswith(":test_a_python_registration_reaches_the_run.<locals>.fmax_test")
    sim = Simulation(compose_config(["model=lj", "system.repeat=[3,3,3]", "steps=10", "thermo.every=5",
                                     "trajectory.every=5", "quiet=true", "threads=1"]))
    final = sim.run()
    frames = read_frames(tmp_path / "run.h5")
    fmax = [np.sqrt((f.get_forces() ** 2).sum(axis=1)).max() for f in frames]
    np.testing.assert_allclose(read_observables(tmp_path / "run.h5")["fmax_test"][2], fmax, rtol=1e-10)
    assert final["fmax_test"] == pytest.approx(fmax[-1], rel=1e-10)
    assert "fmax_test(eV/Å)" in (tmp_path / "run.log").read_text()
    with pytest.raises(UserError, match=r"^unknown observable 'nope'; registered: .*fmax_test"):
        sim.observables(names=["nope"])


def test_observables_modules_without_allow_code_is_refused_in_one_line(tmp_path, capfd, monkeypatch,
                                                                       clean_registry):
    mod, _ = _module(tmp_path)
    r = cli_in_process([*RUN, f"observables.modules=[{mod}]"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: the configuration would run code: observables.modules=") and \
        "allow_code=true" in r.stderr
    assert mod not in sys.modules and not (tmp_path / "run.h5").exists()


@pytest.mark.parametrize("body, expect", [
    ("@register_observable('temperature')\ndef t(view):\n    return 1.0\n",
     "observable 'temperature': registered already (by built-in)"),
    ("@register_observable('a', reduce='derived', depends=['nope'])\ndef a(view):\n    return 1.0\n",
     "observable 'a': depends on unknown observable 'nope'"),
    ("@register_observable('b', reduce='mean')\ndef b(view):\n    return 1.0\n",
     "observable 'b': reduce='mean' is not one of sum, max, min, none, derived"),
    ("@register_observable('c', shape=(3,))\ndef c(view):\n    return [1.0, 2.0, 3.0]\n",
     "observable 'c': a thermo column holds one number"),
    ("@register_observable('nan_obs')\ndef nan_obs(view):\n    return float('nan') if view.step else 1.0\n",
     "is not finite at step 5 (nan)"),
    ("@register_observable('bad_shape')\ndef bad_shape(view):\n    return [1.0, 2.0]\n",
     "failed at step 0: ValueError: returned shape (2,), declared ()"),
    ("@register_observable('boom', reduce='derived', depends=['kinetic_energy'])\ndef boom(view):\n"
     "    return 1 / 0\n", "failed at step 0: ZeroDivisionError: division by zero"),
    ("def plain(view):\n    return 1.0\n", "is not a registered observable; decorate it with @register_observable"),
])
def test_bad_declarations_and_values_are_one_line(tmp_path, capfd, monkeypatch, clean_registry, body, expect):
    mod, _ = _module(tmp_path, "from shardmd.engine.observables import register_observable\n" + body)
    attr = body.split("def ", 1)[1].split("(", 1)[0]
    r = cli_in_process([*RUN, f"observables.modules=[{mod}:{attr}]", "allow_code=true"], tmp_path, capfd,
                       monkeypatch)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], r.stderr


def test_python_registration_errors_and_unregister(clean_registry):
    with pytest.raises(UserError, match=r"^observable name '1x' is not valid"):
        register_observable("1x", lambda v: 0.0)
    register_observable("twice", lambda v: 0.0)
    with pytest.raises(UserError, match=r"^observable 'twice': registered already"):
        register_observable("twice", lambda v: 1.0)
    register_observable("twice_d", lambda v: 2 * v.values["twice"], reduce="derived", depends="twice")
    with pytest.raises(UserError, match="'twice_d' depends on it"):
        unregister_observable("twice")
    with pytest.raises(UserError, match="built in"):
        unregister_observable("pressure")
    with pytest.raises(UserError, match=r"^unknown observable 'never'"):
        unregister_observable("never")


@pytest.mark.mpi
def test_two_domains_equal_one_domain_and_numpy(tmp_path):
    """Self-launched ranks (+domains=2) import the module too; the sum, max, none and derived
    values equal one domain's and numpy's on each run's own trajectory."""
    mod, p = _module(tmp_path)
    args = ["run", "model=lj", "system.repeat=[5,5,5]", "steps=20", "thermo.every=10", "trajectory.every=10",
            "quiet=true", "threads=1", f"observables.modules=[{mod}]", "allow_code=true"]
    procs = [subprocess.Popen([sys.executable, "-m", "engine", *args, *extra], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for extra in (["output=d1.h5"], ["+domains=2", "output=d2.h5"])]
    errs = [pr.communicate(timeout=300)[1] for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], errs
    assert "domains 2" in (tmp_path / "d2.log").read_text()
    got = {}
    for run in ("d1", "d2"):
        obs, frames = read_observables(tmp_path / f"{run}.h5"), read_frames(tmp_path / f"{run}.h5")
        pos = np.stack([f.positions for f in frames])
        np.testing.assert_allclose(obs[f"{p}r2"][2], (pos ** 2).sum(axis=(1, 2)), rtol=1e-12)
        np.testing.assert_array_equal(obs[f"{p}xmax"][2], pos[:, :, 0].max(axis=1))
        np.testing.assert_array_equal(obs[f"{p}lx"][2], [f.cell[0, 0] for f in frames])
        np.testing.assert_allclose(obs[f"{p}pe_atom"][2], obs["potential_energy"][2] / 500, rtol=1e-14)
        got[run] = obs
    for name in (f"{p}r2", f"{p}xmax", f"{p}lx", f"{p}pe_atom", "temperature"):
        assert list(got["d1"][name][0]) == list(got["d2"][name][0]) == [0, 10, 20]
        np.testing.assert_allclose(got["d2"][name][2], got["d1"][name][2], rtol=1e-9)
