"""Exact Gaussian elimination: determinant, inverse, rank, RREF."""

from __future__ import annotations

from fractions import Fraction

from .errors import DimensionError, SingularMatrixError
from .matrix import Matrix


def _require_matrix(m) -> None:
    if not isinstance(m, Matrix):
        raise TypeError(f"expected a Matrix, got {type(m).__name__}")


def _require_square(m: Matrix, what: str) -> None:
    _require_matrix(m)
    if not m.is_square:
        raise DimensionError(f"{what} needs a square matrix, got shape {m.shape}")


def _rref_rows(rows: list[list[Fraction]]) -> tuple[list[list[Fraction]], tuple[int, ...]]:
    nrows, ncols = len(rows), len(rows[0])
    pivots: list[int] = []
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
        for i in range(nrows):
            if i != r and rows[i][c] != 0:
                f = rows[i][c]
                rows[i] = [a - f * b for a, b in zip(rows[i], rows[r])]
        pivots.append(c)
        r += 1
    return rows, tuple(pivots)


def rref(m: Matrix) -> tuple[Matrix, tuple[int, ...]]:
    """Return (reduced row echelon form, pivot column indices)."""
    _require_matrix(m)
    rows, pivots = _rref_rows(m.tolist())
    return Matrix(rows), pivots


def rank(m: Matrix) -> int:
    return len(rref(m)[1])


def determinant(m: Matrix) -> Fraction:
    _require_square(m, "determinant")
    rows = m.tolist()
    n = len(rows)
    det = Fraction(1)
    for c in range(n):
        p = next((i for i in range(c, n) if rows[i][c] != 0), None)
        if p is None:
            return Fraction(0)
        if p != c:
            rows[c], rows[p] = rows[p], rows[c]
            det = -det
        pv = rows[c][c]
        det *= pv
        for i in range(c + 1, n):
            if rows[i][c] != 0:
                f = rows[i][c] / pv
                rows[i] = [a - f * b for a, b in zip(rows[i], rows[c])]
    return det


def inverse(m: Matrix) -> Matrix:
    _require_square(m, "inverse")
    n = m.nrows
    aug = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(m.rows)]
    rows, pivots = _rref_rows(aug)
    if pivots[:n] != tuple(range(n)):
        raise SingularMatrixError("matrix is singular")
    return Matrix([r[n:] for r in rows])
