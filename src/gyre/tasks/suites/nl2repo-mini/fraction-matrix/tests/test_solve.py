from fractions import Fraction as F

import pytest

from fracmatrix.errors import DimensionError
from fracmatrix.matrix import Matrix
from fracmatrix.solve import INFINITE, NONE, UNIQUE, Solution, solve


def test_kind_constants():
    assert (UNIQUE, NONE, INFINITE) == ("unique", "none", "infinite")


def test_unique_solution():
    a = Matrix([[2, 1], [1, 3]])
    sol = solve(a, [3, 5])
    assert sol.kind == "unique"
    assert sol.values == (F(4, 5), F(7, 5))
    assert all(type(v) is F for v in sol.values)
    assert sol.free_variables == () and sol.nullspace == ()
    assert sol.is_unique and sol.has_solution
    assert sol == Solution("unique", (F(4, 5), F(7, 5)))


def test_rhs_as_column_matrix_and_method():
    a = Matrix([[1, 1, 1], [0, 2, 5], [2, 5, -1]])
    b = Matrix([[6], [-4], [27]])
    sol = solve(a, b)
    assert sol.values == (5, 3, -2)
    assert a.solve(b) == sol
    assert a.solve([6, "-4", 27]) == sol


def test_no_solution():
    sol = solve(Matrix([[1, 1], [2, 2]]), [1, 3])
    assert sol.kind == "none"
    assert sol.values is None
    assert sol.free_variables == () and sol.nullspace == ()
    assert not sol.has_solution and not sol.is_unique
    with pytest.raises(ValueError):
        sol.general()


def test_infinite_solutions():
    a = Matrix([[1, 2, 1], [2, 4, 0]])
    sol = solve(a, [4, 6])
    assert sol.kind == "infinite"
    assert sol.values == (3, 0, 1)
    assert sol.free_variables == (1,)
    assert sol.nullspace == ((-2, 1, 0),)
    assert sol.has_solution and not sol.is_unique
    x = sol.general(5)
    assert x == (-7, 5, 1)
    assert a @ Matrix([[v] for v in x]) == Matrix([[4], [6]])
    with pytest.raises(ValueError):
        sol.general()


def test_underdetermined_with_two_free_variables():
    sol = solve(Matrix([[1, 1, 1]]), ["1/2"])
    assert sol.kind == "infinite"
    assert sol.values == (F(1, 2), 0, 0)
    assert sol.free_variables == (1, 2)
    assert sol.nullspace == ((-1, 1, 0), (-1, 0, 1))
    assert sol.general(1, "1/2") == (F(-1), F(1), F(1, 2))


def test_general_of_unique_solution():
    sol = solve(Matrix([[1, 0], [0, 2]]), [1, 1])
    assert sol.general() == (1, F(1, 2))
    with pytest.raises(ValueError):
        sol.general(1)


def test_overdetermined_consistent_and_inconsistent():
    a = Matrix([[1, 0], [0, 1], [1, 1]])
    assert solve(a, [1, 2, 3]).values == (1, 2)
    assert solve(a, [1, 2, 4]).kind == "none"


def test_homogeneous_singular_system():
    sol = solve(Matrix([[1, 2], [2, 4]]), [0, 0])
    assert sol.kind == "infinite"
    assert sol.values == (0, 0)
    assert sol.nullspace == ((-2, 1),)


def test_zero_matrix():
    assert solve(Matrix([[0, 0]]), [0]).free_variables == (0, 1)
    assert solve(Matrix([[0, 0]]), [1]).kind == "none"


@pytest.mark.parametrize(
    "b",
    [[1, 2, 3], [1], Matrix([[1, 2], [3, 4]]), Matrix([[1], [2], [3]]), Matrix([[1, 2]])],
)
def test_rhs_dimension_errors(b):
    with pytest.raises(DimensionError):
        solve(Matrix([[1, 0], [0, 1]]), b)


def test_type_errors():
    with pytest.raises(TypeError):
        solve([[1, 0], [0, 1]], [1, 2])
    with pytest.raises(TypeError):
        solve(Matrix([[1, 0], [0, 1]]), "12")
    with pytest.raises(TypeError):
        solve(Matrix([[1, 0], [0, 1]]), [1.0, 2])


def test_solution_is_frozen():
    sol = solve(Matrix([[1]]), [2])
    with pytest.raises(AttributeError):
        sol.kind = "none"
