"""Exception types raised by fracmatrix."""


class MatrixError(Exception):
    """Base class of every exception raised by fracmatrix itself."""


class DimensionError(MatrixError, ValueError):
    """Shapes are invalid or incompatible for the requested operation."""


class SingularMatrixError(MatrixError, ArithmeticError):
    """The matrix has no inverse (its determinant is zero)."""
