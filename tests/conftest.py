import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# xdist workers share this machine's cores, and the full suite is CPU-bound: every engine a
# test starts takes one torch thread (threads=0 follows OMP_NUM_THREADS), and an OpenMP thread
# waiting for work sleeps instead of spinning. Two threads per process oversubscribed the
# cores: a 1-domain LJ run used 15-25 % more CPU for the same steps.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_sessionstart(session):
    """The package's and the test helpers' bytecode, compiled once before any test starts a
    process. An editable install leaves the package uncompiled, and where the environment sets
    PYTHONDONTWRITEBYTECODE (this project's machines do) no process caches what it compiles:
    each of the suite's engine processes and MPI ranks would compile ~100 modules from source
    again (~0.6 s of CPU each on a 2-core machine; py_compile writes regardless of the
    setting, and imports read what it wrote)."""
    if hasattr(session.config, "workerinput"):   # xdist workers: the controller did it
        return
    import compileall

    for folder in ("domain", "engine", "integrators", "models", "configs", "shardmd", "tests", "examples"):
        compileall.compile_dir(ROOT / folder, quiet=2, workers=1)


def run_engine(args, cwd, timeout=300, env=None):
    """Run ``python -m engine <args>`` in a real subprocess; return CompletedProcess."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=e)


@pytest.fixture
def engine_cli():
    return run_engine


def run_in_process(args, cwd, capfd, monkeypatch) -> tuple[int, list[str]]:
    """``python -m engine <args>`` through ``cli.main`` in this process: (exit status, stderr
    lines). The code a subprocess would run, without its start-up (torch, Warp: ~4 s of CPU
    each). ``capfd`` takes stderr at the file descriptor, so native libraries' writes count
    too; no traceback may appear. Python warnings, which a fresh interpreter would print to
    stderr under its default filters, come back as lines too (pytest would otherwise keep them).
    For one-rank runs and refusals decided before any rank starts; what needs a fresh process
    (bit-exact restarts, signals, MPI, import-time behaviour) uses run_engine."""
    r = cli_in_process(args, cwd, capfd, monkeypatch)
    return r.returncode, r.stderr.strip().splitlines()


def cli_in_process(args, cwd, capfd, monkeypatch) -> subprocess.CompletedProcess:
    """:func:`run_in_process` with run_engine's answer: a CompletedProcess whose stderr ends
    with the warnings a fresh interpreter would have printed, one line each."""
    from shardmd.engine.cli.main import main

    monkeypatch.chdir(cwd)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()             # the interpreter's default filters, not pytest's
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.simplefilter("default", append=True)
        code = main(list(args))
    out = capfd.readouterr()
    assert "Traceback" not in out.err, out.err
    lines = [ln for ln in out.err.strip().splitlines() if not ln.startswith("Warp CUDA warning")]
    lines += [f"{w.category.__name__}: {w.message}" for w in caught]
    return subprocess.CompletedProcess(list(args), code, out.out, "".join(ln + "\n" for ln in lines))


#: test files whose every test is a work unit of its own and scheduled first: each makes a model
#: family's environment (minutes of pip each), the suite's longest units, so they start at once
#: on the workers instead of one after another on one, late (longest first; :func:`_first`)
LONG_UNITS = ("test_extras.py",)

#: the longest of the other units (wall minutes on a loaded 2-core machine: compiled MACE ~12,
#: the SLURM tier ~8, mostly waiting; SHARDMD_CPU_LOG gives each test's): started after the
#: shared MPI worlds, so that none of them is taken last and runs alone at the end (Coulomb:
#: its tests outside the worlds)
HEAVY_UNITS = ("test_mace_compile.py", "test_slurm.py", "test_subdomains.py", "test_batch_queue.py",
               "test_readme.py", "test_coulomb.py")


def _scope(nodeid: str) -> str:
    """The work unit of a test (:class:`_ModuleScheduling`): its own for LONG_UNITS, the shared
    MPI worlds for the tests that read them, else its file."""
    path, _, rest = nodeid.partition("::")
    name = Path(path).name
    if name in LONG_UNITS:
        return nodeid
    return "mpi-worlds" if rest.split("::")[-1].split("[", 1)[0] in _WORLDS.get(name, ()) else path


def _scheduled(items) -> list:
    """The order the workers take the units in (xdist's own reordering is off, see below):
    LONG_UNITS' tests, then the shared MPI worlds (the longest chain), then HEAVY_UNITS in their
    order, then the other units largest first (xdist's own rule: the big ones started early),
    each unit's tests in order."""
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_scope(item.nodeid), []).append(item)

    def rank(scope_unit):
        scope, unit = scope_unit
        name = Path(scope.partition("::")[0]).name
        if name in LONG_UNITS:
            return 0, 0, -len(unit)
        if scope == "mpi-worlds":
            return 1, 0, -len(unit)
        return (2, HEAVY_UNITS.index(name), 0) if name in HEAVY_UNITS else (3, 0, -len(unit))

    return [item for _, unit in sorted(units.items(), key=rank) for item in unit]


def pytest_collection_modifyitems(config, items):
    import torch

    items[:] = _scheduled(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: run on the device machine (see README, GPU tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


WORLD_FIXTURES = frozenset({"mpi_world", "validated"})


def _world_tests() -> dict[str, set[str]]:
    """{test file name: its test functions taking a shared-world fixture (``mpi_world``,
    ``validated``) as an argument}, read from the files' syntax trees."""
    import ast

    out = {}
    for p in (ROOT / "tests").glob("test_*.py"):
        text = p.read_text()
        if not any(f"{name}(" in text for name in WORLD_FIXTURES):
            continue
        out[p.name] = {f.name for f in ast.walk(ast.parse(text)) if isinstance(f, ast.FunctionDef)
                       and f.name.startswith("test") and WORLD_FIXTURES & {a.arg for a in f.args.args}}
    return out


_WORLDS = _world_tests()

try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:   # without pytest-xdist, tests run in one process (`-p no:xdist`, no addopts)
    pass
else:
    class _ModuleScheduling(LoadScopeScheduling):
        """Work units for the workers (pyproject addopts ``-n 4``): a test module runs on
        one worker (its module fixtures are made once; LONG_UNITS' tests each on their own),
        but the tests that read the shared MPI worlds or validate batches run on one worker
        together: a worker launches each k-rank world with the tasks of all selected tests, so
        two workers asking for it would run every task twice. Only those tests: the rest of
        their modules stays a unit of its own, so the worlds' chain (the suite's longest)
        carries nothing else.  (xdist's ``--dist loadgroup`` marks do not take effect under
        pytest 9, hence a scheduler keyed by file and function.)"""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            if hasattr(config.option, "loadscopereorder"):   # the collection's order is the schedule
                config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        return _ModuleScheduling(config, log)


def mpiexec_cmd(n, args):
    """Command list running ``args`` (a python argv tail) on n real MPI ranks."""
    from shardmd.engine.launch.parallel import launch_command

    cmd = launch_command(n, [])
    # launch_command ends with [python, -m, engine]: replace the tail by our own arguments
    return cmd[: cmd.index(sys.executable)] + [sys.executable, *args]


class WorldTask:
    """Work for a K-rank world: ``tests/mpi/<script>.py``'s ``run(comm, argv)``. ``argv`` items
    may be callables of pytest's tmp_path_factory (inputs made just before the launch);
    ``"{out}"`` stands for the task's own output folder."""

    def __init__(self, k: int, key: str, script: str, argv, timeout: float = 600):
        self.k, self.key, self.script, self.argv, self.timeout = k, key, script, list(argv), timeout


class MPIWorlds:
    """One MPI launch per world size for the tasks of every test pytest selected.

    A test module declares ``world_tasks(item) -> [WorldTask, ...]``; the first test that asks
    for a K-rank world starts it with the K-rank tasks of all selected tests (any module), so
    each rank imports torch, Warp and the engine once, not once per test (~4 s of CPU a rank).
    A deselected test's task is not run. Each task's output folder is returned when the task
    finished (its ``.done`` marker), even if a later task in the same world failed."""

    def __init__(self, session, factory):
        self.session, self.factory = session, factory
        self.launched: dict[int, subprocess.CompletedProcess] = {}
        self.out: dict[str, Path] = {}

    def _tasks(self, k: int) -> list[WorldTask]:
        """The k-rank tasks of the selected tests, fast-tier ones first (a slow task that fails
        cannot keep a fast one from finishing)."""
        tasks: dict[str, tuple[bool, WorldTask]] = {}
        for item in self.session.items:
            hook = getattr(getattr(item, "module", None), "world_tasks", None)
            if hook is None or item.get_closest_marker("skip") is not None:
                continue
            for t in hook(item):
                if t.k == k:
                    tasks.setdefault(t.key, ("slow" in item.keywords, t))
        return [t for _, t in sorted(tasks.values(), key=lambda st: st[0])]

    def _launch(self, k: int) -> None:
        root = self.factory.mktemp(f"world{k}")
        spec, tasks = [], self._tasks(k)
        for t in tasks:
            out = root / t.key
            out.mkdir()
            argv = [str(a(self.factory)) if callable(a) else str(a).replace("{out}", str(out)) for a in t.argv]
            spec.append([t.script, argv, str(out / ".done")])
            self.out[t.key] = out
        (root / "tasks.json").write_text(json.dumps(spec, indent=1))
        timeout = sum(t.timeout for t in tasks)
        self.launched[k] = subprocess.run(mpiexec_cmd(k, [str(ROOT / "tests" / "mpi" / "world.py"),
                                                          str(root / "tasks.json")]),
                                          capture_output=True, text=True, timeout=timeout)

    def __call__(self, k: int, key: str, clean: bool = False) -> Path:
        """Output folder of task ``key``; ``clean``: the whole world must also have exited 0
        (its shutdown check ran after the last task)."""
        if k not in self.launched:
            self._launch(k)
        r = self.launched[k]
        assert key in self.out, f"no task {key!r} in the {k}-rank world (a world_tasks hook must declare it)"
        tail = f"{k}-rank world exited {r.returncode}:\n{r.stderr[-3000:]}"
        assert (self.out[key] / ".done").exists(), f"task {key!r} did not finish; " + tail
        if clean:
            assert r.returncode == 0, tail
        return self.out[key]


@pytest.fixture(scope="session")
def mpi_world(request, tmp_path_factory):
    """``mpi_world(k, key)``: the output folder of task ``key`` run in the shared k-rank world."""
    return MPIWorlds(request.session, tmp_path_factory)


class ValidateBatches:
    """One ``validate_many`` launch per world size for the trace_and_validate jobs of every test
    pytest selected: a module declares ``validate_jobs(item) -> [(k, key, [job, ...]), ...]``
    (jobs as validate_many takes them) and the test reads ``validated(k, key)``, its reports
    in job order. validate_many already runs many jobs in one launch; this shares it across
    tests and modules (each rank's start-up, ~4 s of CPU, once per world size)."""

    def __init__(self, session):
        self.session = session
        self.reports: dict[int, dict[str, list]] = {}

    def _batch(self, k: int) -> list[tuple[str, list]]:
        batch: dict[str, tuple[bool, list]] = {}
        for item in self.session.items:
            hook = getattr(getattr(item, "module", None), "validate_jobs", None)
            if hook is None or item.get_closest_marker("skip") is not None:
                continue
            for kk, key, jobs in hook(item):
                if kk == k:
                    batch.setdefault(key, ("slow" in item.keywords, jobs))
        return [(key, jobs) for key, (_, jobs) in sorted(batch.items(), key=lambda kv: kv[1][0])]

    def __call__(self, k: int, key: str) -> list:
        if k not in self.reports:
            from shardmd.domain.validate import validate_many

            batch = self._batch(k)
            try:
                reps = validate_many([job for _, jobs in batch for job in jobs], k)
            except RuntimeError as exc:     # the workers failed: every test of this batch says so
                self.reports[k] = exc
            else:
                self.reports[k], i = {}, 0
                for name, jobs in batch:
                    self.reports[k][name] = reps[i:i + len(jobs)]
                    i += len(jobs)
        if isinstance(self.reports[k], Exception):
            raise self.reports[k]
        assert key in self.reports[k], f"no jobs {key!r} for {k} ranks (a validate_jobs hook must declare them)"
        return self.reports[k][key]


@pytest.fixture(scope="session")
def validated(request):
    """``validated(k, key)``: the TraceReports of jobs ``key``, validated in the shared k-rank launch."""
    return ValidateBatches(request.session)


# -- CPU per test: SHARDMD_CPU_LOG=FILE appends "<cpu s> <wall s> <test id>" per test --------
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The CPU a test used, set-up and teardown included: this process's and that of every
    child it waited for (mpiexec reaps its ranks, so a launch's ranks count). The full suite is
    CPU-bound on two cores: CPU, not wall time, says what a cut saves."""
    log = os.environ.get("SHARDMD_CPU_LOG")
    if not log:
        yield
        return
    import resource
    import time

    def cpu():
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                      resource.getrusage(resource.RUSAGE_CHILDREN)))
    c0, t0 = cpu(), time.perf_counter()
    yield
    with open(log, "a") as f:
        f.write(f"{cpu() - c0:.2f} {time.perf_counter() - t0:.2f} {item.nodeid}\n")


# -- SLURM tier: one status line at the end of every run that ran it (tests/test_slurm.py) -------
def pytest_terminal_summary(terminalreporter):
    """``SLURM tier: N passed, M skipped ... in S s``, how the cluster came up, and each distinct
    skip reason: ``-q`` prints no skip reasons, and a tier that skipped must say why in CI's
    log. S is the sum of the tier's test durations (set-up included): its wall time on the one
    worker that runs the module."""
    counts: dict[str, int] = {}
    notes: list[str] = []
    seconds = 0.0
    for category, reports in terminalreporter.stats.items():
        for rep in reports:
            if "slurm" not in getattr(rep, "keywords", {}) or not hasattr(rep, "when"):
                continue
            seconds += getattr(rep, "duration", 0.0)
            found = [v for k, v in getattr(rep, "user_properties", ()) if k == "slurm"]
            if category == "skipped" and isinstance(rep.longrepr, tuple):
                found.append("skipped: " + str(rep.longrepr[2]).removeprefix("Skipped: "))
            notes += [n for n in found if n not in notes]
            if category in ("passed", "failed", "skipped", "error") and (rep.when == "call" or category != "passed"):
                counts[category] = counts.get(category, 0) + 1
    if counts:
        summary = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
        terminalreporter.write_line(f"SLURM tier: {summary} in {seconds:.0f} s")
        for note in notes:
            terminalreporter.write_line(f"SLURM tier: {note}")
