"""The README's promises: its two commands, CI calling the test one, every key documented."""
import re
from pathlib import Path

from shardmd.engine.config import KEYS

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)[:2]


def test_readme_starts_with_two_commands_and_ci_runs_the_second():
    text = (ROOT / "README.md").read_text()
    run, test = _readme_commands()
    assert text.index(run) < 200
    assert "python -m engine run" in run and "pytest" in test
    assert "torch==2.13.0" in run and "torch==2.13.0" in test
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == test


def test_every_key_is_documented():
    text = (ROOT / "README.md").read_text()
    missing = [k for k in KEYS if f"`{k}`" not in text]
    assert not missing


def test_pyproject_pins_nothing():
    text = (ROOT / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "==" not in deps and "mpich" not in deps and "openmpi" not in deps


def test_every_config_key_is_in_the_schema():
    from omegaconf import OmegaConf

    from shardmd.engine.config import OPEN_MAPS, compose_config, group_options

    def leaves(node, prefix=""):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if OmegaConf.is_dict(v) and key not in OPEN_MAPS:
                yield from leaves(v, key + ".")
            else:
                yield key

    for model in group_options("model"):
        for integ in group_options("integrator"):
            cfg = compose_config([f"model={model}", f"integrator={integ}"])
            unknown = [k for k in leaves(cfg) if k not in KEYS and k not in ("model.name", "integrator.name")]
            assert not unknown, (model, integ, unknown)
