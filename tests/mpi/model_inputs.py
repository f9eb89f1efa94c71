"""Engine runs of the charge model (tests/charge_model.py) on the ranks of this MPI world.

``run(comm, argv)``: tests/engine_runs.py's run with tests/ importable, so that
``model=py:charge_model:make`` resolves on every rank.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine_runs


def run(comm, argv):
    engine_runs.run(comm, argv)
