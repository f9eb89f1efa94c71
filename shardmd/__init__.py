"""ShardMD: molecular dynamics with spatial domain decomposition for machine-learned potentials.

The repository's top-level folders are this package's subpackages: ``shardmd/engine`` is a
link to ``engine/`` (and so on for ``domain``, ``models``, ``integrators``, ``configs``), so
that a clone works with ``PYTHONPATH=.``, an install sees one ordinary package, and tools
that walk packages (import-linter, code browsers) see ``shardmd.*`` (docs/design.md, "Package
layout").
"""
__version__ = "0.1.0"
