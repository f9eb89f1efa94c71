"""Config files are data: a file of someone else's (``config=FILE.yaml``, ``--config-path``,
group files in a config folder) that names code (Hydra callbacks, logging factories and
classes, ``_target_``, another launcher, a ``pkg://`` search path, ``hydra.job.env_set``, a
model route, ``model.trust_pickle``) is refused with one line before anything runs, unless
``allow_code=true`` is on the command line; then the log notes what was allowed.

Each hostile file would truncate a victim file or import a module of the working directory
that leaves a marker; every case checks the victim is intact and no marker exists.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_engine, run_in_process

pytestmark = pytest.mark.fault

SMALL = ["system.repeat=[3,3,3]", "steps=0", "quiet=true", "threads=1"]
HEAD = "defaults:\n  - shardmd\n  - override model: lj\n  - _self_\n"
#: a module of the working directory: importing it, or calling it, leaves a marker
EVIL = ("import pathlib\npathlib.Path('imported.txt').write_text('x')\n"
        "def make(**kw):\n    pathlib.Path('called.txt').write_text('x')\n    return None\n"
        "class CB:\n    def __init__(self, **kw):\n        pathlib.Path('called.txt').write_text('x')\n")


def _files(tmp_path: Path, files: dict[str, str]) -> None:
    (tmp_path / "evilmod.py").write_text(EVIL)
    (tmp_path / "victim.txt").write_text("precious\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text.replace("VICTIM", str(tmp_path / "victim.txt")))


def _untouched(tmp_path: Path) -> None:
    assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert not (tmp_path / "imported.txt").exists() and not (tmp_path / "called.txt").exists()


#: a model of the user's own (a route on the command line is the user's choice)
MYMODEL = ("from shardmd.models.registry import lj\n\n\ndef make(**kw):\n"
           "    return lj(epsilon={'Ar': 0.0104}, sigma={'Ar': 3.4}, cutoff=8.5)\n")
HANDLER = "{version: 1, handlers: {h: {%s}}, root: {handlers: [h]}}"
CASES = {
    "callback": ("hydra:\n  callbacks:\n    boom: {_target_: evilmod.CB}\n", "hydra.callbacks.boom"),
    "logging_factory": ("hydra:\n  job_logging: " + HANDLER % "'()': evilmod.make" + "\n",
                        "hydra.job_logging.handlers.h.()"),
    "file_handler_truncates": ("hydra:\n  hydra_logging: " + HANDLER % "class: logging.FileHandler, "
                               "filename: VICTIM, mode: w" + "\n", "hydra.hydra_logging.handlers.h.class"),
    "formatter_class": ("hydra:\n  job_logging: {version: 1, formatters: {f: {class: evilmod.CB}}}\n",
                        "hydra.job_logging.formatters.f.class"),
    "ext_name": ("hydra:\n  job_logging: " + HANDLER % "class: logging.StreamHandler, stream: ext://evilmod.make"
                 + "\n", "ext://evilmod.make"),
    "launcher": ("hydra:\n  launcher: {_target_: evilmod.CB}\n", "hydra.launcher._target_=evilmod.CB"),
    "sweeper": ("hydra:\n  sweeper: {_target_: evilmod.CB}\n", "hydra.sweeper._target_=evilmod.CB"),
    "searchpath": ("hydra:\n  searchpath: [pkg://evilmod]\n", "pkg://evilmod"),
    "env_set": ("hydra:\n  job:\n    env_set: {LD_PRELOAD: ./evil.so}\n", "hydra.job.env_set.LD_PRELOAD"),
    "nested_target": ("hydra:\n  job_logging: {version: 1, filters: {f: {deep: [{_target_: evilmod.make}]}}}\n",
                      "hydra.job_logging.filters.f.deep[0]._target_"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_config_file_that_names_code_is_refused_in_one_line(case, tmp_path, capfd, monkeypatch):
    text, named = CASES[case]
    _files(tmp_path, {"hostile.yaml": HEAD + "steps: 0\n" + text})
    monkeypatch.syspath_prepend(str(tmp_path))   # as python -m engine has it: the working directory first
    code, lines = run_in_process(["run", "config=hostile.yaml", *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: the configuration would run code:"), lines
    assert named in lines[0] and "allow_code=true" in lines[0]
    _untouched(tmp_path)


def test_a_model_route_and_trust_pickle_from_a_file_are_refused(tmp_path, capfd, monkeypatch):
    _files(tmp_path, {"route.yaml": "defaults:\n  - shardmd\n  - override model: custom\n  - _self_\n"
                                    "model:\n  name: py:evilmod:make\n",
                      "pickle.yaml": "defaults:\n  - shardmd\n  - override model: mace\n  - _self_\n"
                                     "model:\n  trust_pickle: true\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    code, lines = run_in_process(["run", "config=route.yaml", *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "model.name=py:evilmod:make" in lines[0], lines
    code, lines = run_in_process(["run", "config=pickle.yaml", *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "model.trust_pickle=true" in lines[0], lines
    (tmp_path / "code.yaml").write_text("defaults:\n  - shardmd\n  - override model: custom\n  - _self_\n"
                                        "model:\n  name: metatomic\n  trust_code: true\n")
    code, lines = run_in_process(["run", "config=code.yaml", *SMALL], tmp_path, capfd, monkeypatch)
    # refused by name (a config file cannot give an open choice's keys; the guard names it if one could)
    assert code == 2 and len(lines) == 1 and "model.trust_code" in lines[0], lines
    _untouched(tmp_path)


GROUP_CB = "# @package hydra.callbacks\nboom: {_target_: evilmod.CB}\n"
GROUP_LOG = "version: 1\nhandlers: {h: {'()': evilmod.make}}\nroot: {handlers: [h]}\n"


@pytest.mark.parametrize("layout", ["group_override_on_the_command_line", "defaults_list_override",
                                    "config_dir_flag"])
def test_code_from_a_config_folders_hydra_groups_is_refused(layout, tmp_path, capfd, monkeypatch):
    """A config folder holding a hydra/ group folder: chosen on the command line (also from a
    --config-dir folder), or by the file's defaults list."""
    files = {"conf/hydra/callbacks/evil.yaml": GROUP_CB, "conf/hydra/job_logging/evil.yaml": GROUP_LOG,
             "conf/run.yaml": HEAD + "steps: 0\n"}
    args = ["--config-path=conf", "--config-name=run"]
    if layout == "group_override_on_the_command_line":
        args.append("hydra/callbacks=evil")
    elif layout == "defaults_list_override":
        files["conf/run.yaml"] = HEAD.replace("  - _self_", "  - override hydra/job_logging: evil\n  - _self_")
    else:   # --config-dir adds a folder whose group file the command line picks
        args = ["model=lj", "--config-dir=conf", "hydra/callbacks=evil"]
    _files(tmp_path, files)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, lines = run_in_process(["run", *args, *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: the configuration would run code: hydra."), lines
    _untouched(tmp_path)


def test_a_sweep_with_code_in_its_file_is_refused_before_any_job_runs(tmp_path, capfd, monkeypatch):
    _files(tmp_path, {"hostile.yaml": HEAD + "steps: 0\n" + CASES["callback"][0]})
    monkeypatch.syspath_prepend(str(tmp_path))
    code, lines = run_in_process(["run", "config=hostile.yaml", "temperature=100,200", "-m", "hydra.sweep.dir=sw",
                                  *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "hydra.callbacks.boom" in lines[0], lines
    assert not (tmp_path / "sw").exists()   # no job ran
    _untouched(tmp_path)


def test_a_target_anywhere_in_the_job_tree_is_refused(tmp_path, capfd, monkeypatch):
    """A model factory's argument holding a _target_ (a factory that instantiates its
    arguments would run it)."""
    _files(tmp_path, {"mymodel.py": MYMODEL})
    monkeypatch.syspath_prepend(str(tmp_path))
    code, lines = run_in_process(["run", "model=py:mymodel:make", "model.helper={_target_:evilmod.make}", *SMALL],
                                 tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1 and "model.helper._target_=evilmod.make" in lines[0], lines
    _untouched(tmp_path)


def test_allow_code_in_the_file_itself_does_not_opt_in(tmp_path, capfd, monkeypatch):
    """A file with harmless hydra settings runs without the opt-in; one that opts itself in is
    refused, saying the key belongs on the command line."""
    _files(tmp_path, {"argon.yaml": HEAD + "steps: 0\ntemperature: 120\nhydra:\n  job_logging: "
                      + HANDLER % "class: logging.StreamHandler, stream: ext://sys.stderr" + "\n",
                      "hostile.yaml": HEAD + "allow_code: true\n" + CASES["callback"][0]})
    monkeypatch.syspath_prepend(str(tmp_path))
    code, lines = run_in_process(["run", "config=argon.yaml", *SMALL], tmp_path, capfd, monkeypatch)
    assert code == 0, lines
    assert "Note:" not in (tmp_path / "run.log").read_text()
    code, lines = run_in_process(["run", "config=hostile.yaml", *SMALL, "output=h.h5"], tmp_path, capfd, monkeypatch)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: allow_code is read from the command line only"), lines
    _untouched(tmp_path)


def test_allow_code_on_the_command_line_runs_it_and_the_log_says_so(tmp_path):
    """A real process (the working directory importable, as python -m engine has it)."""
    _files(tmp_path, {"cb.yaml": HEAD + "steps: 0\n" + CASES["callback"][0]})
    r = run_engine(["run", "config=cb.yaml", *SMALL], cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "called.txt").exists(), r.stderr
    r = run_engine(["run", "config=cb.yaml", "allow_code=true", *SMALL], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "called.txt").exists()   # the user trusted the file: its callback ran
    log = (tmp_path / "run.log").read_text().splitlines()
    assert log[0].startswith("Config: ") and "allow_code" not in log[0]
    assert log[1] == ("Note: allow_code=true allows code the configuration names: hydra.callbacks.boom "
                      "(a callback: Hydra instantiates it)")


# -- spec files -------------------------------------------------------------------------------------
SPEC_HELPER = {"type": "PythonAdapter", "module_path": "evilmod", "attr_name": "make",
               "replacement": "evilmod:make", "factory": False}


def _spec(tmp_path: Path, ops=(), helpers=()) -> Path:
    from shardmd.domain.spec import SPEC_MPNN_HALO

    d = SPEC_MPNN_HALO.to_dict()
    d["distribution"]["custom_ops"] = list(ops)
    d["distribution"]["third_party_helpers"] = list(helpers)
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("names", ["op_module", "helper_module"])
def test_a_spec_file_imports_nothing_from_the_working_directory(names, tmp_path, monkeypatch):
    from shardmd.domain.spec import MLIPSpec, SpecImportRefused

    _files(tmp_path, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    op = {"op": "evil_ns::k", "overload": "default", "module": "evilmod", "arg_transforms": [],
          "output_transforms": []}
    p = _spec(tmp_path, ops=[op] if names == "op_module" else [], helpers=[SPEC_HELPER] if names != "op_module" else [])
    with pytest.raises(SpecImportRefused) as e:
        MLIPSpec.load(p)
    assert "'evilmod'" in str(e.value) and "allow_code=true" in str(e.value) and "\n" not in str(e.value)
    _untouched(tmp_path)


def test_a_spec_is_checked_whole_before_any_module_is_named(tmp_path, monkeypatch):
    """A bad field after the op list is reported, and the op's module is not imported."""
    from shardmd.domain.spec import MLIPSpec, SpecLoadError

    _files(tmp_path, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    op = {"op": "evil_ns::k", "overload": "default", "module": "evilmod", "arg_transforms": [],
          "output_transforms": []}
    p = _spec(tmp_path, ops=[op], helpers=[{"type": "NoSuchAdapter"}])
    with pytest.raises(SpecLoadError, match=r"third_party_helpers\[0\]: unknown type 'NoSuchAdapter'"):
        MLIPSpec.load(p, allow_imports=True)
    _untouched(tmp_path)


def test_model_spec_on_the_command_line_refuses_then_imports_with_allow_code(tmp_path):
    """model.spec=FILE naming a module of the working directory: one line, exit 2, nothing
    imported; with allow_code=true the module is imported and the log names it."""
    _files(tmp_path, {"mymodel.py": MYMODEL})
    p = _spec(tmp_path, helpers=[SPEC_HELPER])
    args = ["run", "model=py:mymodel:make", f"model.spec={p}", *SMALL]
    r = run_engine(args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: model.spec=") and "'evilmod'" in lines[0] and "allow_code=true" in lines[0]
    _untouched(tmp_path)
    r = run_engine([*args, "allow_code=true"], cwd=tmp_path)
    assert (tmp_path / "imported.txt").exists(), r.stderr   # allowed: the spec's module was imported
    assert f"Note: allow_code=true allows model.spec={p} to import: evilmod" in (tmp_path / "run.log").read_text()
