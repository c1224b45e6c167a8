"""fracmatrix: exact matrix arithmetic over fractions.Fraction."""

from .errors import DimensionError, MatrixError, SingularMatrixError
from .linalg import determinant, inverse, rank, rref
from .matrix import Matrix, as_fraction
from .solve import INFINITE, NONE, UNIQUE, Solution, solve

__all__ = [
    "DimensionError",
    "INFINITE",
    "Matrix",
    "MatrixError",
    "NONE",
    "SingularMatrixError",
    "Solution",
    "UNIQUE",
    "as_fraction",
    "determinant",
    "inverse",
    "rank",
    "rref",
    "solve",
]
