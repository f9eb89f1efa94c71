"""The model families that cannot share the main environment, tested in their own.

sevenn 0.13 needs e3nn >= 0.5, which mace-torch 0.3.16 and nequip 0.6 (the ``mace`` and ``test``
extras) exclude; metatomic's tests need metatrain (a PET with random weights), which the main
environment does not carry (docs/models.md). This test makes the family's environment as docs/models.md
says (``pip install torch==2.13.0 mpich==5.0.2 -e ".[sevennet]" pytest pytest-xdist scipy``),
keeps it under ``SHARDMD_ENV_CACHE`` (default ``~/.cache/shardmd/envs``) keyed by this clone's
path, the requirements its install asks for and the Python version, so later runs reuse it, and runs the family's test
file there. So the README's test command (CI's) tests every extra.
"""
from __future__ import annotations

import contextlib
import fcntl
import filecmp
import hashlib
import os
import secrets
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

#: family -> (pip arguments of its environment, its test file[, packages uninstalled after: mattersim 1.2.3
#: requires torchvision and torchaudio, whose PyPI wheels do not load against torch 2.13's CPU build and break
#: its import; docs/models.md says the same to users])
EXTRAS = {
    "sevennet": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[sevennet]", "pytest", "pytest-xdist", "scipy"],
                 "tests/test_sevennet.py"),
    "metatomic": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[metatomic]", "metatrain", "pytest", "pytest-xdist",
                   "scipy"], "tests/test_metatomic.py"),
    "allegro": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[allegro]", "pytest", "pytest-xdist", "scipy"],
                "tests/test_allegro.py"),
    "mattersim": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[mattersim]", "pytest", "pytest-xdist", "scipy"],
                  "tests/test_mattersim.py", ("torchvision", "torchaudio")),
    "orb": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[orb]", "pytest", "pytest-xdist", "scipy"],
            "tests/test_orb.py"),
    "aimnet2": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[aimnet2]", "pytest", "pytest-xdist", "scipy"],
                "tests/test_aimnet2.py"),
    "uma": (["torch==2.13.0", "mpich==5.0.2", "-e", f"{ROOT}[uma]", "pytest", "pytest-xdist", "scipy"],
            "tests/test_uma.py"),
}


def requirements(extra: str) -> list[str]:
    """What installing ``.[extra]`` asks of pip: the package's dependencies and the extra's (its
    own extras expanded), as pyproject.toml lists them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras, out, todo = project.get("optional-dependencies", {}), list(project.get("dependencies", [])), [extra]
    while todo:
        for req in extras.get(todo.pop(), []):
            inner = req.split("[", 1)[1].split("]", 1)[0] if req.startswith("shardmd[") else None
            todo += inner.split(",") if inner else []
            out += [] if inner else [req]
    return sorted(out)


def environment(name: str, pip_args: list[str], remove: tuple[str, ...] = ()) -> Path:
    """The family's virtual environment, made once per clone, requirements and Python version:
    keyed on what its install asks of pip (not on the whole pyproject.toml, whose every change
    would make all of them again); the package itself is installed editable, so its code is
    always this clone's."""
    extras = [a.split("[", 1)[1].rstrip("]") for a in pip_args if "[" in a]
    reqs = [r for e in extras for e2 in e.split(",") for r in requirements(e2)]
    key = hashlib.sha256("\n".join([str(ROOT), sys.version, *reqs, *pip_args, *remove]).encode()).hexdigest()[:16]
    base = Path(os.environ.get("SHARDMD_ENV_CACHE", Path.home() / ".cache" / "shardmd" / "envs"))
    env = base / f"{name}-{key}"
    if (env / "ready").is_file():
        return env
    base.mkdir(parents=True, exist_ok=True)
    with build_slot(base):
        return _make(env, name, base, pip_args, remove)


#: environments made at once (a guard for more workers than the suite's four: each makes ~0.5-1.3 GB
#: of files of its own, more before share_files)
BUILD_SLOTS = 4

#: distributions of the main environment put into a new family environment as hard links before
#: its install (1.15 GB of each one's ~1.6 GB): pip finds them installed at the version asked for
#: (``torch==2.13.0``, the same warp-lang) and neither unpacks nor copies them
SEEDED = ("torch", "warp-lang")


def seed(env: Path, names: tuple[str, ...]) -> int:
    """Hard-link the files of the main environment's distributions ``names`` (their RECORD,
    site-packages only) into ``env``'s site-packages; returns the files linked. pip can still
    replace one (it unlinks, the main environment keeps its copy)."""
    import importlib.metadata as md

    target, linked = _site(env), 0
    for name in names:
        dist = md.distribution(name)
        for f in dist.files or []:
            if str(f).startswith(".."):     # console scripts in bin/: not needed by the tests
                continue
            src, dst = Path(dist.locate_file(f)), target / f
            if not src.is_file():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
            linked += 1
    return linked


@contextlib.contextmanager
def build_slot(base: Path, slots: int = BUILD_SLOTS, limit_s: float = 3600.0):
    """Hold one of ``slots`` lock files under ``base`` while an environment is made, so that at
    most ``slots`` are made at once (peak disk: ~2 GB each until its files are shared)."""
    deadline = time.monotonic() + limit_s
    while True:
        for k in range(slots):
            fd = os.open(base / f".build-slot-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)   # releases the lock
            return
        assert time.monotonic() < deadline, f"no environment build slot under {base} within {limit_s:.0f} s"
        time.sleep(2.0)


def _make(env: Path, name: str, base: Path, pip_args: list[str], remove: tuple[str, ...]) -> Path:
    if (env / "ready").is_file():    # made by another worker while this one waited
        return env
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True, timeout=300)
    seed(env, SEEDED)
    r = subprocess.run([str(env / "bin" / "pip"), "install", "-q", *pip_args], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, f"making the {name} environment failed:\n{r.stderr[-3000:]}"
    if remove:
        r = subprocess.run([str(env / "bin" / "pip"), "uninstall", "-q", "-y", *remove], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"uninstalling {remove} from the {name} environment failed:\n{r.stderr[-3000:]}"
    share_files(env, [Path(sysconfig.get_paths()["purelib"])]
                + [e for e in base.glob("*/") if (e / "ready").is_file()])
    (env / "ready").write_text("pip install " + " ".join(pip_args) + "\n"
                               + (f"pip uninstall -y {' '.join(remove)}\n" if remove else ""))
    return env


def _site(env: Path) -> Path:
    """The site-packages folder of a virtual environment (or the folder itself when given one)."""
    found = sorted(env.glob("lib/python*/site-packages"))
    return found[0] if found else env


def share_files(env: Path, others: list[Path], smallest: int = 1 << 16) -> int:
    """Hard-link each file of ``env``'s site-packages that is byte for byte the file at the same
    place in one of ``others``' (torch, warp, numpy, scipy: ~1.3 GB of the ~2 GB of each of the
    seven environments, which CI makes from nothing: its disk is shared and was once too full).
    A file is replaced only by a link to an equal regular file on the same file system, through
    a fresh name (never a predictable one); files under ``smallest`` bytes are left as they are.
    Returns the bytes saved."""
    saved, mine, theirs = 0, _site(env), [_site(o) for o in others]
    for root, _, files in os.walk(mine):
        for name in files:
            path = Path(root) / name
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size < smallest or st.st_nlink > 1:
                continue
            rel = path.relative_to(mine)
            for other in theirs:
                twin = other / rel
                try:
                    tw = twin.lstat()
                except OSError:
                    continue
                if (stat.S_ISREG(tw.st_mode) and tw.st_size == st.st_size and tw.st_dev == st.st_dev
                        and filecmp.cmp(path, twin, shallow=False)):
                    fresh = path.with_name(f".{name}.{secrets.token_hex(8)}")
                    os.link(twin, fresh)
                    os.replace(fresh, path)
                    saved += st.st_size
                    break
    return saved


def test_share_files_links_equal_files_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "pkg").mkdir(parents=True)
    big = os.urandom(1 << 17)
    (a / "pkg" / "same.so").write_bytes(big)
    (b / "pkg" / "same.so").write_bytes(big)
    (a / "pkg" / "differs.so").write_bytes(big)
    (b / "pkg" / "differs.so").write_bytes(big[:-1] + bytes([big[-1] ^ 1]))
    (a / "pkg" / "small.py").write_bytes(b"x = 1\n")
    (b / "pkg" / "small.py").write_bytes(b"x = 1\n")
    (a / "pkg" / "alone.so").write_bytes(big)
    os.symlink(b / "pkg" / "same.so", a / "pkg" / "link.so")
    assert share_files(a, [tmp_path / "missing", b]) == len(big)
    assert (a / "pkg" / "same.so").stat().st_ino == (b / "pkg" / "same.so").stat().st_ino
    assert (a / "pkg" / "differs.so").stat().st_ino != (b / "pkg" / "differs.so").stat().st_ino
    assert (a / "pkg" / "differs.so").read_bytes() == big
    assert (a / "pkg" / "small.py").stat().st_nlink == 1 and (a / "pkg" / "link.so").is_symlink()
    assert sorted(p.name for p in (a / "pkg").iterdir()) == ["alone.so", "differs.so", "link.so", "same.so",
                                                             "small.py"]   # no stray names left
    assert share_files(a, [b]) == 0    # already shared


def test_seed_links_a_distribution_that_pip_then_finds_installed(tmp_path):
    import importlib.metadata as md

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=300)
    assert seed(env, ("warp-lang",)) > 100
    init = _site(env) / "warp" / "__init__.py"
    assert init.stat().st_ino == Path(md.distribution("warp-lang").locate_file("warp/__init__.py")).stat().st_ino
    ask = "import importlib.metadata as m; print(m.version('warp-lang'))"
    r = subprocess.run([str(env / "bin" / "python"), "-c", ask], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == md.version("warp-lang"), r.stderr


def test_build_slots_let_two_builds_in_and_hold_the_third(tmp_path):
    with build_slot(tmp_path, slots=2), build_slot(tmp_path, slots=2):
        with pytest.raises(AssertionError, match="no environment build slot"):
            with build_slot(tmp_path, slots=2, limit_s=0.0):
                pass
    with build_slot(tmp_path, slots=2):     # released on leaving
        pass
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / ".build-slot-0.lock").unlink()
    (tmp_path / ".build-slot-0.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):            # a planted link is not followed
        with build_slot(tmp_path, slots=1):
            pass
    assert (tmp_path / "elsewhere").read_text() == "x"


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_the_family_passes_its_tests_in_its_own_environment(name):
    pip_args, test_file, *remove = EXTRAS[name]
    env = environment(name, pip_args, tuple(remove[0]) if remove else ())
    r = subprocess.run([str(env / "bin" / "python"), "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
                        "-n", "2", test_file], cwd=ROOT, capture_output=True, text=True, timeout=2400,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail.splitlines()[-1], tail   # it ran, not skipped
