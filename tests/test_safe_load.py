"""Model files load through the safe loader (models/mace_safe_load.py) unless the user opts in.

Real mace-torch models, real files, real attacks: a hostile pickle's payload is a harmless
``touch MARKER``, and every refusal is checked by the marker's absence afterwards.
"""
from __future__ import annotations

import os
import pickle
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk
from conftest import run_engine, run_in_process
from family_checks import Payload as _Payload

from shardmd.engine.ase_calculator import ShardMDCalculator
from shardmd.models.mace import DEFAULT_MODEL, load_mace

pytestmark = pytest.mark.fault

pytest.importorskip("mace")


def _touch(marker: Path) -> _Payload:
    return _Payload(os.system, (f"touch {shlex.quote(str(marker))}",))


@pytest.fixture
def evil(tmp_path):
    """A torch.save'd object whose unpickling runs ``touch MARKER`` (os.system)."""
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.model"
    torch.save(_touch(marker), path)
    return path, marker


def _one_line_refusal(msg: str, what: str):
    assert "\n" not in msg, msg
    assert "trust_pickle" in msg and what in msg, msg


def _cu32():
    return bulk("Cu", "fcc", a=3.59, cubic=True).repeat(2)


# -- the shipped model and other mace-torch models ---------------------------------------------

def test_shipped_model_safe_equals_unpickled_to_the_bit():
    safe = load_mace(DEFAULT_MODEL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = torch.load(DEFAULT_MODEL, map_location="cpu", weights_only=False).double().eval()
    # the fx graphs rebuilt without exec have exactly the code the file holds
    code = lambda m: {n: s.code for n, s in m.named_modules() if isinstance(s, torch.fx.GraphModule)}  # noqa: E731
    assert code(safe) == code(free) and len(code(safe)) == 6
    sd_safe, sd_free = safe.state_dict(), free.state_dict()
    assert sd_safe.keys() == sd_free.keys() and all(torch.equal(sd_safe[k], sd_free[k]) for k in sd_safe)
    a, b = _cu32(), _cu32()
    a.rattle(0.05, seed=4)
    b.positions[:] = a.positions
    a.calc = ShardMDCalculator(model="mace")                    # safe path (the default)
    b.calc = ShardMDCalculator(model="mace", trust_pickle=True)  # weights_only=False
    assert a.get_potential_energy() == b.get_potential_energy()
    assert np.array_equal(a.get_forces(), b.get_forces()) and np.abs(a.get_forces()).max() > 1e-3


def test_other_mace_settings_load_safely(tmp_path):
    """MACE (not ScaleShift), non-residual first layer, tanh gate (pickled through getattr),
    gaussian radial basis, Agnesi transform, ZBL repulsion, max_ell 3, correlation 3."""
    import mace  # noqa: F401
    from e3nn import o3
    from mace.modules import interaction_classes
    from mace.modules.models import MACE

    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = MACE(r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=3,
                     interaction_cls=interaction_classes["RealAgnosticResidualInteractionBlock"],
                     interaction_cls_first=interaction_classes["RealAgnosticInteractionBlock"],
                     num_interactions=2, num_elements=1, hidden_irreps=o3.Irreps("4x0e+4x1o"),
                     MLP_irreps=o3.Irreps("4x0e"), atomic_energies=np.array([-3.0]), avg_num_neighbors=12.0,
                     atomic_numbers=[29], correlation=3, gate=torch.tanh, radial_type="gaussian",
                     distance_transform="Agnesi", pair_repulsion=True)
    finally:
        torch.set_default_dtype(old)
    path = tmp_path / "other.model"
    torch.save(model, path)
    assert type(load_mace(path)).__name__ == "MACE"
    a, b = _cu32(), _cu32()
    a.rattle(0.05, seed=5)
    b.positions[:] = a.positions
    a.calc = ShardMDCalculator(model="mace", checkpoint=str(path))
    b.calc = ShardMDCalculator(model="mace", checkpoint=str(path), trust_pickle=True)
    assert a.get_potential_energy() == b.get_potential_energy()
    assert np.array_equal(a.get_forces(), b.get_forces())


# -- hostile files ------------------------------------------------------------------------------

def test_hostile_pickle_refused_by_load_mace(evil):
    path, marker = evil
    with pytest.raises(ValueError) as e:
        load_mace(path)
    _one_line_refusal(str(e.value), "posix.system")
    assert not marker.exists()


def test_hostile_pickle_refused_after_import_mace(evil):
    """``import mace`` sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for the process: it only
    affects torch.load calls that leave weights_only out, which ours never do."""
    import mace  # noqa: F401

    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") == "1"
    path, marker = evil
    with pytest.raises(ValueError) as e:
        load_mace(path)
    _one_line_refusal(str(e.value), "posix.system")
    assert not marker.exists()
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") == "1"   # mace's setting is restored


def test_hostile_pickle_refused_by_cli(evil, tmp_path):
    path, marker = evil
    r = run_engine(["run", "model=mace", f"model.checkpoint={path}", "steps=1", "output=out.h5"], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "Traceback" not in r.stderr
    _one_line_refusal(lines[0], "posix.system")
    assert "model.trust_pickle=true" in lines[0]
    assert not marker.exists()


def test_hostile_pickle_refused_by_ase_calculator(evil):
    path, marker = evil
    with pytest.raises(ValueError) as e:
        ShardMDCalculator(model="mace", checkpoint=str(path))
    _one_line_refusal(str(e.value), "posix.system")
    assert not marker.exists()


def test_trust_pickle_really_unpickles(evil):
    """The opt-in is real: the payload runs (then the object is refused as not a MACE model)."""
    path, marker = evil
    with pytest.raises(ValueError, match="holds a int, not a MACE model"):
        load_mace(path, trust_pickle=True)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ValueError, match="not a MACE model"):
        ShardMDCalculator(model="mace", checkpoint=str(path), trust_pickle=True)
    assert marker.exists()


class _Transpose(torch.nn.Module):
    def forward(self, x):
        return torch.einsum("ab->ba", x)


def test_fx_graph_module_code_is_never_executed(tmp_path):
    """torch.fx's own reducer execs the code stored with a GraphModule (its import block at
    load, its forward when retraced); the safe loader's substitute parses it and refuses."""
    marker = tmp_path / "FX_MARKER"
    cmd = f"touch {shlex.quote(str(marker))}"
    # a genuine GraphModule's pickled state (as in mace's symmetric contraction), then altered
    reducer, (body, imports) = torch.fx.symbolic_trace(_Transpose()).__reduce__()
    assert reducer is torch.fx.graph_module.reduce_graph_module
    attacks = {"import block": (imports + f"\nimport os\nos.system({cmd!r})\n", body["_code"]),
               "forward": (imports, f"\n\ndef forward(self, x):\n    return __import__('os').system({cmd!r})\n")}
    for what, (block, code) in attacks.items():
        path = tmp_path / "fx.model"
        torch.save(_Payload(reducer, ({**body, "_code": code}, block)), path)
        if what == "forward":     # the import block is ignored: only the code can be refused
            with pytest.raises(ValueError) as e:
                load_mace(path)
            _one_line_refusal(str(e.value), "torch.fx code outside the einsum subset")
        else:                     # the code itself is fine: the rebuilt graph loads, no exec
            with pytest.raises(ValueError, match="holds a GraphModule(Impl)?, not a MACE model"):
                load_mace(path)
        assert not marker.exists(), what
        with pytest.raises(ValueError):   # the vector is real: unpickled freely, it runs
            load_mace(path, trust_pickle=True)
        assert marker.exists(), what
        marker.unlink()


def test_graph_from_code_subset():
    from shardmd.models.mace_safe_load import RefusedContent, _graph_from_code

    ok = ("def forward(self, x, y):\n    einsum = torch.functional.einsum('ab,bc->ac', x, y);  x = None\n"
          "    tensordot = torch.functional.tensordot(einsum, y, dims = ((1,), (0,)), out = None)\n"
          "    mul = 0.5 * tensordot\n    permute = mul.permute(1, 0)\n    return permute\n")
    g = torch.fx.GraphModule(torch.nn.Module(), _graph_from_code(ok))
    x, y = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    assert torch.allclose(g(x, y), (0.5 * torch.tensordot(x @ y, y, dims=((1,), (0,)))).T)
    for bad in ("def forward(self, x):\n    return getattr(x, 'cpu')()\n",
                "def forward(self, x):\n    y = self.w\n    return y\n",
                "def forward(self, x):\n    y = torch.load(x)\n    return y\n",
                "def forward(self, x):\n    y = x.numpy()\n    return y\n",
                "import os\ndef forward(self, x):\n    return x\n",
                "def forward(self, x, f=print):\n    return x\n",
                "def forward(self, x):\n    y = torch.functional.tensordot(x, x, dims=os.system('id'))\n    return y\n",
                "def forward(self, x):\n    y = x * x\n    return y\n",
                "def forward(self, torch):\n    return torch\n",
                "def forward(self, x):\n    __builtins__ = 2.0 * x\n    return __builtins__\n"):
        with pytest.raises(RefusedContent):
            _graph_from_code(bad)


def test_getattr_only_resolves_mace_gates(tmp_path):
    """``builtins.getattr`` is bound to a lookup of torch.tanh / torch.abs only."""
    marker = tmp_path / "M"
    path = tmp_path / "g.model"
    torch.save(_Payload(getattr, (torch._C._VariableFunctionsClass, "from_file")), path)
    with pytest.raises(ValueError) as e:
        load_mace(path)
    _one_line_refusal(str(e.value), "builtins.getattr(_VariableFunctionsClass, 'from_file')")
    assert not marker.exists()


# -- files that are not models --------------------------------------------------------------------

def test_not_a_model_one_line(tmp_path, capfd, monkeypatch):
    cases = {"dict.model": lambda p: torch.save({"weights": torch.zeros(3)}, p),
             "truncated.model": lambda p: p.write_bytes(DEFAULT_MODEL.read_bytes()[: 200_000]),
             "empty.model": lambda p: p.write_bytes(b""),
             "plain_pickle.model": lambda p: p.write_bytes(pickle.dumps([1, 2, 3]))}
    expect = {"dict.model": "holds a dict, not a MACE model", "truncated.model": "not a loadable mace-torch model",
              "empty.model": "not a loadable mace-torch model", "plain_pickle.model": "not a loadable mace-torch model"}
    for name, make in cases.items():
        make(tmp_path / name)
        with pytest.raises(ValueError) as e:
            load_mace(tmp_path / name)
        assert expect[name] in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    # the CLI's refusal, in this process (run_in_process: stderr at the fd, warnings as lines); a
    # fresh engine process meets a hostile file in test_hostile_pickle_refused_by_cli
    code, lines = run_in_process(["run", "model=mace", "model.checkpoint=empty.model", "steps=1"], tmp_path, capfd,
                                 monkeypatch)
    assert code == 2 and len(lines) == 1 and "not a loadable mace-torch model" in lines[0], lines


def test_safe_globals_are_scoped():
    """The allow-list is torch's only while a file loads; a user's own entries survive it."""
    from shardmd.models.mace_safe_load import SAFE_GLOBALS

    before = set(torch.serialization.get_safe_globals())
    mine = torch.nn.ModuleList    # also on our list: leaving our block must not remove it
    torch.serialization.add_safe_globals([mine])
    try:
        load_mace(DEFAULT_MODEL)
        assert mine in torch.serialization.get_safe_globals()
        assert not (set(SAFE_GLOBALS) - {mine}) & set(torch.serialization.get_safe_globals())
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(list(before))
    assert len(SAFE_GLOBALS) == len(set(SAFE_GLOBALS))


def test_fresh_process_import_mace_first(evil, tmp_path):
    """The env-var case in a process of its own: mace imported before anything else."""
    path, marker = evil
    code = ("import mace, os\nassert os.environ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'] == '1'\n"
            "from shardmd.models.mace import load_mace\n"
            f"try:\n    load_mace({str(path)!r})\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "posix.system" in r.stdout, r.stdout + r.stderr
    assert not marker.exists()
