from fractions import Fraction as F

import pytest

from fracmatrix.errors import DimensionError, MatrixError
from fracmatrix.matrix import Matrix, as_fraction


def test_construction_converts_entries():
    m = Matrix([[1, "1/2"], [F(3, 4), " -2 "]])
    assert m.rows == ((F(1), F(1, 2)), (F(3, 4), F(-2)))
    assert all(type(x) is F for row in m.rows for x in row)
    assert m.shape == (2, 2) and m.nrows == 2 and m.ncols == 2
    assert m.is_square


@pytest.mark.parametrize(
    "value, expected",
    [(3, F(3)), (F(2, 6), F(1, 3)), ("3/9", F(1, 3)), ("0.25", F(1, 4)), ("-7", F(-7))],
)
def test_as_fraction(value, expected):
    assert as_fraction(value) == expected
    assert type(as_fraction(value)) is F


@pytest.mark.parametrize("value, error", [(0.5, TypeError), (True, TypeError), (None, TypeError),
                                          ("abc", ValueError), ("1/0", ValueError)])
def test_as_fraction_rejects(value, error):
    with pytest.raises(error):
        as_fraction(value)
    with pytest.raises(error):
        Matrix([[value]])


@pytest.mark.parametrize("rows", [[], [[]], [[1, 2], [3]], [[1], [2, 3]], ()])
def test_bad_shapes_raise_dimension_error(rows):
    with pytest.raises(DimensionError):
        Matrix(rows)


def test_dimension_error_hierarchy():
    assert issubclass(DimensionError, MatrixError)
    assert issubclass(DimensionError, ValueError)


@pytest.mark.parametrize("rows", ["12", 5, [1, 2], [[1], "2"], None])
def test_bad_container_types(rows):
    with pytest.raises(TypeError):
        Matrix(rows)


def test_immutability_and_copy():
    source = [[1, 2], [3, 4]]
    m = Matrix(source)
    source[0][0] = 99
    assert m[0, 0] == 1
    with pytest.raises(TypeError):
        m[0, 0] = 5
    with pytest.raises(AttributeError):
        m.anything = 1
    with pytest.raises(AttributeError):
        m._rows = ()
    lst = m.tolist()
    lst[0][0] = 42
    assert m[0, 0] == 1 and lst == [[42, 2], [3, 4]]


def test_indexing_rows_and_columns():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m[1, 2] == 6 and m[-1, 0] == 4
    assert m.row(0) == (1, 2, 3)
    assert m.col(1) == (2, 5)
    with pytest.raises(IndexError):
        m[2, 0]
    with pytest.raises(IndexError):
        m.col(3)
    with pytest.raises(TypeError):
        m[0]


def test_equality_and_hash():
    a = Matrix([[1, "1/2"]])
    b = Matrix([[F(2, 2), F(1, 2)]])
    assert a == b and hash(a) == hash(b)
    assert a != Matrix([[1], ["1/2"]])
    assert a != [[1, F(1, 2)]]
    assert len({a, b}) == 1


def test_identity_and_zeros():
    assert Matrix.identity(2) == Matrix([[1, 0], [0, 1]])
    assert Matrix.zeros(2, 3) == Matrix([[0, 0, 0], [0, 0, 0]])
    with pytest.raises(DimensionError):
        Matrix.identity(0)
    with pytest.raises(DimensionError):
        Matrix.zeros(1, 0)


def test_add_sub_neg():
    a = Matrix([[1, 2], [3, 4]])
    b = Matrix([["1/2", 0], [0, "-1/3"]])
    assert a + b == Matrix([["3/2", 2], [3, "11/3"]])
    assert a - b == Matrix([["1/2", 2], [3, "13/3"]])
    assert -a == Matrix([[-1, -2], [-3, -4]])
    with pytest.raises(DimensionError):
        a + Matrix([[1, 2]])
    with pytest.raises(DimensionError):
        a - Matrix([[1], [2]])
    with pytest.raises(TypeError):
        a + 1


def test_scalar_multiplication_and_division():
    a = Matrix([[1, 2], [3, 4]])
    assert a * 2 == 2 * a == Matrix([[2, 4], [6, 8]])
    assert a * F(1, 2) == Matrix([["1/2", 1], ["3/2", 2]])
    assert a / 4 == Matrix([["1/4", "1/2"], ["3/4", 1]])
    with pytest.raises(ZeroDivisionError):
        a / 0
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError):
            a * bad
    with pytest.raises(TypeError):
        a * a


def test_matrix_multiplication():
    a = Matrix([[1, 2, 3], [4, 5, 6]])
    b = Matrix([[7, 8], [9, 10], [11, 12]])
    assert a @ b == Matrix([[58, 64], [139, 154]])
    assert (a @ b).shape == (2, 2) and (b @ a).shape == (3, 3)
    assert Matrix([["1/2"]]) @ Matrix([["2/3"]]) == Matrix([["1/3"]])
    with pytest.raises(DimensionError):
        a @ a


def test_power():
    m = Matrix([[1, 1], [1, 0]])
    assert m ** 0 == Matrix.identity(2)
    assert m ** 1 == m
    assert m ** 10 == Matrix([[89, 55], [55, 34]])
    with pytest.raises(DimensionError):
        Matrix([[1, 2]]) ** 2


def test_transpose():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.transpose() == Matrix([[1, 4], [2, 5], [3, 6]])
    assert m.T == m.transpose()
    assert m.T.T == m


def test_repr_round_trips():
    m = Matrix([[1, "1/2"], [0, -3]])
    assert repr(m) == "Matrix([[1, '1/2'], [0, -3]])"
    assert eval(repr(m), {"Matrix": Matrix}) == m
    assert repr(Matrix([["-2/4"]])) == "Matrix([['-1/2']])"


def test_str_aligns_columns():
    m = Matrix([[1, "1/2"], [0, -3]])
    assert str(m) == "[1 1/2]\n[0  -3]"
    m2 = Matrix([[10, "-1/12", 3], [2, 0, "5/7"]])
    assert str(m2) == "[10 -1/12   3]\n[ 2     0 5/7]"
    assert str(Matrix([[7]])) == "[7]"
