"""Many independent systems in one run (``system.frames``): docs/batch.md.

Layer: part of ``engine/``; builds on engine/run (each system is a :class:`Simulation` of one
rank sharing the run's model) and engine/relax; nothing below the engine imports it.
"""
