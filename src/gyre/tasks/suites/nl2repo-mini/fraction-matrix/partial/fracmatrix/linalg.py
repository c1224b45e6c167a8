"""Gaussian elimination helpers."""

from __future__ import annotations

from fractions import Fraction

from .errors import DimensionError, SingularMatrixError
from .matrix import Matrix


def rref(m):
    rows = m.tolist()
    nrows, ncols = len(rows), len(rows[0])
    pivots = []
    r = 0
    for c in range(ncols):
        if r == nrows:
            break
        p = next((i for i in range(r, nrows) if rows[i][c] != 0), None)
        if p is None:
            continue
        rows[r], rows[p] = rows[p], rows[r]
        pv = rows[r][c]
        rows[r] = [x / pv for x in rows[r]]
        for i in range(r + 1, nrows):  # TODO: also eliminate above the pivot
            f = rows[i][c]
            rows[i] = [a - f * b for a, b in zip(rows[i], rows[r])]
        pivots.append(c)
        r += 1
    return Matrix(rows), pivots


def rank(m):
    return len(rref(m)[1])


def determinant(m):
    if not m.is_square:
        raise DimensionError("determinant needs a square matrix")
    rows = m.tolist()
    n = len(rows)
    if n == 1:
        return rows[0][0]
    if n == 2:
        return rows[0][0] * rows[1][1] - rows[0][1] * rows[1][0]
    total = Fraction(0)
    for j in range(n):
        minor = Matrix([r[:j] + r[j + 1:] for r in rows[1:]])
        total += (-1) ** j * rows[0][j] * determinant(minor)
    return total


def inverse(m):
    raise NotImplementedError("inverse")
