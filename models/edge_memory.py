"""Device bytes per neighbour-list edge for the memory check before a run (engine/run/preflight.py
reads a model's ``bytes_per_edge``): measured peaks of one H100, float32, fcc Cu (waters for
AIMNet2) at 300 K, divided by the atoms and by the list edges an atom has at the model's cutoff
plus the default 1 Å skin (docs/benchmarks.md, "The other families on one GPU"), then scaled by
the width and depth of the model at hand and by its float size.  A check, not a promise: it
refuses a run that would surely not fit, before anything is allocated, and names the way out.

| family | measured | peak, atoms | list edges an atom | bytes an edge |
|---|---|---|---:|---:|
| Allegro | 64 scalar, 32 tensor, l <= 2, 2 layers, 5 Å | 73.5 GiB, 16,384 | 77 | 62,600 |
| MatterSim | M3GNet, 4 blocks of 128, 5 Å | 46.5 GiB, 16,384 | 77 | 39,600 |
| ORB | orb-v3 direct, latent 256, 5 layers, 6 Å | 35.8 GiB, 131,072 | 122 | 2,390 |
| UMA | 4 layers of 128 channels, 6 Å, every activation kept | 59.6 GiB, 4,000 | 122 | 131,000 |
| UMA | the same, fairchem's chunked recomputation (``model.edge_chunk``), an H200 | 47.6 GiB, 55,296 | 122 | 7,580 |
| AIMNet2 | aimnet2.yaml, list to the 15 Å Coulomb cutoff | 4.93 GiB, 17,496 | 1,730 | 174 |

UMA's chunked row is its largest run: at 4,000 atoms the same model took 9.32 GiB (20,500 bytes
an edge, the weights and fixed buffers dominating), so a small system is under-counted by about
the weights (1.2 GB), which any GPU has room for, and a large one is counted as measured.  No
margin: the peaks are the most the allocator had handed out (its cache aside), so a run of the
measured size passes the check, with the cache as its only slack."""
from __future__ import annotations

import torch

MARGIN = 1.0


def edge_bytes(measured: float, size: float = 1.0, measured_size: float = 1.0, dtype=torch.float32) -> int:
    """``measured`` bytes an edge (float32, at ``measured_size``) for a model of ``size`` (the
    same measure of width x depth) in ``dtype``, times the margin."""
    return int(MARGIN * measured * float(size) / float(measured_size) * torch.finfo(dtype).bits / 32)


__all__ = ["MARGIN", "edge_bytes"]
