"""One message-passing layer of a mace-torch model at a time, for a call made layer by layer
over parts (domain/layered_parts.py).

mace-torch's ``MACE`` / ``ScaleShiftMACE`` forward is a loop: an embedding of each atom, then
per interaction ``i`` the block (messages over edges from the previous features), the
product (the new features ``h_i``) and the readout (a site energy term ``r_i(h_i)``). A site
energy is ``E0 + scale * (pair + sum_i r_i) + shift`` (``MACE``: scale 1, shift 0). Layer
``i`` of an atom needs ``h_{i-1}`` of its neighbours within one cutoff only, so a part needs
one cutoff + skin of halo per layer, not ``layers`` of them. :func:`call_layer` runs the
model's own modules (``node_embedding``, ``interactions[i]``, ``products[i]``,
``readouts[i]``) on a part's points: the receivers are the list's query rows (the part's
own atoms), the halo rows only send, and their input features are given (``features``).

Units: positions (m, 3) Å, energies eV. Features are whatever shape the model's product
gives, (n, ...) per atom.
"""
from __future__ import annotations

import torch

#: forward classes whose loop :func:`call_layer` repeats (anything else is refused by name)
_PLAIN_FORWARDS = ("MACE", "ScaleShiftMACE")


def layer_problem(model: torch.nn.Module) -> str | None:
    """Why ``model`` (a mace-torch module) cannot be called layer by layer, or None."""
    name = type(model).__name__
    if name not in _PLAIN_FORWARDS:
        return f"a {name} (layer by layer runs {' and '.join(_PLAIN_FORWARDS)})"
    for extra in ("joint_embedding", "les", "les_readouts", "field_dependent_charges"):
        if hasattr(model, extra):
            return f"a {name} with {extra}"
    if len(model.readouts) not in (1, len(model.interactions)):
        return f"a {name} with {len(model.readouts)} readouts for {len(model.interactions)} interactions"
    return None


def _scale_shift(model: torch.nn.Module, heads: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) per atom of a ScaleShiftMACE's heads; (1, 0) for a plain MACE."""
    block = getattr(model, "scale_shift", None)
    if block is None:
        one = torch.ones((), dtype=dtype, device=heads.device)
        return one, torch.zeros_like(one)
    return (torch.atleast_1d(block.scale)[heads].to(dtype), torch.atleast_1d(block.shift)[heads].to(dtype))


def call_layer(model: torch.nn.Module, index: int, positions: torch.Tensor, node_attrs: torch.Tensor,
               head: int, nl, features: torch.Tensor | None, radius: float):
    """Layer ``index`` of ``model`` on a part: (features (k, ...) of its ``k = nl.n_query``
    receivers, their site energy terms (k,) eV of this layer).

    positions: (m, 3) Å of every point of the part (no shifts: a part is an open cluster);
    node_attrs: (m, species) one-hot; nl: query rows = the receivers, neighbours index
    ``positions``; features: (m, ...) the previous layer's output of every point (None for
    layer 0, which embeds the species). Layer 0's energies carry E0, the shift and the pair
    term; the last layer's features are what its readout reads. Edges longer than
    ``radius`` (the model's r_max, where its envelope is zero) are dropped."""
    k = int(nl.n_query)
    receivers = nl.centers()
    senders = nl.neighbors.long()
    vectors = positions[receivers] - positions[senders]
    lengths = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)
    keep = torch.nonzero(lengths[:, 0] < radius).squeeze(1)
    vectors, lengths = vectors[keep], lengths[keep]
    edge_index = torch.stack([senders[keep], receivers[keep]])
    heads = torch.full((k,), int(head), dtype=torch.int64, device=positions.device)
    rows = torch.arange(k, device=positions.device)
    edge_attrs = model.spherical_harmonics(vectors)
    edge_feats, cutoff = model.radial_embedding(lengths, node_attrs, edge_index, model.atomic_numbers)
    first = index == 0
    feats = model.node_embedding(node_attrs) if first else features
    # every row goes in (the halo's features are given, so no exchange): messages reach the
    # receivers only, and only their rows go on
    message, sc = model.interactions[index](
        node_attrs=node_attrs, node_feats=feats, edge_attrs=edge_attrs, edge_feats=edge_feats,
        edge_index=edge_index, cutoff=cutoff, first_layer=first)
    out = model.products[index](node_feats=message[:k], sc=None if sc is None else sc[:k], node_attrs=node_attrs[:k])
    scale, shift = _scale_shift(model, heads, out.dtype)
    last = index == len(model.interactions) - 1
    if len(model.readouts) > 1 or last:
        readout = model.readouts[index if len(model.readouts) > 1 else 0]
        energy = scale * readout(out, heads)[rows, heads]
    else:
        energy = torch.zeros(k, dtype=out.dtype, device=out.device)
    if first:
        energy = energy + model.atomic_energies_fn(node_attrs[:k])[rows, heads].to(out.dtype) + shift
        if hasattr(model, "pair_repulsion"):
            pair = model.pair_repulsion_fn(lengths, node_attrs, edge_index, model.atomic_numbers)
            energy = energy + scale * pair[:k]
    return out, energy


__all__ = ["call_layer", "layer_problem"]
