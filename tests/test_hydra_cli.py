"""Hydra's own command line for ``python -m engine run``: sweeps (-m) with a folder per job, in
turn (also as SLURM array tasks and with self-launched ranks), --cfg, config files of the user,
--version, hydra.run.dir=, ~key, the configuration echoed in the log.  Real Hydra, real runs of
small systems: the acceptance sweep as a real process, the rest through ``cli.main`` in this
process (the code a process would run, without a second's start-up each).
"""
from __future__ import annotations

import shlex
from pathlib import Path

import h5py
import pytest
import yaml
from conftest import run_engine

from shardmd.engine.cli.main import main
from shardmd.engine.io.h5md import read_frames

TINY = ["model=lj", "system.repeat=[2,2,2]", "quiet=true"]


def cli(args, cwd, capsys, monkeypatch) -> tuple[int, str, list[str]]:
    """``python -m engine <args>`` in this process: (exit status, stdout, stderr lines)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, [ln for ln in err.strip().splitlines() if ln and not ln.startswith("Warp CUDA warning")]


def one_line(lines, needle):
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert needle in lines[0], (needle, lines[0])


def thermo_temperature(log: Path, step: int) -> float:
    for line in log.read_text().splitlines():
        cols = line.split()
        if cols and cols[0] == str(step):
            return float(cols[2])
    raise AssertionError(f"no thermo line for step {step} in {log}")


def test_sweep_runs_two_complete_jobs_in_two_folders(tmp_path):
    """The acceptance command: two jobs, one after another, each a complete run in its folder."""
    r = run_engine(["run", "model=lj", "temperature=100,200", "-m", "steps=20", "system.repeat=[2,2,2]"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    jobs = sorted(tmp_path.glob("multirun/*/*/[0-9]*"))
    assert [j.name for j in jobs] == ["0", "1"] and len({j.parent for j in jobs}) == 1
    assert (jobs[0].parent / "multirun.yaml").is_file()        # Hydra's record of the sweep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun"]
    for job, temperature in zip(jobs, (100, 200)):
        assert [f.info["step"] for f in read_frames(job / "run.h5")] == [0, 20]
        assert (job / "run.ckpt" / "step-000000000020.h5").is_file()
        log = job / "run.log"
        assert log.read_text().startswith("Config: model=lj ") and f" temperature={temperature}.0 " in log.read_text()
        assert thermo_temperature(log, 0) == pytest.approx(temperature)
        assert f"job {job.name}: model=lj temperature={temperature}" in r.stdout


def test_sweep_values_are_checked_before_any_job(tmp_path, capsys, monkeypatch):
    code, _, err = cli(["run", *TINY, "temperature=100,-5", "-m", "steps=2"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "temperature=-5.0 is invalid")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_job_does_not_stop_the_sweep(tmp_path, capsys, monkeypatch):
    """dt=300 blows up (exit 3); the next job still runs; the sweep's status is the failure's."""
    code, _, err = cli(["run", *TINY, "dt=300,1", "-m", "steps=10", "hydra.sweep.dir=sw"], tmp_path, capsys,
                       monkeypatch)
    assert code == 3
    assert err[0].startswith("error: job 0:") and "health.max_step" in err[0]
    assert err[-1] == "error: 1 of 2 jobs failed: job 0 (exit 3); outputs in sw"
    assert [f.info["step"] for f in read_frames(tmp_path / "sw" / "1" / "run.h5")] == [0, 10]


def _summary(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_sweep_of_three_with_one_failing_writes_its_summary(tmp_path, capsys, monkeypatch):
    """dt=300 blows up (exit 3) between two good jobs: the sweep exits 3, keeps both other outputs and
    writes summary.csv with every job: overrides, exit status, output and the last potential energy
    (h5py's read of each trajectory; the log's last thermo line without one, job 2)."""
    code, _, err = cli(["run", *TINY, "dt=1,300,2", "-m", "steps=10", "hydra.sweep.dir=sw", "thermo.every=5"],
                       tmp_path, capsys, monkeypatch)
    assert code == 3
    assert err[-1] == "error: 1 of 3 jobs failed: job 1 (exit 3); outputs in sw"
    rows = _summary(tmp_path / "sw" / "summary.csv")
    assert [(r["job"], r["overrides"], r["exit_status"]) for r in rows] == \
        [(str(j), f"model=lj system.repeat=[2,2,2] quiet=True dt={dt} steps=10 thermo.every=5", code)
         for j, dt, code in ((0, 1, "0"), (1, 300, "3"), (2, 2, "0"))]
    assert [r["output"] for r in rows] == [f"sw/{j}/run.h5" for j in range(3)]
    for j in (0, 2):
        with h5py.File(tmp_path / "sw" / str(j) / "run.h5") as f:
            step = int(f["observables/potential_energy/step"][-1])
            energy = float(f["observables/potential_energy/value"][-1])
        assert step == 10 and (int(rows[j]["final_step"]), float(rows[j]["final_potential_energy"])) == (10, energy)
    assert int(rows[1]["final_step"]) < 10     # the failed job's last healthy record


def test_a_sweep_summary_reads_the_log_without_a_trajectory(tmp_path, capsys, monkeypatch):
    """trajectory.every=0: no trajectory, the energy of the log's last thermo line."""
    code, _, err = cli(["run", *TINY, "temperature=100,200", "-m", "steps=6", "hydra.sweep.dir=sw",
                        "trajectory.every=0", "thermo.every=3"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    for r in _summary(tmp_path / "sw" / "summary.csv"):
        last = [ln.split() for ln in (tmp_path / "sw" / r["job"] / "run.log").read_text().splitlines()
                if ln.split()[:1] == ["6"]][-1]
        assert not (tmp_path / "sw" / r["job"] / "run.h5").exists()
        assert (r["final_step"], float(r["final_potential_energy"])) == ("6", float(last[3]))


def test_slurm_array_task_runs_its_own_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "99")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    code, _, err = cli(["run", *TINY, "temperature=100,200", "-m", "steps=5"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    assert [p.relative_to(tmp_path).as_posix() for p in sorted(tmp_path.glob("multirun/*/*/run.h5"))] == \
        ["multirun/99/1/run.h5"]
    assert " temperature=200.0 " in (tmp_path / "multirun/99/1/run.log").read_text()
    assert [r["job"] for r in _summary(tmp_path / "multirun/99/summary-1.csv")] == ["1"]   # its own job only
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    code, _, err = cli(["run", *TINY, "temperature=100,200", "-m", "steps=5"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "the sweep has 2 (submit it with --array=0-1)")


def test_a_sweep_under_a_launcher_needs_one_folder(tmp_path, capsys, monkeypatch):
    """Every rank of mpiexec/srun runs the sweep; ${now:} could differ between them."""
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")
    monkeypatch.setenv("PMI_PORT", "localhost:1")   # a launcher's wiring: without it the two are strays
    code, _, err = cli(["run", *TINY, "temperature=100,200", "-m"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "give hydra.sweep.dir=DIR")


@pytest.mark.slow
@pytest.mark.mpi
def test_sweep_jobs_with_domains_start_their_ranks_in_turn(tmp_path):
    r = run_engine(["run", "model=lj", "domains=2", "temperature=100,200", "-m", "system.repeat=[4,4,4]",
                    "steps=10", "quiet=true", "hydra.sweep.dir=sw"], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    for job, temperature in (("0", 100), ("1", 200)):
        log = (tmp_path / "sw" / job / "run.log").read_text()
        assert "domains 2 (grid 2x1x1)" in log and " domains=2 " in log.splitlines()[0]
        assert thermo_temperature(tmp_path / "sw" / job / "run.log", 0) == pytest.approx(temperature)
        assert [f.info["step"] for f in read_frames(tmp_path / "sw" / job / "run.h5")] == [0, 10]


@pytest.mark.slow
def test_a_sweep_continues_with_restart_auto(tmp_path):
    base = ["run", "model=lj", "temperature=100,200", "-m", "system.repeat=[2,2,2]", "quiet=true",
            "hydra.sweep.dir=sw", "trajectory.every=10"]
    assert run_engine([*base, "steps=10"], cwd=tmp_path).returncode == 0
    r = run_engine([*base, "steps=20", "restart=auto"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for job in ("0", "1"):
        assert [f.info["step"] for f in read_frames(tmp_path / "sw" / job / "run.h5")] == [0, 10, 20]
        assert "Restart from" in (tmp_path / "sw" / job / "run.log").read_text()


def test_cfg_job_prints_the_composed_config(tmp_path, capsys, monkeypatch):
    code, out, err = cli(["run", "model=mace", "--cfg", "job", "steps=3"], tmp_path, capsys, monkeypatch)
    assert code == 0 and not err
    cfg = yaml.safe_load(out)
    assert cfg["model"]["name"] == "mace" and cfg["steps"] == 3 and cfg["system"]["element"] == "Cu"
    assert cfg["integrator"] == {"name": "verlet"} and "hydra" not in cfg
    assert list(tmp_path.iterdir()) == []
    code, out, _ = cli(["run", "model=lj", "--cfg", "hydra"], tmp_path, capsys, monkeypatch)
    assert code == 0 and yaml.safe_load(out)["hydra"]["run"]["dir"] == "."
    code, _, err = cli(["run", "model=lj", "--cfg", "job", "dt=0"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "dt=0.0 is invalid")


MINE = """\
defaults:
  - shardmd
  - override model: lj
  - _self_
steps: 12
temperature: 90
system:
  repeat: [2, 2, 2]
model:
  epsilon: {Ar: 0.0104, Kr: 0.014}
  sigma: {Ar: 3.40, Kr: 3.65}
"""


def test_a_config_file_of_the_user_composes_and_runs(tmp_path, capsys, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "mine.yaml").write_text(MINE)
    code, out, err = cli(["run", "--config-path=conf", "--config-name=mine", "--cfg", "job", "seed=7"],
                         tmp_path, capsys, monkeypatch)
    assert code == 0, err
    cfg = yaml.safe_load(out)
    assert (cfg["steps"], cfg["temperature"], cfg["seed"]) == (12, 90.0, 7)
    assert cfg["model"]["sigma"] == {"Ar": 3.4, "Kr": 3.65}
    assert cfg["dt"] == 1.0 and cfg["neighbor"]["skin"] == 1.0      # the rest: ShardMD's defaults
    code, _, err = cli(["run", "config=conf/mine.yaml", "quiet=true"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    assert [f.info["step"] for f in read_frames(tmp_path / "run.h5")] == [0, 12]
    assert " temperature=90.0 " in (tmp_path / "run.log").read_text().splitlines()[0]


def test_config_files_that_cannot_work_are_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "plain.yaml").write_text("steps: 3\n")
    code, _, err = cli(["run", "config=plain.yaml"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "defaults: [shardmd, _self_]")
    code, _, err = cli(["run", "config=absent.yaml"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "absent.yaml")
    code, _, err = cli(["run", "--config-path=.", "--config-name=nothere"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "nothere")


def test_version(tmp_path):
    for args in (["--version"], ["run", "--version"]):
        r = run_engine(args, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("shardmd 0.1.0 (hydra-core "), r.stdout + r.stderr


def test_hydra_run_dir_holds_the_outputs(tmp_path, capsys, monkeypatch):
    code, _, err = cli(["run", *TINY, "steps=3", "hydra.run.dir=out/a"], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out" / "a").iterdir()) == ["run.ckpt", "run.h5", "run.log"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_removing_keys(tmp_path, capsys, monkeypatch):
    from shardmd.engine.config.compose import compose_config

    cfg = compose_config(["model=lj", "grid=[1,1,1]", "~grid", "restart=auto", "~restart.file"])
    assert cfg.grid is None and cfg.restart.file is None
    cfg = compose_config(["model=lj", "model.epsilon.Kr=0.014", "model.sigma.Kr=3.65", "~model.epsilon.Kr",
                          "~model.sigma.Kr"])
    assert dict(cfg.model.epsilon) == {"Ar": 0.0104} and dict(cfg.model.sigma) == {"Ar": 3.4}
    code, _, err = cli(["run", "model=lj", "~seed"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "seed cannot be removed, only set (seed=...); keys that can be removed: grid, restart.file")
    code, _, err = cli(["run", "model=lj", "~model.epsilon.Xe"], tmp_path, capsys, monkeypatch)
    assert code == 2
    one_line(err, "no such entry")


def test_the_log_echoes_the_configuration_once_as_overrides(tmp_path, capsys, monkeypatch):
    """The log's first line, pasted back as overrides, composes the same configuration."""
    from omegaconf import OmegaConf

    from shardmd.engine.config.compose import compose_config

    args = [*TINY, "steps=4", "integrator=langevin", "model.epsilon={Ar: 0.0104, Kr: 0.014}",
            "model.sigma.Kr=3.65", "model.pairs={Ar-Kr: {epsilon: 0.012, sigma: 3.5}}", "output=o u t.h5"]
    code, _, err = cli(["run", *args], tmp_path, capsys, monkeypatch)
    assert code == 0, err
    lines = (tmp_path / "o u t.log").read_text().splitlines()
    assert lines[0].startswith("Config: ") and sum(ln.startswith("Config:") for ln in lines) == 1
    assert lines[1].startswith("ShardMD: 32 atoms")
    echoed = compose_config(shlex.split(lines[0])[1:])
    assert OmegaConf.to_container(echoed) == OmegaConf.to_container(compose_config(args))


def test_help_names_hydras_flags(tmp_path):
    r = run_engine(["run", "--help"], cwd=tmp_path)
    assert r.returncode == 0
    for text in ("-m, --multirun", "--cfg job", "--config-path DIR --config-name NAME", "hydra.run.dir=DIR",
                 "~key", "integrator.friction"):
        assert text in r.stdout, text

