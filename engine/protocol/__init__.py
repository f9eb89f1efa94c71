"""Protocols: several stages (relax, heat, equilibrate, produce) in one run (``stages``): docs/protocols.md.

Layer: beside engine/batch, above engine/relax and engine/run; each stage is an ordinary run.
"""
