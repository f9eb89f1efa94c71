"""3 x 3 matrices as lists of Python floats (the barostat's cell algebra: exact, the same on
every rank, no tensors for nine numbers)."""
from __future__ import annotations


def det3(a) -> float:
    return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))


def inv3(a) -> list[list[float]]:
    """Inverse of a 3 x 3 matrix (lists of floats) by its adjugate."""
    d = det3(a)
    return [[(a[1][1] * a[2][2] - a[1][2] * a[2][1]) / d, (a[0][2] * a[2][1] - a[0][1] * a[2][2]) / d,
             (a[0][1] * a[1][2] - a[0][2] * a[1][1]) / d],
            [(a[1][2] * a[2][0] - a[1][0] * a[2][2]) / d, (a[0][0] * a[2][2] - a[0][2] * a[2][0]) / d,
             (a[0][2] * a[1][0] - a[0][0] * a[1][2]) / d],
            [(a[1][0] * a[2][1] - a[1][1] * a[2][0]) / d, (a[0][1] * a[2][0] - a[0][0] * a[2][1]) / d,
             (a[0][0] * a[1][1] - a[0][1] * a[1][0]) / d]]


def matmul3(a, b) -> list[list[float]]:
    """a b, each entry summed as ``sum`` would: ((0.0 + p0) + p1) + p2 (the same bits, -0.0 included),
    written out: the barostat and the list's check call it every step."""
    b0, b1, b2 = b
    return [[0.0 + r[0] * b0[j] + r[1] * b1[j] + r[2] * b2[j] for j in range(3)] for r in a]
