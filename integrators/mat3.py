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
    return [[sum(a[i][k] * b[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
