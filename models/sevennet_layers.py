"""One message-passing layer of a SevenNet at a time, for a call made layer by layer over parts
(domain/layered_parts.py; models/mace_layers.py does the same for MACE).

sevenn's model is a named sequence of modules over a data dict: the edge embedding and the
species embedding, then per layer ``k`` the modules named ``k_*`` (self-connection, linear,
convolution, gate) that turn the node features into the next ones, then the readout
(``reduce_input_to_hidden`` ... ``rescale_atomic_energy``: a site energy from the last
features) and the total's sum. Layer ``k`` of an atom needs the layer-``k-1`` features of its
neighbours within one cutoff only, so a part needs one cutoff + skin of halo per layer.
:func:`call_layer` runs sevenn's own modules on a part: the receivers are the list's query rows
(the part's own atoms), the halo rows only send, and their input features are given.

Units: positions (m, 3) Å, energies eV.
"""
from __future__ import annotations

import re

import torch

_EMBED = ("edge_embedding", "onehot_idx_to_onehot")   # every layer: the part's edges, the species' one-hot
_FIRST = ("onehot_to_feature_x",)                      # layer 0 only: the first features
_READOUT = ("reduce_input_to_hidden", "reduce_hidden_to_energy", "rescale_atomic_energy")
_TOTAL = ("reduce_total_enegy", "reduce_total_energy", "force_output")   # sums and derivatives: ours


def segments(graph_model: torch.nn.Module) -> tuple[list[list[torch.nn.Module]], str | None]:
    """(the modules of each layer, why not) for sevenn's sequential model: None when every module
    is an embedding, a numbered layer's, the readout's or the total's."""
    names = list(graph_model._modules)
    layers: dict[int, list[torch.nn.Module]] = {}
    for name in names:
        hit = re.fullmatch(r"(\d+)_\w+", name)
        if hit:
            layers.setdefault(int(hit.group(1)), []).append(graph_model._modules[name])
        elif name not in _EMBED + _FIRST + _READOUT + _TOTAL:
            return [], f"a SevenNet with a module {name!r}"
    if sorted(layers) != list(range(len(layers))) or not layers:
        return [], "a SevenNet whose layers are not numbered 0 .. L-1"
    if not all(n in names for n in _EMBED + _FIRST + _READOUT):
        return [], "a SevenNet without sevenn's embedding and readout modules"
    return [layers[k] for k in range(len(layers))], None


def call_layer(graph_model: torch.nn.Module, layers: list, index: int, positions: torch.Tensor,
               types: torch.Tensor, numbers: torch.Tensor, nl, features: torch.Tensor | None, cutoff: float):
    """Layer ``index`` on a part: (node features (q, F) of its ``q = nl.n_query`` receivers,
    their site energies (q,) eV: the readout's at the last layer, zeros before).

    positions: (m, 3) Å of every point of the part (no shifts); types: (m,) sevenn's type
    indices; features: (m, F) the previous layer's output of every point (None for layer 0).
    Edges longer than ``cutoff`` are dropped (sevenn's list stops there)."""
    import sevenn._keys as K

    q = int(nl.n_query)
    m = graph_model._modules
    i, j = nl.centers(), nl.neighbors.long()
    vec = positions[j] - positions[i]
    with torch.no_grad():
        keep = torch.nonzero(torch.linalg.vector_norm(vec, dim=1) < cutoff).squeeze(1)
    n = int(positions.shape[0])
    data = {K.EDGE_IDX: torch.stack([i[keep], j[keep]]), K.EDGE_VEC: vec[keep], K.NODE_FEATURE: types,
            K.ATOMIC_NUMBERS: numbers, K.NUM_ATOMS: torch.tensor(n, device=types.device),
            K.BATCH: torch.zeros(n, dtype=torch.int64, device=types.device)}
    for name in _EMBED + (_FIRST if index == 0 else ()):
        data = m[name](data)
    if index:
        data[K.NODE_FEATURE] = features
    for module in layers[index]:
        data = module(data)
    out = data[K.NODE_FEATURE][:q]
    if index < len(layers) - 1:
        return out, torch.zeros(q, dtype=out.dtype, device=out.device)
    for name in _READOUT:   # per atom: the rows past q are the halo's, not counted
        data = m[name](data)
    return out, data[K.ATOMIC_ENERGY].reshape(n)[:q]


__all__ = ["call_layer", "segments"]
