"""The immutable Matrix type."""

from __future__ import annotations

from fractions import Fraction

from .errors import DimensionError


def as_fraction(value) -> Fraction:
    if isinstance(value, (int, Fraction, str)):
        return Fraction(value)
    raise TypeError(f"unsupported matrix entry type {type(value).__name__}")


class Matrix:
    def __init__(self, rows) -> None:
        rows = [tuple(as_fraction(x) for x in r) for r in rows]
        if not rows or not rows[0]:
            raise DimensionError("empty matrix")
        if any(len(r) != len(rows[0]) for r in rows):
            raise DimensionError("ragged rows")
        self._rows = tuple(rows)

    @classmethod
    def identity(cls, n):
        if n < 1:
            raise DimensionError("size must be at least 1")
        return cls([[1 if i == j else 0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, nrows, ncols):
        if nrows < 1 or ncols < 1:
            raise DimensionError("dimensions must be at least 1")
        return cls([[0] * ncols for _ in range(nrows)])

    @property
    def rows(self):
        return self._rows

    @property
    def shape(self):
        return (len(self._rows), len(self._rows[0]))

    @property
    def nrows(self):
        return len(self._rows)

    @property
    def ncols(self):
        return len(self._rows[0])

    @property
    def is_square(self):
        return self.nrows == self.ncols

    def row(self, i):
        return self._rows[i]

    def col(self, j):
        return tuple(r[j] for r in self._rows)

    def __getitem__(self, key):
        i, j = key
        return self._rows[i][j]

    def tolist(self):
        return [list(r) for r in self._rows]

    def __eq__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self):
        return hash(self._rows)

    def __add__(self, other):
        if self.shape != other.shape:
            raise DimensionError("shape mismatch")
        return Matrix([[a + b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __sub__(self, other):
        if self.shape != other.shape:
            raise DimensionError("shape mismatch")
        return Matrix([[a - b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __neg__(self):
        return Matrix([[-a for a in r] for r in self._rows])

    def __mul__(self, scalar):
        if not isinstance(scalar, (int, Fraction)):
            return NotImplemented
        return Matrix([[a * scalar for a in r] for r in self._rows])

    __rmul__ = __mul__

    def __truediv__(self, scalar):
        return Matrix([[a / scalar for a in r] for r in self._rows])

    def __matmul__(self, other):
        if self.ncols != other.nrows:
            raise DimensionError("shape mismatch")
        cols = list(zip(*other._rows))
        return Matrix([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self._rows])

    def __pow__(self, n):
        if not self.is_square:
            raise DimensionError("square matrices only")
        result = Matrix.identity(self.nrows)
        for _ in range(n):
            result = result @ self
        return result

    def transpose(self):
        return Matrix([list(c) for c in zip(*self._rows)])

    @property
    def T(self):
        return self.transpose()

    def det(self):
        from .linalg import determinant

        return determinant(self)

    def inverse(self):
        from .linalg import inverse

        return inverse(self)

    def rank(self):
        from .linalg import rank

        return rank(self)

    def rref(self):
        from .linalg import rref

        return rref(self)

    def solve(self, b):
        from .solve import solve

        return solve(self, b)

    def __repr__(self):
        return f"Matrix({[[str(x) for x in r] for r in self._rows]})"

    def __str__(self):
        return "\n".join("[" + " ".join(str(x) for x in r) + "]" for r in self._rows)
