"""Specs: presets, JSON round trips (every field), load errors, output kinds, legacy kinds."""
import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from shardmd.domain.api import (
    PRESETS,
    SPEC_MPNN_HALO,
    SPEC_MPNN_SHARDED,
    SPEC_PAIR_HALO,
    AllReduceSum,
    DistributedModel,
    DistributionSpec,
    GatherInputs,
    GatherInputsFull,
    HaloStorage,
    MethodAdapter,
    MLIPSpec,
    OpAdapter,
    OutputKind,
    PythonAdapter,
    ReverseOutputs,
    ScatterOutputs,
    ShardedStorage,
    SliceOutputsOwned,
    SliceOwned,
    SpecLoadError,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))


def fields_equal(a, b, path="spec"):
    """Field-by-field comparison (recursing into dataclasses), naming the first difference."""
    assert type(a) is type(b), path
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            fields_equal(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, tuple):
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b)):
            fields_equal(x, y, f"{path}[{k}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@torch.library.custom_op("shardmd_spec_test::kernel", mutates_args=())
def kernel(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(), y.sum()


def custom_helper(x):
    return x


def custom_method(self):
    return None


class Target:
    def m(self):
        return 1


def custom_spec():
    """A spec with every field away from its default."""
    op = OpAdapter(kernel, arg_transforms={0: GatherInputs(), "y": SliceOwned(), 1: GatherInputsFull()},
                   output_transforms={0: ScatterOutputs(), 1: AllReduceSum()})
    op2 = OpAdapter(torch.ops.shardmd_spec_test.kernel.default, output_transforms={0: ReverseOutputs(),
                                                                                    1: SliceOutputsOwned()},
                    module="test_shard_spec")
    return MLIPSpec(
        name="custom", description="every field set",
        distribution=DistributionSpec(storage=HaloStorage("gather"), system_reductions=False, custom_ops=(op, op2),
                                      third_party_helpers=(PythonAdapter(__name__, "custom_helper", custom_helper),
                                                           MethodAdapter(f"{__name__}:Target", "m", custom_method,
                                                                         factory=True))),
        output_kinds={"energy": OutputKind.PER_GRAPH, "forces": OutputKind.PER_NODE, "charges": OutputKind.UNKNOWN,
                      "stress": OutputKind.GLOBAL},
        owned_only_outputs={"forces"}, reverse_outputs={"charges"}, all_reduce_outputs={"energy", "stress"})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_field_by_field(name, tmp_path):
    spec = PRESETS[name]
    back = MLIPSpec.load(spec.save(tmp_path / "s.json"))
    fields_equal(spec, back)
    assert back == spec
    assert json.loads((tmp_path / "s.json").read_text())["version"] == 1


def test_custom_spec_round_trips_every_field(tmp_path):
    spec = custom_spec()
    back = MLIPSpec.load(spec.save(tmp_path / "c.json"))
    fields_equal(spec, back)
    d = json.loads((tmp_path / "c.json").read_text())
    ops = d["distribution"]["custom_ops"]
    assert ops[0]["op"] == "shardmd_spec_test::kernel" and ops[0]["module"] == "test_shard_spec"
    assert ops[0]["arg_transforms"] == [[0, {"type": "GatherInputs"}], [1, {"type": "GatherInputsFull"}],
                                        ["y", {"type": "SliceOwned"}]]
    assert d["distribution"]["storage"] == {"kind": "halo", "mode": "gather"}
    assert d["distribution"]["system_reductions"] is False
    assert d["distribution"]["third_party_helpers"][1]["factory"] is True
    # the serialised form has exactly the fields the dataclasses have (nothing dropped)
    assert set(d) - {"format", "version"} == {f.name for f in dataclasses.fields(MLIPSpec)}
    assert set(d["distribution"]) == {f.name for f in dataclasses.fields(DistributionSpec)}


def test_lj_spec_round_trips_and_loads_its_op_module_in_a_fresh_process(tmp_path):
    from shardmd.models.lj_op import SPEC_LJ

    p = SPEC_LJ.save(tmp_path / "lj.json")
    fields_equal(SPEC_LJ, MLIPSpec.load(p))
    code = ("import sys; from shardmd.domain.spec import MLIPSpec; assert 'shardmd.models.lj_op' not in sys.modules; "
            f"s = MLIPSpec.load({str(p)!r}); assert 'shardmd.models.lj_op' in sys.modules; "
            "print(s.distribution.custom_ops[0].qualname)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "shardmd_lj::lennard_jones"


def _with_op(tmp_path, op, module):
    d = SPEC_MPNN_HALO.to_dict()
    d["distribution"]["custom_ops"] = [{"op": op, "overload": "default", "module": module,
                                        "arg_transforms": [], "output_transforms": [[0, {"type": "ScatterOutputs"}]]}]
    p = tmp_path / "x.json"
    p.write_text(json.dumps(d))
    return p


def test_missing_op_module_is_a_one_line_error_naming_op_and_module(tmp_path):
    p = _with_op(tmp_path, "nowhere_ns::fused", "my_models.kernels_gone")
    with pytest.raises(SpecLoadError) as e:
        MLIPSpec.load(p)
    msg = str(e.value)
    assert "\n" not in msg and "nowhere_ns::fused" in msg and "my_models.kernels_gone" in msg
    p = _with_op(tmp_path, "nowhere_ns::fused", "json")           # imports, but registers nothing
    with pytest.raises(SpecLoadError, match="module 'json' was imported but does not register it"):
        MLIPSpec.load(p)
    p = _with_op(tmp_path, "nowhere_ns::fused", None)
    with pytest.raises(SpecLoadError, match="names no module"):
        MLIPSpec.load(p)


def test_load_refuses_other_versions_and_unknown_fields(tmp_path):
    d = SPEC_MPNN_HALO.to_dict()
    with pytest.raises(SpecLoadError, match="version 2"):
        MLIPSpec.from_dict(dict(d, version=2))
    with pytest.raises(SpecLoadError, match="compile_policy"):
        MLIPSpec.from_dict(dict(d, compile_policy={}))


def test_hostile_nesting_is_refused_before_parsing():
    """20,000 nested brackets (with brackets inside strings that must not count) give one
    SpecLoadError, not a RecursionError from the decoder."""
    from shardmd.domain.json_text import nesting_depth

    assert nesting_depth('{"a": "[[[[\\"{{", "b": [[1]]}') == 3
    with pytest.raises(SpecLoadError, match="nested deeper than 64 levels"):
        MLIPSpec.from_json("[" * 20000 + "]" * 20000)
    assert MLIPSpec.from_json(SPEC_MPNN_HALO.to_json()) == SPEC_MPNN_HALO


def test_specs_are_frozen_and_validated():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC_MPNN_HALO.name = "x"
    with pytest.raises(ValueError, match="mode"):
        HaloStorage("both")
    with pytest.raises(ValueError, match="both owned-only and reverse"):
        MLIPSpec(owned_only_outputs={"f"}, reverse_outputs={"f"})
    assert SPEC_MPNN_SHARDED.distribution.storage == ShardedStorage()
    assert SPEC_PAIR_HALO.all_reduce_outputs == {"energy", "virial"}


def test_legacy_kinds_map_to_a_spec():
    s = MLIPSpec.from_legacy_kinds({"energy": "per_system", "forces": "per_point", "q": "per_point_reverse",
                                    "t": "global"})
    assert s.kind_of("energy") == OutputKind.PER_GRAPH and s.all_reduce_outputs == {"energy"}
    assert s.owned_only_outputs == {"forces"} and s.reverse_outputs == {"q"} and s.kind_of("t") == OutputKind.GLOBAL
    assert s.kind_of("other") == OutputKind.UNKNOWN


def test_unknown_output_kind_warns_once_and_uses_the_shape():
    import shard_models

    from shardmd.domain.comm import Comm
    from shardmd.domain.validate_worker import rank_domain

    atoms = shard_models.small_sample()
    d = rank_domain(Comm(), {"positions": atoms.positions, "cell": atoms.cell.array, "pbc": atoms.pbc,
                             "numbers": atoms.numbers}, 5.0, 5.0)
    dm = DistributedModel(shard_models.mpnn_unknown_kind())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = dm.compute(d["ctx"], d["padded"], d["numbers"], d["nl"])
        dm.compute(d["ctx"], d["padded"], d["numbers"], d["nl"])
    msgs = [str(x.message) for x in w if "no declared kind" in str(x.message)]
    assert len(msgs) == 1 and "'energies'" in msgs[0] and "PER_NODE" in msgs[0]
    assert out["energies"].shape == (len(atoms),)


def test_distributed_model_keeps_the_engine_contract():
    """The original constructor and errors are unchanged; a spec replaces output_kinds."""
    class NoKinds:
        cutoff = 1.0

    with pytest.raises(TypeError, match="declares no output_kinds"):
        DistributedModel(NoKinds())

    class BadKinds(NoKinds):
        output_kinds = {"energy": "sideways"}

    with pytest.raises(ValueError, match="unknown output kinds"):
        DistributedModel(BadKinds())
    dm = DistributedModel(NoKinds(), spec=SPEC_MPNN_HALO)
    assert dm.spec is SPEC_MPNN_HALO and dm.kinds["energy"] == "per_graph"
