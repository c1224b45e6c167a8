"""Solving linear systems A x = b exactly."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .errors import DimensionError
from .linalg import _rref_rows
from .matrix import Matrix, as_fraction

UNIQUE = "unique"
NONE = "none"
INFINITE = "infinite"


@dataclass(frozen=True)
class Solution:
    kind: str
    values: tuple[Fraction, ...] | None
    free_variables: tuple[int, ...] = ()
    nullspace: tuple[tuple[Fraction, ...], ...] = ()

    @property
    def is_unique(self) -> bool:
        return self.kind == UNIQUE

    @property
    def has_solution(self) -> bool:
        return self.kind != NONE

    def general(self, *params) -> tuple[Fraction, ...]:
        """values + sum(params[k] * nullspace[k])."""
        if self.kind == NONE:
            raise ValueError("the system has no solution")
        if len(params) != len(self.free_variables):
            raise ValueError(
                f"expected {len(self.free_variables)} parameter(s), got {len(params)}"
            )
        result = list(self.values)
        for t, vec in zip(params, self.nullspace):
            t = as_fraction(t)
            result = [x + t * v for x, v in zip(result, vec)]
        return tuple(result)


def _rhs(b, m: int) -> list[Fraction]:
    if isinstance(b, Matrix):
        if b.ncols != 1:
            raise DimensionError("right-hand side matrix must have exactly one column")
        values = list(b.col(0))
    elif isinstance(b, (list, tuple)):
        values = [as_fraction(x) for x in b]
    else:
        raise TypeError("b must be a Matrix or a list/tuple of numbers")
    if len(values) != m:
        raise DimensionError(f"right-hand side has {len(values)} entries, expected {m}")
    return values


def solve(a: Matrix, b) -> Solution:
    if not isinstance(a, Matrix):
        raise TypeError("a must be a Matrix")
    m, n = a.shape
    rhs = _rhs(b, m)
    aug = [list(r) + [v] for r, v in zip(a.rows, rhs)]
    rows, pivots = _rref_rows(aug)
    if n in pivots:
        return Solution(NONE, None)
    values = [Fraction(0)] * n
    for k, pc in enumerate(pivots):
        values[pc] = rows[k][n]
    free = tuple(j for j in range(n) if j not in pivots)
    if not free:
        return Solution(UNIQUE, tuple(values))
    basis = []
    for f in free:
        vec = [Fraction(0)] * n
        vec[f] = Fraction(1)
        for k, pc in enumerate(pivots):
            vec[pc] = -rows[k][f]
        basis.append(tuple(vec))
    return Solution(INFINITE, tuple(values), free, tuple(basis))
