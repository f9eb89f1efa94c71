"""A user's observable by one config key (observables.modules): the centre-of-mass velocity of a
group, in the thermo table (thermo.columns) and the trajectory's /observables, against numpy on
the trajectory's own velocities and masses; and the failures of such a module, one line each,
naming the module (the cases tests/test_observables_registry.py does not hold)."""
import itertools
import textwrap

import h5py
import numpy as np
import pytest
from conftest import cli_in_process

from shardmd.engine.observables import registry, unregister_observable

_count = itertools.count()
RUN = ["run", "model=lj", "system.repeat=[3,3,3]", "steps=20", "thermo.every=10", "trajectory.every=10",
       "thermo.progress=false", "threads=1", "allow_code=true", "groups.top={ids: '60-107'}"]

#: the centre-of-mass velocity of the group "top" (its members found through view.group), and of
#: whatever atoms it is handed (the system's; per group with @<group> in thermo.columns)
VCM = '''
from shardmd.engine.observables import register_observable

@register_observable("{p}p_top", unit="amu Å/fs", reduce="sum", shape=(3,), when=[])
def p_top(view):
    m = view.group("top")
    return (view.masses[m, None] * view.velocities[m]).sum(axis=0)

@register_observable("{p}m_top", unit="amu", reduce="sum", when=[])
def m_top(view):
    return view.masses[view.group("top")].sum()

@register_observable("{p}vcm_top", unit="Å/fs", h5md_unit="Angstrom fs-1", reduce="derived", shape=(3,),
                     depends=["{p}p_top", "{p}m_top"], when=["trajectory"])
def vcm_top(view):
    return view.values["{p}p_top"] / view.values["{p}m_top"]

@register_observable("{p}p", reduce="sum", shape=(3,), when=[])
def p(view):
    return (view.masses[:, None] * view.velocities).sum(axis=0)

@register_observable("{p}vcm", unit="Å/fs", reduce="derived", shape=(3,), depends=["{p}p", "total_mass"], when=[])
def vcm(view):
    return view.values["{p}p"] / view.values["total_mass"]
'''


@pytest.fixture
def clean_registry():
    before = set(registry._REGISTRY)
    yield
    for name in reversed([n for n in registry._REGISTRY if n not in before]):
        unregister_observable(name)


def _module(tmp_path, body):
    k = next(_count)
    name, prefix = f"uservcm_{k}_{tmp_path.name[-12:]}".replace("-", "_"), f"v{k}_"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body.replace("{p}", prefix)))
    return name, prefix


def test_group_centre_of_mass_velocity_in_thermo_and_trajectory(tmp_path, capfd, monkeypatch, clean_registry):
    mod, p = _module(tmp_path, VCM)
    cols = f'[step,"{p}vcm_top[0]","{p}vcm_top[2]","{p}vcm[2]@top","{p}vcm[2]"]'
    r = cli_in_process([*RUN, f"observables.modules=[{mod}]", f"thermo.columns={cols}"], tmp_path, capfd,
                       monkeypatch)
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()]
    i = next(i for i, ln in enumerate(lines) if ln[:1] == ["Step"])
    assert lines[i] == ["Step", f"{p}vcm_top[0](Å/fs)", f"{p}vcm_top[2](Å/fs)", f"{p}vcm[2]@top(Å/fs)",
                        f"{p}vcm[2](Å/fs)"]
    rows = np.array([[float(x) for x in ln] for ln in lines[i + 1:i + 4]])
    with h5py.File(tmp_path / "run.h5") as f:
        vel, mass = f["particles/all/velocity/value"][()], f["particles/all/mass"][()]
        g = f[f"observables/{p}vcm_top"]
        stored, unit = g["value"][()], g["value"].attrs["unit"]
        assert list(g["step"][()]) == [0, 10, 20]
    top = np.arange(60, 108)
    want = (mass[top, None] * vel[:, top]).sum(axis=1) / mass[top].sum()   # (frames, 3) Å/fs
    assert unit == "Angstrom fs-1" and np.abs(want).max() > 1e-4
    np.testing.assert_allclose(stored, want, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(rows[:, 1], want[:, 0], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(rows[:, 2], want[:, 2], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(rows[:, 3], want[:, 2], rtol=1e-5, atol=1e-9)   # the generic one @top
    # the system's own: verlet from momentum-free velocities keeps it at zero
    assert np.abs(rows[:, 4]).max() < 1e-12


@pytest.mark.parametrize("body, expect", [
    ("raise RuntimeError('no data file')\n", "importing {mod} failed: RuntimeError: no data file; fix {mod}"),
    ("@register_observable('{p}g', reduce='sum')\ndef g(view):\n    return view.masses[view.group('nope')].sum()\n",
     "observable '{p}g' ({mod}:g) failed at step 0: KeyError: \"no group 'nope'; the run's groups: top"),
    ("@register_observable('{p}s', reduce='sum', shape=(3,), when=['trajectory'])\ndef s(view):\n"
     "    return view.velocities.sum(axis=0)[:2]\n", "observable '{p}s' ({mod}:s) failed at step 0: ValueError: "
                                                     "returned shape (2,), declared (3,)"),
    ("@register_observable('{p}d', reduce='derived', shape=(3,), depends=['kinetic_tensor'], when=['trajectory'])\n"
     "def d(view):\n    return view.values['kinetic_tensor']\n",
     "observable '{p}d' ({mod}:d) returned shape (3, 3), declared (3,)"),
])
def test_a_failing_module_is_one_line_naming_it(tmp_path, capfd, monkeypatch, clean_registry, body, expect):
    mod, p = _module(tmp_path, "from shardmd.engine.observables import register_observable\n" + body)
    r = cli_in_process([*RUN, f"observables.modules=[{mod}]"], tmp_path, capfd, monkeypatch)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert expect.replace("{mod}", mod).replace("{p}", p) in r.stderr, r.stderr
