"""The immutable Matrix type."""

from __future__ import annotations

from fractions import Fraction

from .errors import DimensionError


def as_fraction(value) -> Fraction:
    """Convert an int, Fraction or numeric string to a Fraction."""
    if isinstance(value, bool):
        raise TypeError("bool is not a valid matrix entry")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, str):
        try:
            return Fraction(value)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"invalid fraction literal {value!r}") from None
    raise TypeError(f"unsupported matrix entry type {type(value).__name__}")


def _is_scalar(value) -> bool:
    return isinstance(value, (int, Fraction)) and not isinstance(value, bool)


def _fmt_repr(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"'{x}'"


class Matrix:
    """An immutable matrix of fractions.Fraction entries."""

    __slots__ = ("_rows",)

    def __init__(self, rows) -> None:
        if not isinstance(rows, (list, tuple)):
            raise TypeError("rows must be a list or tuple of rows")
        converted = []
        for row in rows:
            if not isinstance(row, (list, tuple)):
                raise TypeError("each row must be a list or tuple")
            converted.append(tuple(as_fraction(x) for x in row))
        if not converted:
            raise DimensionError("a matrix needs at least one row")
        ncols = len(converted[0])
        if ncols == 0:
            raise DimensionError("a matrix needs at least one column")
        if any(len(r) != ncols for r in converted):
            raise DimensionError("all rows must have the same length")
        object.__setattr__(self, "_rows", tuple(converted))

    # -- immutability ----------------------------------------------------
    def __setattr__(self, name, value):
        raise AttributeError("Matrix is immutable")

    def __delattr__(self, name):
        raise AttributeError("Matrix is immutable")

    # -- constructors ----------------------------------------------------
    @classmethod
    def identity(cls, n: int) -> "Matrix":
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError("n must be an int")
        if n < 1:
            raise DimensionError("size must be at least 1")
        return cls([[1 if i == j else 0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, nrows: int, ncols: int) -> "Matrix":
        for v in (nrows, ncols):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError("dimensions must be ints")
        if nrows < 1 or ncols < 1:
            raise DimensionError("dimensions must be at least 1")
        return cls([[0] * ncols for _ in range(nrows)])

    # -- access ----------------------------------------------------------
    @property
    def rows(self) -> tuple[tuple[Fraction, ...], ...]:
        return self._rows

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self._rows), len(self._rows[0]))

    @property
    def nrows(self) -> int:
        return len(self._rows)

    @property
    def ncols(self) -> int:
        return len(self._rows[0])

    @property
    def is_square(self) -> bool:
        return self.nrows == self.ncols

    def row(self, i: int) -> tuple[Fraction, ...]:
        return self._rows[i]

    def col(self, j: int) -> tuple[Fraction, ...]:
        self._rows[0][j]  # IndexError for a bad column
        return tuple(r[j] for r in self._rows)

    def __getitem__(self, key) -> Fraction:
        if not (isinstance(key, tuple) and len(key) == 2):
            raise TypeError("index a matrix with m[i, j]")
        i, j = key
        return self._rows[i][j]

    def tolist(self) -> list[list[Fraction]]:
        return [list(r) for r in self._rows]

    # -- comparison ------------------------------------------------------
    def __eq__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self) -> int:
        return hash(self._rows)

    # -- arithmetic ------------------------------------------------------
    def _same_shape(self, other: "Matrix", op: str) -> None:
        if self.shape != other.shape:
            raise DimensionError(f"cannot {op} {self.shape} and {other.shape} matrices")

    def __add__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        self._same_shape(other, "add")
        return Matrix([[a + b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __sub__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        self._same_shape(other, "subtract")
        return Matrix([[a - b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __neg__(self):
        return Matrix([[-a for a in r] for r in self._rows])

    def __mul__(self, scalar):
        if not _is_scalar(scalar):
            return NotImplemented
        return Matrix([[a * scalar for a in r] for r in self._rows])

    __rmul__ = __mul__

    def __truediv__(self, scalar):
        if not _is_scalar(scalar):
            return NotImplemented
        if scalar == 0:
            raise ZeroDivisionError("matrix division by zero")
        return Matrix([[a / scalar for a in r] for r in self._rows])

    def __matmul__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        if self.ncols != other.nrows:
            raise DimensionError(f"cannot multiply {self.shape} by {other.shape}")
        cols = other.transpose()._rows
        return Matrix([[sum((a * b for a, b in zip(r, c)), Fraction(0)) for c in cols] for r in self._rows])

    def __pow__(self, exponent):
        if isinstance(exponent, bool) or not isinstance(exponent, int):
            return NotImplemented
        if not self.is_square:
            raise DimensionError("only square matrices can be raised to a power")
        base = self
        if exponent < 0:
            base = self.inverse()
            exponent = -exponent
        result = Matrix.identity(self.nrows)
        while exponent:
            if exponent & 1:
                result = result @ base
            base = base @ base
            exponent >>= 1
        return result

    def transpose(self) -> "Matrix":
        return Matrix([list(c) for c in zip(*self._rows)])

    @property
    def T(self) -> "Matrix":
        return self.transpose()

    # -- linear algebra (see fracmatrix.linalg / fracmatrix.solve) --------
    def det(self) -> Fraction:
        from .linalg import determinant

        return determinant(self)

    def inverse(self) -> "Matrix":
        from .linalg import inverse

        return inverse(self)

    def rank(self) -> int:
        from .linalg import rank

        return rank(self)

    def rref(self):
        from .linalg import rref

        return rref(self)

    def solve(self, b):
        from .solve import solve

        return solve(self, b)

    # -- text --------------------------------------------------------------
    def __repr__(self) -> str:
        body = ", ".join("[" + ", ".join(_fmt_repr(x) for x in r) + "]" for r in self._rows)
        return f"Matrix([{body}])"

    def __str__(self) -> str:
        cells = [[str(x) for x in r] for r in self._rows]
        widths = [max(len(c[j]) for c in cells) for j in range(self.ncols)]
        return "\n".join(
            "[" + " ".join(c.rjust(w) for c, w in zip(r, widths)) + "]" for r in cells
        )
