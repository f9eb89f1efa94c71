"""The engine's lattice builder (engine/run/system.py) against ASE's ``bulk``, bit for bit: the
cubic cells are built without importing ase.build (which imports scipy)."""
import numpy as np
import pytest
from ase.build import bulk

from shardmd.engine.run.builders import build_atoms
from shardmd.engine.run.structure import CUBIC_CELLS, unit_cell


@pytest.mark.parametrize("lattice", sorted(CUBIC_CELLS))
@pytest.mark.parametrize("element, a", [("Cu", 3.61), ("Ar", 5.26), ("Si", 5.431), ("Fe", 2.8665), ("Cu", 3.59)])
def test_cubic_cells_equal_ase_bulk(lattice, element, a):
    ours, ase = unit_cell(lattice, element, a), bulk(element, lattice, a=a, cubic=True)
    assert np.array_equal(ours.positions, ase.positions)
    assert np.array_equal(ours.cell.array, ase.cell.array)
    assert np.array_equal(ours.numbers, ase.numbers)
    big = build_atoms({"lattice": lattice, "element": element, "a": a, "repeat": [3, 2, 4], "pbc": [1, 1, 1]})
    ref = ase.repeat((3, 2, 4))
    assert np.array_equal(big.positions, ref.positions) and np.array_equal(big.cell.array, ref.cell.array)


def test_hcp_is_ases_orthorhombic_cell():
    ours = unit_cell("hcp", "Mg", 3.21)
    ase = bulk("Mg", "hcp", a=3.21, orthorhombic=True)
    assert np.array_equal(ours.positions, ase.positions) and len(ours) == 4


def test_a_default_run_imports_no_scipy(tmp_path):
    """The default system of a run (fcc) is built without ase.build and so without scipy."""
    import subprocess
    import sys

    code = ("import sys\nfrom shardmd.engine.run.builders import build_atoms\n"
            "build_atoms({'lattice': 'fcc', 'element': 'Ar', 'a': 5.26, 'repeat': [2, 2, 2], 'pbc': [1, 1, 1]})\n"
            "print('scipy' in sys.modules, 'ase.build' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr
