from fractions import Fraction as F

import pytest

from fracmatrix.errors import DimensionError, MatrixError, SingularMatrixError
from fracmatrix.linalg import determinant, inverse, rank, rref
from fracmatrix.matrix import Matrix


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([[5]], F(5)),
        ([["1/2"]], F(1, 2)),
        ([[1, 2], [3, 4]], F(-2)),
        ([[0, 1], [1, 0]], F(-1)),
        ([[2, 0, 0], [0, 3, 0], [0, 0, "1/6"]], F(1)),
        ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], F(0)),
        ([[0, 2, 1], [3, 0, 1], [1, 1, 0]], F(5)),
        ([["1/2", "1/3"], ["1/4", "1/5"]], F(1, 60)),
    ],
)
def test_determinant(rows, expected):
    m = Matrix(rows)
    assert determinant(m) == expected
    assert type(determinant(m)) is F
    assert m.det() == expected


def test_determinant_requires_square():
    with pytest.raises(DimensionError):
        determinant(Matrix([[1, 2, 3]]))


def test_inverse():
    m = Matrix([[2, 1], [7, 4]])
    assert inverse(m) == Matrix([[4, -1], [-7, 2]])
    h = Matrix([[1, "1/2", "1/3"], ["1/2", "1/3", "1/4"], ["1/3", "1/4", "1/5"]])
    assert h.inverse() == Matrix([[9, -36, 30], [-36, 192, -180], [30, -180, 180]])
    assert h @ h.inverse() == Matrix.identity(3)
    assert inverse(Matrix([[0, 1], [1, 0]])) == Matrix([[0, 1], [1, 0]])


def test_inverse_of_singular_matrix():
    with pytest.raises(SingularMatrixError):
        inverse(Matrix([[1, 2], [2, 4]]))
    with pytest.raises(SingularMatrixError):
        Matrix([[0]]).inverse()
    assert issubclass(SingularMatrixError, MatrixError)
    assert issubclass(SingularMatrixError, ArithmeticError)


def test_inverse_requires_square():
    with pytest.raises(DimensionError):
        inverse(Matrix([[1, 2]]))


def test_negative_power_uses_inverse():
    m = Matrix([[2, 1], [7, 4]])
    assert m ** -1 == Matrix([[4, -1], [-7, 2]])
    assert m ** -2 == (m ** 2).inverse()
    with pytest.raises(SingularMatrixError):
        Matrix([[1, 1], [1, 1]]) ** -1


@pytest.mark.parametrize(
    "rows, expected_rref, pivots",
    [
        ([[1, 2], [3, 4]], [[1, 0], [0, 1]], (0, 1)),
        ([[0, 0], [0, 0]], [[0, 0], [0, 0]], ()),
        ([[2, 4, 6], [1, 2, 4]], [[1, 2, 0], [0, 0, 1]], (0, 2)),
        ([[0, 3, -6], [0, 1, -2], [0, 0, 0]], [[0, 1, -2], [0, 0, 0], [0, 0, 0]], (1,)),
        ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[1, 0, -1], [0, 1, 2], [0, 0, 0]], (0, 1)),
        ([[2], [4]], [[1], [0]], (0,)),
        ([[3, 1]], [[1, "1/3"]], (0,)),
    ],
)
def test_rref(rows, expected_rref, pivots):
    m = Matrix(rows)
    reduced, piv = rref(m)
    assert reduced == Matrix(expected_rref)
    assert piv == pivots
    assert isinstance(piv, tuple)
    assert m.rref() == (reduced, piv)
    assert m == Matrix(rows)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([[1, 2], [3, 4]], 2),
        ([[1, 2], [2, 4]], 1),
        ([[0, 0, 0]], 0),
        ([[1, 2, 3], [4, 5, 6], [7, 8, 9]], 2),
        ([[1, 0], [0, 1], [1, 1]], 2),
    ],
)
def test_rank(rows, expected):
    assert rank(Matrix(rows)) == expected
    assert Matrix(rows).rank() == expected


def test_functions_require_matrix():
    for fn in (determinant, inverse, rank, rref):
        with pytest.raises(TypeError):
            fn([[1, 2], [3, 4]])
