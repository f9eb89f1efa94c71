"""The built-in ShardTensor handlers (registered on import, in this order).

1. ``system_reduce``: a scatter (``scatter_add_``/``index_add_`` or their out-of-place
   forms, ``dim=0``) into a ShardTensor with ``n_systems`` rows from a per-point source
   (``n_padded`` or ``n_owned`` rows).  Halo rows are dropped from the source and index
   (every point contributes once, on its owner), the contributions are scattered locally
   and summed over ranks.  Off when the spec says ``system_reductions=False``.
2. ``halo_correction``: a scatter into a halo-padded per-point ShardTensor (``n_padded``
   rows).  The local contributions ``C`` (a fresh zero tensor scattered like the call) are
   corrected according to the spec's halo mode and added to the target:

   - ``scatter`` (default): ``forward(reverse(C))``: partial sums landed on halo rows are
     added to their owners, then every halo row is refreshed from its owner.  Correct for
     receiver-owned edges (halo rows receive nothing) and for sender-owned edges (halo rows
     receive partial sums), and for any mix, as long as every edge exists on one rank only;
   - ``gather``: ``forward(C[:n_owned])``: halo partials are discarded and halo rows are
     refreshed (receiver-owned edges only; half the traffic);
   - ``local``: no handler: a plain local scatter.
3. ``sharded_gather``: ``index_select``/``x[idx]`` of a sharded ShardTensor with a 1-D
   index of storage ids: rows owned elsewhere are fetched from their owners (all-to-all-v);
   an index equal to ``n_global`` yields a zero row.
4. ``sharded_scatter``: a scatter into a sharded ShardTensor with an index of storage ids:
   contributions are shipped to the owners (all-to-all-v) and added there; padding
   indices contribute nothing.

All are autograd-correct: they are compositions of differentiable local ops,
:func:`~shardmd.domain.halo.halo_forward`/:func:`~shardmd.domain.halo.halo_reverse` and the
differentiable collectives of :mod:`shardmd.domain.collectives`.  In-place forms return the
target object; out-of-place forms return a new ShardTensor with the target's metadata.
Scatter handlers support ``dim=0`` only (other dims run as plain ops); a 2-D
``scatter_add`` index must be the row index broadcast along the feature axis.
"""
from __future__ import annotations

import torch
from torch._C import DisableTorchFunctionSubclass

from .collectives import all_reduce_sum, all_to_all_v, exchange_counts
from .halo import halo_forward, halo_reverse
from .shard_tensor import ShardTensor, plain, register_handler

T = torch.Tensor
INPLACE_SCATTER = frozenset([T.scatter_add_, T.index_add_])
SCATTER_OPS = INPLACE_SCATTER | frozenset([torch.scatter_add, T.scatter_add, torch.index_add, T.index_add])
INDEX_ADD_OPS = frozenset([T.index_add_, torch.index_add, T.index_add])
GATHER_OPS = frozenset([torch.index_select, T.index_select, T.__getitem__])


def halo_mode(t) -> str:
    spec = getattr(t, "_spec", None)
    if spec is None:
        return "scatter"
    return getattr(spec.distribution.storage, "mode", "scatter")


def system_reductions_on(t) -> bool:
    spec = getattr(t, "_spec", None)
    return True if spec is None else bool(spec.distribution.system_reductions)


# -- argument parsing -----------------------------------------------------------------------
class _Call:
    __slots__ = ("func", "target", "dim", "index", "source", "alpha", "inplace", "ok")

    def __init__(self, func, args, kwargs):
        names = ("input", "dim", "index", "source", "alpha")
        vals = dict(zip(names, args))
        for k, v in kwargs.items():
            key = {"self": "input", "src": "source"}.get(k, k)
            vals[key] = v
        self.func = func
        self.target = vals.get("input")
        self.dim = vals.get("dim")
        self.index = vals.get("index")
        self.source = vals.get("source")
        self.alpha = vals.get("alpha", 1)
        self.inplace = func in INPLACE_SCATTER
        self.ok = ("out" not in kwargs and isinstance(self.target, ShardTensor) and isinstance(self.dim, int)
                   and isinstance(self.index, torch.Tensor) and isinstance(self.source, torch.Tensor)
                   and self.target.dim() > 0 and self.dim % self.target.dim() == 0)

    def contribution(self, target_like: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """Plain zero tensor shaped like ``target_like``, scattered like the call."""
        z = torch.zeros_like(target_like)
        if self.func in INDEX_ADD_OPS:
            return z.index_add(0, index, source, alpha=self.alpha)
        return z.scatter_add(0, index, source)

    def finish(self, delta: torch.Tensor):
        """Add ``delta`` to the target in place (in-place forms) or out of place."""
        tgt = self.target
        if self.inplace:
            with DisableTorchFunctionSubclass():
                tgt.add_(delta)
            return tgt
        return ShardTensor.wrap_like(plain(tgt) + delta, tgt)


def _rows(t: torch.Tensor) -> int:
    return int(t.shape[0]) if t.dim() else -1


def _row_index(index: torch.Tensor) -> torch.Tensor:
    return index if index.dim() == 1 else index.reshape(index.shape[0], -1)[:, 0]


# -- 1. per-system reduction ------------------------------------------------------------------
def _system_pred(func, args, kwargs) -> bool:
    c = _Call(func, args, kwargs)
    if not c.ok or not system_reductions_on(c.target):
        return False
    t = c.target
    n_sys = t._n_systems
    if _rows(t) != n_sys:
        return False
    if t._halo is not None and n_sys == t._halo.n_padded:
        return False
    src_rows = _rows(c.source)
    per_point = {t.n_owned, t.n_padded}
    return src_rows in per_point and _rows(c.index) == src_rows


def _system_handler(func, types, args, kwargs):
    c = _Call(func, args, kwargs)
    t = c.target
    with DisableTorchFunctionSubclass():
        src, idx = plain(c.source), plain(c.index)
        if t._halo is not None and _rows(src) == t._halo.n_padded:
            n = t._halo.n_owned
            src, idx = src[:n], idx[:n]
        local = c.contribution(plain(t), idx, src)
        total = all_reduce_sum(t._group.comm, local)
        return c.finish(total)


# -- 2. halo correction ------------------------------------------------------------------------
def _halo_pred(func, args, kwargs) -> bool:
    c = _Call(func, args, kwargs)
    if not c.ok or c.target._halo is None or halo_mode(c.target) == "local":
        return False
    return _rows(c.target) == c.target._halo.n_padded


def correct_halo(t: ShardTensor, contrib: torch.Tensor, mode: str = "scatter") -> torch.Tensor:
    """Halo-corrected version of per-point local contributions ``contrib`` (n_padded, *F)."""
    comm, plan, n = t._group.comm, t._halo.plan, t._halo.n_owned
    if mode == "gather":
        return halo_forward(comm, plan, contrib[:n])
    return halo_forward(comm, plan, halo_reverse(comm, plan, contrib))


def _halo_handler(func, types, args, kwargs):
    c = _Call(func, args, kwargs)
    t = c.target
    with DisableTorchFunctionSubclass():
        local = c.contribution(plain(t), plain(c.index), plain(c.source))
        return c.finish(correct_halo(t, local, halo_mode(t)))


# -- 3./4. sharded storage ------------------------------------------------------------------------
def _route(meta, comm, gids: torch.Tensor):
    """Valid positions, their owner-sorted order and per-rank counts for storage ids ``gids``."""
    valid = (gids >= 0) & (gids < meta.n_global)
    pos = torch.nonzero(valid).flatten()
    g = gids[pos]
    owner = meta.owner[g]
    order = torch.argsort(owner, stable=True)
    send = torch.bincount(owner[order], minlength=comm.size)
    recv = exchange_counts(comm, send)
    return pos[order], g[order], send.tolist(), recv.tolist()


def sharded_gather(t: ShardTensor, x: torch.Tensor, gids: torch.Tensor) -> torch.Tensor:
    """Rows ``gids`` (storage ids, ``n_global`` = padding) of the sharded plain tensor ``x``."""
    meta, comm = t._shard, t._group.comm
    gids = gids.to(torch.int64)
    pos, g, send, recv = _route(meta, comm, gids)
    asked = all_to_all_v(comm, g, send, recv)                 # ids others want from me
    rows = x.index_select(0, meta.local_row[asked])           # my rows, in their order
    got = all_to_all_v(comm, rows, recv, send)                # back to the askers
    out = x.new_zeros((int(gids.shape[0]), *x.shape[1:]))
    return out.index_copy(0, pos, got)


def sharded_scatter_contrib(t: ShardTensor, gids: torch.Tensor, source: torch.Tensor,
                            alpha=1) -> torch.Tensor:
    """(n_owned, *F) contributions of ``source`` rows addressed to storage ids ``gids``,
    after shipping them to their owners (padding ids dropped)."""
    meta, comm = t._shard, t._group.comm
    pos, g, send, recv = _route(meta, comm, gids.to(torch.int64))
    dest = all_to_all_v(comm, g, send, recv)
    vals = all_to_all_v(comm, source.index_select(0, pos), send, recv)
    out = torch.zeros((meta.n_owned, *source.shape[1:]), dtype=source.dtype, device=source.device)
    return out.index_add(0, meta.local_row[dest], vals, alpha=alpha)


def _gather_args(func, args, kwargs):
    if func is T.__getitem__:
        x, idx = args[0], args[1]
        return x, 0, idx
    vals = dict(zip(("input", "dim", "index"), args))
    vals.update({("input" if k == "self" else k): v for k, v in kwargs.items()})
    return vals.get("input"), vals.get("dim"), vals.get("index")


def _gather_pred(func, args, kwargs) -> bool:
    x, dim, idx = _gather_args(func, args, kwargs)
    return (isinstance(x, ShardTensor) and x._shard is not None and dim == 0 and isinstance(idx, torch.Tensor)
            and idx.dim() == 1 and idx.dtype in (torch.int64, torch.int32) and "out" not in kwargs
            and _rows(x) == x._shard.n_owned)


def _gather_handler(func, types, args, kwargs):
    x, _, idx = _gather_args(func, args, kwargs)
    with DisableTorchFunctionSubclass():
        return sharded_gather(x, plain(x), plain(idx))


def _sharded_scatter_pred(func, args, kwargs) -> bool:
    c = _Call(func, args, kwargs)
    if not c.ok or c.target._shard is None:
        return False
    return _rows(c.target) == c.target._shard.n_owned and _rows(c.index) == _rows(c.source)


def _sharded_scatter_handler(func, types, args, kwargs):
    c = _Call(func, args, kwargs)
    t = c.target
    alpha = c.alpha if c.func in INDEX_ADD_OPS else 1
    with DisableTorchFunctionSubclass():
        delta = sharded_scatter_contrib(t, _row_index(plain(c.index)), plain(c.source), alpha)
        return c.finish(delta)


BUILTIN = ("system_reduce", "halo_correction", "sharded_gather", "sharded_scatter")


def install_builtin_handlers() -> None:
    """Register the four built-in handlers (idempotent)."""
    from .shard_tensor import registered_handlers

    have = set(registered_handlers())
    if "system_reduce" not in have:
        register_handler(SCATTER_OPS, _system_pred, _system_handler, name="system_reduce")
    if "halo_correction" not in have:
        register_handler(SCATTER_OPS, _halo_pred, _halo_handler, name="halo_correction")
    if "sharded_gather" not in have:
        register_handler(GATHER_OPS, _gather_pred, _gather_handler, name="sharded_gather")
    if "sharded_scatter" not in have:
        register_handler(SCATTER_OPS, _sharded_scatter_pred, _sharded_scatter_handler, name="sharded_scatter")


install_builtin_handlers()

__all__ = ["BUILTIN", "GATHER_OPS", "SCATTER_OPS", "correct_halo", "install_builtin_handlers", "sharded_gather",
           "sharded_scatter_contrib"]
