"""Solving linear systems (unfinished)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

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
    def is_unique(self):
        return self.kind == UNIQUE

    @property
    def has_solution(self):
        return self.kind != NONE


def solve(a, b):
    raise NotImplementedError("solve")
