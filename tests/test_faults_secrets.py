"""Values taken from the environment (``${oc.env:VAR}``) never reach a stored file or the
terminal (docs/safety.md): real runs with secrets in the input file's folder, the output's
folder, the temperature and a model parameter; every byte of every file the run and Hydra
write (trajectory, checkpoints, log, .hydra/) is searched for them, and stdout and stderr.
The stored configs hold the expressions; a restart still tells a changed value from the same
one (by a salted digest); a value that fails to resolve is one line without it; the ASE
calculator's record and pickle hold the expression."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import pytest
from conftest import cli_in_process

from shardmd.engine.io.checkpoint import read_checkpoint
from shardmd.engine.io.h5md_read import read_config_group

pytestmark = pytest.mark.fault

SECRETS = {"SHARDMD_TEST_DIR": "dir-s3cr3t-4f7a", "SHARDMD_TEST_SUB": "sub-s3cr3t-9c2e",
           "SHARDMD_TEST_T": "123.456789123", "SHARDMD_TEST_EPS": "0.0104123456789"}
BASE = ["model=lj", "threads=1", "quiet=true", "integrator=langevin", "checkpoint.every=5"]
USES = ["system.file=${oc.env:SHARDMD_TEST_DIR}/start.extxyz", "output=${oc.env:SHARDMD_TEST_SUB}/run.h5",
        "temperature=${oc.env:SHARDMD_TEST_T}", "model.epsilon.Ar=${oc.env:SHARDMD_TEST_EPS}"]


@pytest.fixture
def secret_env(tmp_path, monkeypatch):
    """The secrets in the environment, and a 3x3x3 argon crystal in the secret folder."""
    from ase.build import bulk
    from ase.io import write

    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    folder = tmp_path / SECRETS["SHARDMD_TEST_DIR"]
    folder.mkdir()
    write(folder / "start.extxyz", bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3))
    return tmp_path


def leaks(root: Path, *texts: str) -> list[str]:
    """'file: secret' for every secret found in the bytes of a file under ``root`` (or in ``texts``)."""
    found = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix != ".extxyz":   # the input itself holds no secret, only its folder name
            data = p.read_bytes()
            found += [f"{p.relative_to(root)}: {s}" for s in SECRETS.values() if s.encode() in data]
    for i, t in enumerate(texts):
        found += [f"stream {i}: {s}" for s in SECRETS.values() if s in t]
    return found


def test_secrets_reach_no_file_and_no_stream_and_the_stored_config_holds_the_expressions(
        secret_env, capfd, monkeypatch):
    # a job folder of Hydra's (the output goes inside it, still as an expression) and its .hydra/
    r = cli_in_process(["run", *BASE, *USES, "steps=10", "hydra.run.dir=job", "hydra.output_subdir=.hydra"],
                       secret_env, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    job = secret_env / "job"
    out = job / SECRETS["SHARDMD_TEST_SUB"] / "run.h5"
    ckpts = sorted(out.with_suffix(".ckpt").glob("step-*.h5"))
    assert out.is_file() and len(ckpts) == 2 and (job / ".hydra" / "config.yaml").is_file()
    assert leaks(secret_env, r.stdout, r.stderr) == []
    # the run used the resolved values: its first thermo row is at the temperature given
    log = out.with_suffix(".log").read_text()
    assert "123.457" in log.splitlines()[3], log
    assert "'${oc.env:SHARDMD_TEST_T}'" in log.splitlines()[0] and "model.epsilon={Ar:" in log.splitlines()[0]
    with h5py.File(out, "r") as f:
        stored = read_config_group(f)
    for cfg in (stored, read_checkpoint(ckpts[-1])["config"]):
        assert cfg["temperature"] == "${oc.env:SHARDMD_TEST_T}"
        assert cfg["model"]["epsilon"] == {"Ar": "${oc.env:SHARDMD_TEST_EPS}"}
        assert cfg["system"]["file"] == "${oc.env:SHARDMD_TEST_DIR}/start.extxyz"
        assert cfg["output"] == "job/${oc.env:SHARDMD_TEST_SUB}/run.h5"
        assert sorted(cfg["resolved_digests"]) == ["model", "temperature"]   # the physics keys among them
        assert "${oc.env:SHARDMD_TEST_EPS}" in cfg["model_identity"]
    assert "${oc.env:SHARDMD_TEST_T}" in (job / ".hydra" / "config.yaml").read_text()
    assert "temperature" not in json.loads(h5py.File(ckpts[-1], "r").attrs["integrator"])   # only an echo


def test_restart_tells_a_changed_secret_physics_value_by_its_digest(secret_env, capfd, monkeypatch):
    args = ["run", *BASE, *USES]
    assert cli_in_process([*args, "steps=5"], secret_env, capfd, monkeypatch).returncode == 0
    ck = next((secret_env / SECRETS["SHARDMD_TEST_SUB"] / "run.ckpt").glob("step-*.h5"))
    digest = read_checkpoint(ck)["config"]["resolved_digests"]["temperature"]
    assert len(bytes.fromhex(digest["salt"])) == 16 and len(digest["scrypt"]) == 64
    for key, value, word in (("SHARDMD_TEST_T", "123.456789124", "temperature"),
                             ("SHARDMD_TEST_EPS", "0.0104123456788", "model")):
        monkeypatch.setenv(key, value)
        r = cli_in_process([*args, "steps=10", "restart=auto"], secret_env, capfd, monkeypatch)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and f"restart would change {word} from" in lines[0], r.stderr
        assert "of output=${oc.env:SHARDMD_TEST_SUB}/run.h5" in lines[0]
        monkeypatch.setenv(key, SECRETS[key])
        assert leaks(secret_env, r.stdout, r.stderr.replace(value, "")) == []
    r = cli_in_process([*args, "steps=10", "restart=auto"], secret_env, capfd, monkeypatch)
    assert r.returncode == 0, r.stderr
    assert "Restart from" in (secret_env / SECRETS["SHARDMD_TEST_SUB"] / "run.log").read_text()
    assert leaks(secret_env, r.stdout, r.stderr) == []


@pytest.mark.parametrize("arg, needle", [
    ("temperature=${oc.env:SHARDMD_TEST_SUB}", "temperature=${oc.env:SHARDMD_TEST_SUB}: the value it resolves to"),
    ("steps=${oc.env:SHARDMD_TEST_T}", "steps=${oc.env:SHARDMD_TEST_T}: the value it resolves to"),
    ("model.epsilon=${oc.env:SHARDMD_TEST_DIR}", "model.epsilon='${oc.env:SHARDMD_TEST_DIR}' (its value not shown)"),
])
def test_a_secret_of_the_wrong_type_is_one_line_without_its_value(secret_env, capfd, monkeypatch, arg, needle):
    r = cli_in_process(["run", "model=lj", "threads=1", "steps=1", arg], secret_env, capfd, monkeypatch)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert leaks(secret_env, r.stdout, r.stderr) == []


def test_the_ase_calculator_records_the_expression_and_uses_the_value(secret_env):
    from ase.build import bulk

    from shardmd.engine.ase_calculator import ShardMDCalculator

    calc = ShardMDCalculator(model="lj", epsilon={"Ar": "${oc.env:SHARDMD_TEST_EPS}"})
    assert calc.todict()["epsilon"] == {"Ar": "${oc.env:SHARDMD_TEST_EPS}"}
    assert SECRETS["SHARDMD_TEST_EPS"].encode() not in pickle.dumps(calc)
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    plain = ShardMDCalculator(model="lj", epsilon={"Ar": float(SECRETS["SHARDMD_TEST_EPS"])})
    assert calc.get_potential_energy(atoms) == plain.get_potential_energy(atoms)
    assert pickle.loads(pickle.dumps(calc)).get_potential_energy(atoms) == plain.get_potential_energy(atoms)
