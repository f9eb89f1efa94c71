"""Hostile and damaged checkpoints and trajectories (engine/io/checkpoint_check.py, engine/io/h5md_check.py,
engine/io/read_limits.py): every field is validated before anything is allocated from it, a bad one is a
one-line error naming the file, the field and the problem, restart=auto falls back past it and says so.

Every engine process here runs under an address-space cap (RLIMIT_AS), so a reader that allocates
what a file's header claims fails the test instead of exhausting the machine."""
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ROOT

pytestmark = pytest.mark.fault

#: address-space cap of every engine process in this module: an engine start with the LJ model
#: stays well below it; reading what the crafted headers claim (8 GB and more) does not
CAP = 3 << 30
BASE = ["model=lj", "system.repeat=[3,3,3]", "quiet=true", "threads=1", "dt=2.0", "temperature=100"]
RUN = [*BASE, "integrator=nose-hoover", "fix.ids=[0,1,2]", "trajectory.every=5", "checkpoint.every=10"]
CK20 = "run.ckpt/step-000000000020.h5"


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


#: on the CPU: a CUDA runtime reserves far more address space than the cap (these are file checks)
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def capped_engine(args, cwd, timeout=240):
    """``python -m engine <args>`` in a real subprocess under the memory cap; CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_cap, env=ENV)


def capped_many(cases, tmp_path, timeout=1800) -> list[dict]:
    """Each ``(argv, cwd)`` through cli.main, one after another in ONE capped subprocess
    (tests/helpers/cli_many.py); [{"code", "stderr"}, ...]. The limit is for a hang: 516 cases
    took 400 s with the fault suite and a full suite sharing two cores."""
    (tmp_path / "cases.json").write_text(json.dumps([[list(a), str(c)] for a, c in cases]))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "cli_many.py"), str(tmp_path / "cases.json"),
                        str(tmp_path / "results.json")], capture_output=True, text=True, timeout=timeout,
                       preexec_fn=_cap, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "results.json").read_text())


def error_line(stderr: str) -> str:
    """The one line a refusal prints (no traceback, no other line)."""
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("Warp CUDA warning")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A real nose-hoover run of 108 atoms, 3 of them fixed: checkpoints at steps 10 and 20."""
    d = tmp_path_factory.mktemp("good")
    r = capped_engine(["run", *RUN, "steps=20"], d)
    assert r.returncode == 0, r.stderr
    return d


def _copy(good_run, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(good_run, d)
    return d


def _integrator(path, **changes):
    with h5py.File(path, "r+") as f:
        d = json.loads(f.attrs["integrator"])
        d.update(changes)
        f.attrs["integrator"] = json.dumps(d)


def _replace(f, name, data=None, **kw):
    del f[name]
    return f.create_dataset(name, data=data, **kw)


def _empty(f, name, shape, dtype=np.float64):
    """``name`` as a chunked dataset of ``shape`` with nothing written: a few bytes on disk."""
    _replace(f, name, shape=shape, dtype=dtype, chunks=(min(1024, shape[0]),) + tuple(shape[1:]))


# -- item: crafted sizes cannot exhaust memory --------------------------------------------------
def test_a_fixed_atom_range_of_1e11_ids_is_refused_at_once(good_run, tmp_path):
    d = _copy(good_run, tmp_path)
    _integrator(d / CK20, fixed_ids=[[0, 10 ** 11]])
    for args in (["run", *RUN, "steps=40", f"restart={CK20}"], ["info", CK20]):
        t = time.monotonic()
        r = capped_engine(args, d, timeout=600)
        assert r.returncode == 2, r.stderr[-2000:]
        line = error_line(r.stderr)
        assert CK20 in line and "fixed_ids" in line and "[0, 100000000000)" in line, line
        assert time.monotonic() - t < 100


@pytest.mark.parametrize("how", ["positions of 1e9 rows", "every atom array 1e9 rows"])
def test_an_empty_huge_dataset_is_refused_before_it_is_read(good_run, tmp_path, how):
    """A dataset whose header says (1e9, 3) (nothing stored: a few bytes on disk), alone or with
    every atom array as long (so the shapes agree): refused from the metadata, by info and restart."""
    d = _copy(good_run, tmp_path)
    with h5py.File(d / CK20, "r+") as f:
        names = ["positions"] if how.startswith("positions") else list(f["atoms"])
        for name in names:
            old = f["atoms"][name]
            _empty(f, f"atoms/{name}", (10 ** 9, *old.shape[1:]), old.dtype)
    need = "atoms/positions has shape (1000000000, 3), expected (108, 3)" if len(names) == 1 else "more than the"
    for args in (["info", CK20], ["run", *RUN, "steps=40", f"restart={CK20}"]):
        r = capped_engine(args, d, timeout=600)
        assert r.returncode == 2, r.stderr[-2000:]
        line = error_line(r.stderr)
        assert CK20 in line and need in line, line


@pytest.mark.parametrize("how", ["species of 1e10 atoms", "position frames of 1e9 atoms", "step column 1e10 rows"])
def test_a_trajectory_with_huge_headers_is_refused_by_info(good_run, tmp_path, how):
    d = _copy(good_run, tmp_path)
    with h5py.File(d / "run.h5", "r+") as f:
        p = f["particles/all"]
        if how.startswith("species"):
            for name in ("species", "mass", "id"):
                _empty(f, f"particles/all/{name}", (10 ** 10,), p[name].dtype)
            need = "position/value has shape (5, 108, 3), expected (any, 10000000000, 3)"
        elif how.startswith("position"):
            _empty(f, "particles/all/position/value", (5, 10 ** 9, 3))
            need = "position/value has shape (5, 1000000000, 3)"
        else:
            _empty(f, "particles/all/box/edges/step", (10 ** 10,), np.int64)
            need = "more than the"
    r = capped_engine(["info", "run.h5"], d, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert "run.h5" in line and need in line, line


# -- item: the fixed-atom set of a checkpoint is checked ----------------------------------------
@pytest.mark.parametrize("ranges, need", [
    ([[0, 108]], "fixes every atom (108)"),
    ([[100, 120]], "[100, 120), outside the atom ids 0..107"),
    ([[1, 2]], "names 1 id(s) no atom has"),   # ids made even: 1 is no atom's
    ([[5, 9], [3, 6]], "overlapping"),
    ([[-3, 2]], "outside the atom ids"),
    ([[0, 2.5]], "pairs of integers"),
])
def test_a_checkpoints_fixed_atoms_must_exist_and_leave_some_mobile(good_run, tmp_path, ranges, need):
    d = _copy(good_run, tmp_path)
    _integrator(d / CK20, fixed_ids=ranges)
    if ranges == [[1, 2]]:
        with h5py.File(d / CK20, "r+") as f:
            f["atoms/ids"][...] = 2 * f["atoms/ids"][()]
    r = capped_engine(["run", *RUN, "steps=40", f"restart={CK20}"], d, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert CK20 in line and "fixed_ids" in line and need in line, line
    assert not (d / "run.ckpt" / "step-000000000030.h5").exists()


# -- item: bad fields: one line; restart=auto falls back and says so ------------------------------
def test_nan_in_the_thermostat_state_is_refused_before_any_step(good_run, tmp_path):
    d = _copy(good_run, tmp_path)
    with h5py.File(d / CK20, "r") as f:
        eta = json.loads(f.attrs["integrator"])["eta"]
    _integrator(d / CK20, eta=[float("nan"), *eta[1:]])
    r = capped_engine(["run", *RUN, "steps=40", f"restart={CK20}"], d, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert CK20 in line and "eta[0] is not a finite number" in line and "dt" not in line.split("use an")[0], line


def test_restart_auto_skips_a_bad_newest_checkpoint_and_says_which(good_run, tmp_path):
    """NaN in the newest checkpoint's chain: restart=auto continues from step 10 instead, with one
    Warning line naming the file it passed over and why, and reaches steps=30 healthy."""
    d = _copy(good_run, tmp_path)
    _integrator(d / CK20, t_current=float("inf"))
    r = capped_engine(["run", *RUN, "steps=30", "restart=auto"], d, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    warns = [ln for ln in r.stderr.splitlines() if ln.startswith("Warning:")]
    assert len(warns) == 1 and "restart=auto skipped" in warns[0] and CK20 in warns[0], r.stderr
    assert "t_current is not a finite number" in warns[0], warns
    assert "Traceback" not in r.stderr
    with h5py.File(d / "run.ckpt" / "step-000000000030.h5", "r") as f:
        assert f.attrs["step"] == 30 and np.isfinite(f["atoms/velocities"][()]).all()


def _set_attr(name, value):
    def edit(f):
        f.attrs[name] = value
    return edit


def _del_attr(name):
    return lambda f: f.attrs.__delitem__(name)


def _state(**changes):
    def edit(f):
        d = json.loads(f.attrs["integrator"])
        d.update(changes)
        f.attrs["integrator"] = json.dumps(d)
    return edit


def _field_variants(name, shape, dtype):
    """Corruptions of dataset ``name`` (shape, dtype of the real one): (label, edit, needle)."""
    out = [
        ("wrong shape: a row short", lambda f: _replace(f, name, f[name][()][:-1]), name),
        ("wrong shape: extra axis", lambda f: _replace(f, name, f[name][()][..., None]), name),
        ("wrong dtype: strings", lambda f: _replace(f, name, np.full(shape, b"x", dtype="S4")), name),
        ("huge: 1e9 rows, empty", lambda f: _empty(f, name, (10 ** 9, *shape[1:]), dtype), name),
        ("unwritten: right shape, nothing stored", lambda f: _empty(f, name, shape, dtype), name),
        ("missing", lambda f: f.__delitem__(name), name),
        ("a group, not a dataset", lambda f: (f.__delitem__(name), f.create_group(name)), name),
        ("a link to another file", lambda f: (f.__delitem__(name), f.__setitem__(name, h5py.ExternalLink(
            "/dev/zero", "/x"))), name),
    ]
    if np.dtype(dtype).kind == "f":
        out += [("NaN", lambda f: f[name].__setitem__((0,) * len(shape), np.nan), name.split("/")[-1]),
                ("inf", lambda f: f[name].__setitem__((0,) * len(shape), np.inf), name.split("/")[-1]),
                ("wrong dtype: integers", lambda f: _replace(f, name, np.ones(shape, dtype=np.int64)), name)]
    elif name != "box/pbc":
        out += [("wrong dtype: floats", lambda f: _replace(f, name, np.ones(shape, dtype=np.float64)), name),
                ("huge value", lambda f: _replace(f, name, np.full(shape, 2 ** 40 if "images" in name else 2 ** 62)),
                 {"atoms/ids": "ids", "atoms/numbers": "atomic numbers", "atoms/images": "atoms/images"}[name])]
    return out


ATTR_VARIANTS = [
    ("step negative", _set_attr("step", -5), "attribute step"),
    ("step text", _set_attr("step", "twenty"), "attribute step"),
    ("step float", _set_attr("step", 20.5), "attribute step"),
    ("step array", _set_attr("step", np.array([20, 30])), "attribute step"),
    ("step missing", _del_attr("step"), "attribute step"),
    ("time NaN", _set_attr("time", np.nan), "attribute time"),
    ("time text", _set_attr("time", "now"), "attribute time"),
    ("format from the future", _set_attr("format", 99), "attribute format"),
    ("format text", _set_attr("format", "one"), "attribute format"),
    ("model_name a number", _set_attr("model_name", 7), "attribute model_name"),
    ("model_identity missing", _del_attr("model_identity"), "attribute model_identity"),
    ("config not JSON", _set_attr("config", "{oops"), "attribute config"),
    ("config a JSON list", _set_attr("config", "[1, 2]"), "attribute config"),
    ("config a number", _set_attr("config", 3), "attribute config"),
    ("integrator missing", _del_attr("integrator"), "attribute integrator"),
    ("integrator deeply nested", _set_attr("integrator", "[" * 20000 + "]" * 20000), "attribute integrator"),
    ("integrator unknown name", _state(name="leapfrog"), "'leapfrog'"),
    ("integrator name missing", _state(name=None), "name None"),
    ("eta NaN", _state(eta=[float("nan"), 0.0, 0.0]), "eta[0]"),
    ("eta too short", _state(eta=[0.0]), "eta must be a list of 3"),
    ("eta_dot text", _state(eta_dot="fast"), "eta_dot"),
    ("chain text", _state(chain="3"), "chain"),
    ("chain negative", _state(chain=-1), "chain"),
    ("dof zero", _state(dof=0), "dof"),
    ("dof missing", _state(dof=None), "dof"),
    ("t_current text", _state(t_current="hot"), "t_current"),
    ("t_current Infinity", _state(t_current=float("inf")), "t_current"),
    ("dt zero", _state(dt=0.0), "dt"),
    ("temperature true", _state(temperature=True), "temperature"),
    ("fixed_ids huge", _state(fixed_ids=[[0, 10 ** 11]]), "fixed_ids"),
    ("fixed_ids all", _state(fixed_ids=[[0, 108]]), "fixed_ids"),
    ("fixed_ids beyond", _state(fixed_ids=[[200, 201]]), "fixed_ids"),
    ("fixed_ids text", _state(fixed_ids="0-3"), "fixed_ids"),
    ("fixed_ids floats", _state(fixed_ids=[[0.0, 3.0]]), "fixed_ids"),
    ("reference_cell wrong", _state(reference_cell=[[1, 2], [3]]), "reference_cell"),
    ("grid zero", _state(grid=[0, 1, 1]), "grid"),
]


def _variants(ck: Path):
    with h5py.File(ck, "r") as f:
        fields = {k: (f[k].shape, f[k].dtype) for k in [f"atoms/{n}" for n in f["atoms"]] + ["box/cell", "box/pbc"]}
    out = [(f"{k}: {label}", edit, needle) for k, (shape, dtype) in fields.items()
           for label, edit, needle in _field_variants(k, shape, dtype)]
    return out + [(f"attrs: {label}", edit, needle) for label, edit, needle in ATTR_VARIANTS]


def test_fuzz_every_checkpoint_field_gives_one_line(good_run, tmp_path):
    """A real checkpoint, each field corrupted in several ways (wrong shape, wrong dtype, NaN,
    huge, unwritten, missing, wrong type of attribute, bad integrator state): ``engine info``
    and an explicit ``restart=`` each answer exit 2 with ONE line naming the file and the field,
    no traceback, all under the memory cap."""
    d = _copy(good_run, tmp_path)
    cases, names = [], []
    for i, (label, edit, needle) in enumerate(_variants(d / CK20)):
        ck = d / f"v{i:03d}.h5"
        shutil.copy(d / CK20, ck)
        with h5py.File(ck, "r+") as f:
            edit(f)
        names.append((label, ck.name, needle))
        cases.append((["info", ck.name], d))
        cases.append((["run", *RUN, "steps=40", f"restart={ck.name}", f"output=o{i:03d}.h5"], d))
    assert len(names) >= 100
    results = capped_many(cases, tmp_path)
    bad = []
    for k, (label, file, needle) in enumerate(names):
        for what, r in (("info", results[2 * k]), ("restart", results[2 * k + 1])):
            lines = [ln for ln in r["stderr"].strip().splitlines() if not ln.startswith("Warp CUDA warning")]
            ok = (r["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: ") and file in lines[0]
                  and needle in lines[0] and "Traceback" not in r["stderr"])
            if not ok:
                bad.append(f"{label} [{what}] -> {r['code']}: {r['stderr'][-300:]!r}")
    assert not bad, f"{len(bad)} of {2 * len(names)} cases:\n" + "\n".join(bad)
    assert not list(d.glob("o*.h5")), "a refused restart wrote an output"
