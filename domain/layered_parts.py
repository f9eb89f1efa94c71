"""A domain's model call made layer by layer over parts: each part needs one cutoff + skin of
halo per message-passing layer instead of ``layers`` of them, and one layer's activations
are alive at a time.

The model offers ``call_layer(k, positions, numbers, nl, features) -> (out, energies)``:
layer ``k`` on a part's points (``nl``'s query rows are the part's own points; the halo rows
only send), given the previous layer's output ``features`` of every point of the part
(None for ``k = 0``); ``out`` (q, ...) is the layer's output of the q query rows and
``energies`` (q,) their site-energy terms of this layer. The total energy is the sum over
layers and points of those terms (models/mace_layers.py for MACE).

Forward: layers 0 .. L-2 part by part without autograd; each layer's output of every point
(a few hundred numbers per point) is kept for the next layer. Backward, layer by layer in
reverse: each part's layer ``k`` is recomputed with autograd from the kept inputs and
differentiated with the seed ``1`` on its energy terms and ``g_k`` (dE/d out_k, carried from
layer ``k + 1``) on its outputs; that gives the forces of its positions, its virial (a strain
of its positions and cell) and ``g_{k-1}`` on its input features (halo rows included: a halo
point's features feed this part's receivers). The last layer is run only in the backward
pass. Each layer costs one forward more than a call in one piece (the recomputation);
layer ``L-1`` none.

Why this is the whole call: with ``E = sum_k sum_i e_k(i)`` and ``out_k = f_k(out_{k-1}, x)``,
``dE/dx = sum_k (de_k/dx + g_k . d out_k/dx)`` with ``g_{k-1} = d(e_k + g_k . out_k)/d out_{k-1}``
(``g_{L-1} = 0``): the chain rule taken one layer at a time, each layer's sum split over the
parts that own its receivers. tests/test_subdomains.py checks it against the call in one piece.

Units: positions (n, 3) Å, cell (3, 3) Å (rows), energies eV, forces eV/Å, virial eV.
"""
from __future__ import annotations

import torch

from .derivatives import apply_strain, strain_leaf


def _placed(positions: torch.Tensor, part, cell: torch.Tensor) -> torch.Tensor:
    """The part's points at the lattice images they are reached through."""
    return positions[part.ids] + part.images @ cell


def _forward_features(model, parts, positions, cell, numbers, layers: int) -> list[torch.Tensor]:
    """Outputs of layers 0 .. layers-2 for every point (no autograd): element k is layer k's."""
    kept: list[torch.Tensor] = []
    with torch.no_grad():
        for k in range(layers - 1):
            out = None
            for part in parts:
                given = kept[-1][part.ids] if kept else None
                h, _ = model.call_layer(k, _placed(positions, part, cell), numbers[part.ids], part.nl, given)
                if out is None:
                    out = h.new_zeros((positions.shape[0], *h.shape[1:]))
                out[part.ids[: part.n_counted]] = h
            kept.append(out)
    return kept


def evaluate_by_layer(model, parts, positions: torch.Tensor, cell: torch.Tensor, numbers: torch.Tensor,
                      layers: int) -> dict:
    """The model's outputs over the whole domain (module docstring): energy () eV, forces (n, 3)
    eV/Å, virial (3, 3) eV, energies (n,) eV (site energies). ``parts`` are built with one walk
    step (domain/subdomains.py ``build_part(..., 1, ...)``)."""
    n = int(positions.shape[0])
    kept = _forward_features(model, parts, positions, cell, numbers, layers)
    forces = torch.zeros(n, 3, dtype=positions.dtype, device=positions.device)
    energies = torch.zeros(n, dtype=torch.float64, device=positions.device)
    virial = torch.zeros(3, 3, dtype=torch.float64, device=positions.device)
    upstream = None   # dE / d(the outputs of layer k) of every point
    for k in reversed(range(layers)):
        given_all = kept[k - 1] if k else None
        down = torch.zeros_like(given_all) if k else None
        for part in parts:
            own = part.ids[: part.n_counted]
            with torch.enable_grad():
                leaf = _placed(positions, part, cell).detach().requires_grad_(True)
                eps = strain_leaf(leaf.dtype, leaf.device)
                x, _ = apply_strain(leaf, cell, eps)
                given = given_all[part.ids].requires_grad_(True) if k else None
                h, e = model.call_layer(k, x, numbers[part.ids], part.nl, given)
                total = e.sum()
                if upstream is not None:
                    total = total + (h * upstream[own].to(h.dtype)).sum()
                inputs = [leaf, eps] + ([given] if k else [])
                grads = torch.autograd.grad(total, inputs, allow_unused=True)
            grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)]
            forces.index_add_(0, part.ids, -grads[0].to(forces.dtype))
            virial -= grads[1].to(torch.float64)
            if k:
                down.index_add_(0, part.ids, grads[2].to(down.dtype))
            energies.index_add_(0, own, e.detach().to(torch.float64))
            del h, e, total, grads, given, x, leaf   # one part's activations at a time
        upstream = down
        if k:
            kept[k - 1] = None   # layer k-1's outputs are no longer needed
    # symmetric as it is: apply_strain differentiates through sym(eps)
    return {"energy": energies.sum().to(positions.dtype), "forces": forces, "virial": virial.to(positions.dtype),
            "energies": energies.to(positions.dtype)}


__all__ = ["evaluate_by_layer"]
