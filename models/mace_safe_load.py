"""Loading mace-torch model files without running code from them.

A mace-torch ``.model`` file is a ``torch.save`` of the whole ``nn.Module``: a pickle, and
unpickling a pickle calls whatever callables it names, so ``torch.load(weights_only=False)``
of a hostile file runs the attacker's code (``os.system``, ...).  This module loads such files
with ``torch.load(weights_only=True)``: PyTorch's restricted unpickler, which resolves a
global only if it is on an allow-list, calls (REDUCE) only allow-listed callables and builds
(``__setstate__``) only instances of allow-listed classes.  ``SAFE_GLOBALS`` is that list:
the classes and functions that mace-torch's energy models (``MACE``, ``ScaleShiftMACE``)
are made of, nothing more.

How the list was derived: ``torch.serialization.get_unsafe_globals_in_checkpoint`` on the
shipped model (trained and saved by mace's own ``run_train``), on 30 models built from
mace-torch's constructors (every class of ``mace.modules.interaction_classes``, every gate of
``gate_dict``, radial types bessel/gaussian/chebyshev, distance transforms Agnesi/Soft,
ZBL pair repulsion, max_ell 2-3, correlation 1-3 and per-layer lists, one to three layers,
multi-head, float32, NonLinearBiasReadoutBlock, so3/agnostic-product/reduced-cg variants)
and on models trained and saved by ``mace_run_train`` with other settings; the union is
below, grouped by package (docs/design.md, "Loading model files safely").  Not included:
files saved after conversion to cuEquivariance/OpenEquivariance kernels (their kernels'
classes; give the e3nn file, ``model.cueq`` converts at load, and mace's trainer saves e3nn
files), dipole/polarisability models (not energy models: the engine refuses them anyway)
and models with charge/spin embeddings (``GenericJointEmbedding``; they need inputs the
engine does not give).  Such files are refused with a message that names the missing
global; ``model.trust_pickle=true`` loads them the old way.

Two globals every mace-torch file names would run arbitrary code if allowed, so they are
bound to restricted substitutes instead (the tuple form ``(callable, "module.name")`` of
``torch.serialization.safe_globals`` maps a name in the file to our function):

- ``torch.fx.graph_module.reduce_graph_module``: how an ``fx.GraphModule`` (mace's
  symmetric contraction holds opt_einsum_fx's einsum graphs) pickles itself.  torch's
  version ``exec``\\ s the Python source stored in the file.  ``_rebuild_graph_module``
  instead parses that source (``ast``, which runs nothing), accepts only the subset that
  opt_einsum_fx generates (``torch.functional.einsum`` / ``tensordot``, ``.permute``,
  multiplication by a number, on the forward's own arguments), builds an ``fx.Graph`` node
  by node from our own table of those functions, and lets fx generate the module's code
  from that graph.  Nothing written in the file is executed.
- ``builtins.getattr``: how ``torch.tanh`` and ``torch.abs`` (mace's ``gate=tanh``/``abs``)
  pickle, as ``getattr(torch._C._VariableFunctionsClass, "tanh")``.  ``_torch_function``
  answers only those names on that class.

What the safe path still trusts: e3nn's code-generated modules (``Linear``,
``TensorProduct``: ``e3nn.util.codegen.CodeGenMixin``) pickle their compiled parts as
TorchScript archives (bytes) and their ``__setstate__`` calls ``torch.jit.load`` on them.
TorchScript cannot call Python, so this runs no Python code from the file, but the
TorchScript it loads is the file's own and computes whatever it says (and runs TorchScript
operators during loading if it defines a ``__setstate__``); and ``torch.jit.load`` is a
parser of complex input that is not hardened against hostile files the way the pickle
allow-list is.  So the safe path stops "opening a model file runs a program", not "a hostile
model file gives wrong energies", nor does it bound memory (a file may hold huge tensors).

``safe_globals`` adds the list to torch's process-wide set only for the duration of the
load (torch keeps that set in a module global, not per thread), and adds only entries the
process had not allowed already, so leaving the block never removes a user's own entries.
Needs torch >= 2.6 (the tuple form of allow-list entries; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
which ``import mace`` sets, overrides only calls that do not pass ``weights_only``).
"""
from __future__ import annotations

import ast
import operator
import os
import pickle
import re
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.fx

from .files import refused_global


class RefusedContent(Exception):
    """The file needs a global, or holds fx code, that the safe loader does not allow.
    ``what``: the offending global's dotted name (or a short description of the code)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


# -- substitutes for the two code-running globals ------------------------------------------------

#: torch functions a pickled ``getattr(torch._C._VariableFunctionsClass, name)`` may name:
#: mace-torch's gates other than silu (mace.modules.gate_dict)
_TORCH_FUNCTIONS = frozenset({"tanh", "abs"})


def _torch_function(owner, name):
    """Stands in for ``builtins.getattr`` during the safe load: only ``torch.tanh``/``torch.abs``."""
    if owner is torch._C._VariableFunctionsClass and isinstance(name, str) and name in _TORCH_FUNCTIONS:
        return getattr(torch, name)
    raise RefusedContent(f"builtins.getattr({getattr(owner, '__name__', type(owner).__name__)}, {name!r})")


#: the functions fx code may call, by the dotted name fx writes (opt_einsum_fx's output)
_FX_FUNCTIONS = {"torch.functional.einsum": torch.functional.einsum, "torch.einsum": torch.einsum,
                 "torch.functional.tensordot": torch.functional.tensordot, "torch.tensordot": torch.tensordot}
#: tensor methods fx code may call (opt_einsum_fx permutes an einsum's output into place)
_FX_METHODS = frozenset({"permute"})


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _show(node) -> str:
    """Source of a refused node for the one-line message (shortened; never executed)."""
    text = ast.unparse(node)
    return repr(text if len(text) <= 60 else text[:57] + "...")


#: names fx's generated code itself uses (its import block); a forward argument of that name
#: would shadow them.  Nothing could run through that, but the graph would not be what fx wrote.
_FX_RESERVED = frozenset({"torch", "self", "device", "inf", "nan", "pytree", "fx_pytree", "operator"})


def _plain_name(name: str) -> bool:
    return re.fullmatch(r"[a-z][a-z0-9_]*", name) is not None and name not in _FX_RESERVED


def _int_tree(node) -> bool:
    """An int literal or (nested) tuple/list of them: tensordot's dims, permute's order."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_int_tree(e) for e in node.elts)
    return False


def _graph_from_code(code: str) -> torch.fx.Graph:
    """Rebuild the fx graph of a GraphModule's stored forward source, refusing anything
    outside opt_einsum_fx's subset.  Parses only (``ast``); never executes ``code``."""
    def refuse(why):
        raise RefusedContent(f"torch.fx code outside the einsum subset: {why}")

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        refuse("not Python")
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        refuse("more than one forward function")
    fn = tree.body[0]
    a = fn.args
    if (fn.name != "forward" or fn.decorator_list or fn.returns or a.vararg or a.kwarg or a.kwonlyargs
            or a.posonlyargs or a.defaults or not a.args or a.args[0].arg != "self"
            or any(x.annotation or not _plain_name(x.arg) for x in a.args[1:])):
        refuse("forward's signature")
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for x in a.args[1:]:
        env[x.arg] = graph.placeholder(x.arg)

    def value(node):
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        refuse(f"operand {_show(node)}")

    def literal(node):
        return ast.literal_eval(node)   # only after _int_tree / type checks: plain literals

    body = fn.body
    if not body or not isinstance(body[-1], ast.Return):
        refuse("no return")
    for st in body[:-1]:
        if not isinstance(st, ast.Assign) or not all(isinstance(t, ast.Name) and _plain_name(t.id)
                                                     for t in st.targets):
            refuse(f"statement {_show(st)}")
        v = st.value
        if isinstance(v, ast.Constant) and v.value is None:   # fx frees dead values: `x = y = None`
            for t in st.targets:
                env.pop(t.id, None)
            continue
        if len(st.targets) != 1:
            refuse(f"statement {_show(st)}")
        name = st.targets[0].id
        if isinstance(v, ast.Call) and _dotted(v.func) in _FX_FUNCTIONS:
            target = _FX_FUNCTIONS[_dotted(v.func)]
            if target is torch.functional.einsum:
                if (v.keywords or len(v.args) < 2 or not isinstance(v.args[0], ast.Constant)
                        or type(v.args[0].value) is not str):
                    refuse(f"einsum call {_show(v)}")
                args, kwargs = (v.args[0].value, *(value(e) for e in v.args[1:])), {}
            else:
                if len(v.args) != 2 or any(k.arg not in ("dims", "out") for k in v.keywords):
                    refuse(f"tensordot call {_show(v)}")
                kwargs = {}
                for k in v.keywords:
                    ok = _int_tree(k.value) if k.arg == "dims" else (
                        isinstance(k.value, ast.Constant) and k.value.value is None)
                    if not ok:
                        refuse(f"tensordot argument {_show(k)}")
                    kwargs[k.arg] = literal(k.value)
                args = tuple(value(e) for e in v.args)
            node = graph.create_node("call_function", target, args, kwargs, name=name)
        elif (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _FX_METHODS
              and not v.keywords and all(_int_tree(e) for e in v.args)):
            node = graph.create_node("call_method", v.func.attr,
                                     (value(v.func.value), *(literal(e) for e in v.args)), {}, name=name)
        elif isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult):   # opt_einsum_fx's fused scalars
            num = [s for s in (v.left, v.right) if isinstance(s, ast.Constant) and type(s.value) in (int, float)]
            if len(num) != 1:
                refuse(f"product {_show(v)}")
            other = v.right if num[0] is v.left else v.left
            args = (num[0].value, value(other)) if num[0] is v.left else (value(other), num[0].value)
            node = graph.create_node("call_function", operator.mul, args, {}, name=name)
        else:
            refuse(f"statement {_show(st)}")
        env[name] = node
    graph.output(value(body[-1].value) if body[-1].value is not None else refuse("empty return"))
    graph.lint()
    return graph


def _rebuild_graph_module(body, import_block) -> torch.nn.Module:
    """Stands in for ``torch.fx.graph_module.reduce_graph_module`` during the safe load.

    ``body`` is the module's ``__dict__`` as pickled (already built by the restricted
    unpickler), ``import_block`` the import lines torch would have ``exec``\\ d: ignored.  The
    graph comes from ``_graph_from_code``; parameters, buffers or submodules are refused
    (opt_einsum_fx graphs hold none, and the accepted code could not reach them)."""
    if not isinstance(body, dict) or not isinstance(import_block, str):
        raise RefusedContent("torch.fx.graph_module.reduce_graph_module with malformed arguments")
    code = body.get("_code") or body.get("code")
    if not isinstance(code, str):
        raise RefusedContent("torch.fx.graph_module.reduce_graph_module without code")
    for key in ("_parameters", "_buffers", "_modules"):
        if body.get(key):
            raise RefusedContent(f"torch.fx GraphModule with {key.strip('_')}")
    gm = torch.fx.GraphModule(torch.nn.Module(), _graph_from_code(code))
    gm.train(bool(body.get("training", False)))
    return gm


# -- the allow-list -------------------------------------------------------------------------------

def _import_quietly():
    """mace-torch prints a cuEquivariance notice and e3nn warns at import: keep both quiet.
    Imported by module path, so a renamed or moved class fails here, loudly."""
    import contextlib
    import importlib
    import io
    import warnings

    names = ("mace.modules.models", "mace.modules.blocks", "mace.modules.gate", "mace.modules.irreps_tools",
             "mace.modules.radial", "mace.modules.symmetric_contraction", "e3nn.o3._irreps", "e3nn.o3._linear",
             "e3nn.o3._spherical_harmonics", "e3nn.o3._tensor_product._instruction",
             "e3nn.o3._tensor_product._sub", "e3nn.o3._tensor_product._tensor_product", "e3nn.nn._fc",
             "e3nn.nn._activation", "e3nn.math._normalize_activation", "torch.fx._symbolic_trace")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        import mace  # noqa: F401  (first: it sets up e3nn's defaults)
        return [importlib.import_module(n) for n in names]


(mm, mb, mgate, mirr, mr, msc, e3nn_irreps, e3nn_linear, e3nn_sh, e3nn_tp_instr, e3nn_tp_sub, e3nn_tp,
 e3nn_fc, e3nn_act, e3nn_norm, fx_trace) = _import_quietly()

#: every global a mace-torch energy-model file may name, and nothing else (see the docstring)
SAFE_GLOBALS: tuple = (
    # mace-torch: the energy models and their blocks (interaction classes: all of
    # mace.modules.interaction_classes; readouts: those MACE builds for energies)
    mm.MACE, mm.ScaleShiftMACE,
    mb.AtomicEnergiesBlock, mb.EquivariantProductBasisBlock, mb.LinearNodeEmbeddingBlock,
    mb.LinearReadoutBlock, mb.NonLinearReadoutBlock, mb.NonLinearBiasReadoutBlock,
    mb.RadialEmbeddingBlock, mb.ScaleShiftBlock,
    mb.RealAgnosticInteractionBlock, mb.RealAgnosticResidualInteractionBlock,
    mb.RealAgnosticAttResidualInteractionBlock, mb.RealAgnosticDensityInteractionBlock,
    mb.RealAgnosticDensityResidualInteractionBlock, mb.RealAgnosticResidualNonLinearInteractionBlock,
    mgate.GatedEquivariantBlock,                        # in ResidualNonLinear interactions
    mirr.reshape_irreps,
    mr.BesselBasis, mr.ChebychevBasis, mr.GaussianBasis, mr.PolynomialCutoff, mr.ZBLBasis,
    mr.AgnesiTransform, mr.SoftTransform, mr.RadialMLP,
    msc.SymmetricContraction, msc.Contraction,
    # e3nn: irreps, linear maps, tensor products, spherical harmonics, radial MLPs
    e3nn_irreps.Irrep, e3nn_irreps.Irreps, e3nn_irreps._MulIr,
    e3nn_linear.Linear, e3nn_linear.Instruction,
    e3nn_tp.TensorProduct, e3nn_tp_sub.FullyConnectedTensorProduct, e3nn_tp_instr.Instruction,
    e3nn_sh.SphericalHarmonics,
    e3nn_fc.FullyConnectedNet, e3nn_fc._Layer, e3nn_act.Activation, e3nn_norm.normalize2mom,
    # torch.nn: containers, the layers of RadialMLP/GatedEquivariantBlock, activations
    torch.nn.ModuleList, torch.nn.ParameterList, torch.nn.Sequential,
    torch.nn.Linear, torch.nn.LayerNorm, torch.nn.SiLU,
    torch.nn.functional.silu, torch.nn.functional.sigmoid,
    # torch.tanh / torch.abs: the class they are looked up on, and the restricted lookup
    torch._C._VariableFunctionsClass, (_torch_function, "builtins.getattr"),
    # torch.fx: a GraphModule's state names its tracer class (never used to trace here);
    # the GraphModule itself is rebuilt from its code without exec (see the docstring)
    fx_trace.Tracer, (_rebuild_graph_module, "torch.fx.graph_module.reduce_graph_module"),
)


@contextmanager
def safe_globals():
    """torch's safe-globals context with our list, adding only entries not allowed already."""
    have = set(torch.serialization.get_safe_globals())
    with torch.serialization.safe_globals([g for g in SAFE_GLOBALS if g not in have]):
        yield


def torch_supports_safe_load() -> bool:
    """torch >= 2.6: allow-list entries of the form (callable, name) (used for the substitutes)."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    return (major, minor) >= (2, 6)


_FORCE_NO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextmanager
def _without_force_no_weights_only():
    """Keep ``import mace``'s TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD out of the environment while
    the safe load runs.  torch 2.13 ignores it when ``weights_only`` is passed, but the
    other versions the engine accepts were not read here, and the safety of this load must
    not hang on that.  Restored afterwards (other threads meanwhile only get torch's safer
    default)."""
    saved = os.environ.pop(_FORCE_NO, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[_FORCE_NO] = saved


def load_safely(path: str | Path, map_location=None):
    """``torch.load(path, weights_only=True)`` under ``SAFE_GLOBALS``.

    Raises RefusedContent (``what`` = the offending global) when the file needs something
    outside the list; any other exception (corrupt file, TorchScript archive, ...) passes
    through unchanged.  ``weights_only`` is passed explicitly: in torch 2.13 (read there) the
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 that ``import mace`` sets only changes calls that
    leave it out (torch/serialization.py: ``if weights_only_not_set``); it is also kept out
    of the environment during the load (``_without_force_no_weights_only``)."""
    if not torch_supports_safe_load():
        raise RuntimeError(f"the safe model loader needs torch >= 2.6 (this is {torch.__version__})")
    try:
        with safe_globals(), _without_force_no_weights_only():
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        what = refused_global(str(exc))
        if what is None:
            raise
        raise RefusedContent(what) from None
