"""ShardTensor, the dispatch registry, handlers, transforms and adapters on one process."""
import sys
from pathlib import Path

import pytest
import torch

from shardmd.domain.api import (
    SPEC_MPNN_HALO,
    AdapterScope,
    GatherInputs,
    HaloMeta,
    MethodAdapter,
    OpAdapter,
    PythonAdapter,
    ShardTensor,
    TransformError,
    dispatch_trace,
    register_handler,
    registered_handlers,
    shard_like,
    unregister_handler,
)
from shardmd.domain.comm import Comm
from shardmd.domain.halo import HaloPlan

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "mpi"))


def halo_meta(n=5, n_padded=None):
    plan = HaloPlan(n_owned=n, ghost_shift=torch.zeros(0, 3, dtype=torch.int32))
    return HaloMeta(n, n if n_padded is None else n_padded, plan)


def shard(t, **kw):
    return ShardTensor.wrap(t, halo=kw.pop("halo", halo_meta(t.shape[0])), group=Comm(), **kw)


def test_wrap_is_zero_copy_and_keeps_metadata_through_inplace_ops():
    x = torch.arange(15, dtype=torch.float64).reshape(5, 3)
    s = shard(x, spec=SPEC_MPNN_HALO, n_systems=2)
    assert type(s) is ShardTensor and s.data_ptr() == x.data_ptr()
    x[0, 0] = 42.0
    assert float(s[0, 0]) == 42.0                       # shared storage
    r = s.mul_(2).add_(1)
    assert r is s and type(r) is ShardTensor and s.spec is SPEC_MPNN_HALO and s.n_systems == 2
    s[1] = 0.0                                          # __setitem__ in place
    assert type(s) is ShardTensor and float(x[1].abs().sum()) == 0.0


def test_wrap_keeps_autograd():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    s = shard(x)
    y = (s * s).sum()
    (g,) = torch.autograd.grad(y, x)
    assert torch.allclose(g, 2 * x)


def test_allocators_propagate_and_other_ops_return_plain():
    s = shard(torch.randn(5, 3, dtype=torch.float64), n_systems=3)
    like = [torch.zeros_like(s), torch.ones_like(s), torch.empty_like(s), torch.full_like(s, 2.0),
            torch.rand_like(s), torch.randn_like(s), s.new_zeros(5, 7), s.new_ones(2), s.new_empty(4),
            s.new_full((5,), 1.0), s.new_tensor([1.0, 2.0])]
    for t in like:
        assert type(t) is ShardTensor and t.halo is s.halo and t.group is s.group and t.n_systems == 3
    plain_results = [s[0], s[:2], s + 1, s * s, torch.nn.functional.linear(s, torch.eye(3, dtype=torch.float64)),
                     s.detach(), s.clone(), s.sum(0), s.view(15), s.index_select(0, torch.tensor([0, 1])),
                     torch.tanh(s), s.to(torch.float32)]
    for t in plain_results:
        assert type(t) is torch.Tensor
    assert type(shard_like(s.detach(), s)) is ShardTensor
    plain = torch.zeros(2)
    assert shard_like(plain, torch.zeros(2)) is plain       # no-op outside decomposition


def test_registry_order_first_match_several_handlers_and_unregister():
    calls = []
    op = torch.Tensor.cumsum

    def make(tag, accept):
        def pred(func, args, kwargs):
            return accept(args)

        def handler(func, types_, args, kwargs):
            calls.append(tag)
            return tag
        return pred, handler

    register_handler(op, *make("a", lambda a: a[1] == 0), name="test_a")
    register_handler([op, torch.cumsum], *make("b", lambda a: True), name="test_b")
    register_handler(op, *make("c", lambda a: True), name="test_c", position=0)
    try:
        assert registered_handlers(op)[:1] == ["test_c"] and set(registered_handlers(op)) >= {"test_a", "test_b"}
        s = shard(torch.ones(5, 3))
        with dispatch_trace() as tr:
            assert s.cumsum(0) == "c"                       # inserted first: wins
        assert tr == [{"handler": "test_c", "op": tr[0]["op"]}]
        unregister_handler("test_c")
        assert s.cumsum(0) == "a" and s.cumsum(1) == "b"     # first match by predicate
        assert torch.cumsum(s, 0) == "b"
        with pytest.raises(ValueError, match="already registered"):
            register_handler(op, *make("x", lambda a: True), name="test_a")
    finally:
        for n in ("test_a", "test_b", "test_c"):
            unregister_handler(n)
    assert not unregister_handler("test_a")
    assert type(shard(torch.ones(5, 3)).cumsum(0)) is torch.Tensor  # default behaviour again
    assert calls == ["c", "a", "b", "b"]


def test_builtin_handlers_registered_in_order():
    names = registered_handlers()
    order = [names.index(n) for n in ("system_reduce", "halo_correction", "sharded_gather", "sharded_scatter")]
    assert order == sorted(order)


def test_handlers_and_transforms_on_one_rank():
    """The multi-rank check battery, in-process on a single domain."""
    import shard_cases

    res = shard_cases.run_checks(Comm())
    bad = {k: v for k, v in res.items() if not v["ok"]}
    assert len(res) > 100 and not bad
    assert res["transform_missing_ScatterOutputs_err"]["err"] < 1e-12   # one domain: nothing is missing


def test_extra_gather_inputs_is_a_one_line_error():
    @torch.library.custom_op("shardmd_unit::ident", mutates_args=())
    def ident(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(ident, arg_transforms={0: GatherInputs()}))
    s = shard(torch.zeros(5, 3), halo=halo_meta(3, 5), spec=spec)
    with AdapterScope(spec):
        with pytest.raises(TransformError, match="already has the 5 halo-padded rows: drop the extra GatherInputs"):
            ident(s)
    assert not any(n.startswith("op_adapter") for n in registered_handlers())   # removed on error


def helper_original(x):
    return "original"


def helper_replacement(x):
    return "replaced"


def helper_factory(scope):
    return lambda x: ("built", scope)


class Owner:
    def method(self):
        return "original"


def method_replacement(self):
    return "replaced"


def test_python_and_method_adapters_install_and_restore_also_on_error():
    mod = sys.modules[__name__]
    modname = __name__
    pa = PythonAdapter(modname, "helper_original", helper_replacement)
    assert pa.replacement == f"{modname}:helper_replacement"         # stored by path (saveable)
    ma = MethodAdapter(f"{modname}:Owner", "method", method_replacement)
    fa = PythonAdapter(modname, "helper_original", helper_factory, factory=True)
    spec = SPEC_MPNN_HALO.with_helpers(pa, ma)
    with AdapterScope(spec):
        assert mod.helper_original(1) == "replaced" and Owner().method() == "replaced"
    assert mod.helper_original(1) == "original" and Owner().method() == "original"
    with pytest.raises(RuntimeError, match="boom"):
        with AdapterScope(spec):
            assert mod.helper_original(1) == "replaced"
            raise RuntimeError("boom")
    assert mod.helper_original(1) == "original" and Owner().method() == "original"
    with AdapterScope(SPEC_MPNN_HALO.with_helpers(fa), scope="S"):
        assert mod.helper_original(1) == ("built", "S")
    assert mod.helper_original(1) == "original"
    # a failing install undoes the ones before it
    bad = SPEC_MPNN_HALO.with_helpers(pa, PythonAdapter("no_such_module_for_shardmd", "f", helper_replacement))
    with pytest.raises(ModuleNotFoundError):
        with AdapterScope(bad):
            pass
    assert mod.helper_original(1) == "original"


def test_op_adapter_scope_registers_only_inside():
    @torch.library.custom_op("shardmd_unit::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    from shardmd.domain.api import AllReduceSum

    spec = SPEC_MPNN_HALO.with_custom_ops(OpAdapter(twice, output_transforms={0: AllReduceSum()}))
    s = shard(torch.ones(5, 3))
    with AdapterScope(spec):
        assert any(n.startswith("op_adapter:shardmd_unit::twice") for n in registered_handlers())
        with dispatch_trace() as tr:
            y = twice(s)
        assert [e["handler"] for e in tr] == ["op_adapter:shardmd_unit::twice"]
        assert type(y) is ShardTensor and float(y.sum()) == 30.0     # per-point output re-promoted
    assert not any(n.startswith("op_adapter") for n in registered_handlers())
    assert type(twice(s)) is torch.Tensor
