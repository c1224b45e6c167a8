"""semverlite: semantic versions (semver 2.0) and npm-style version ranges."""

from .errors import InvalidRange, InvalidVersion, SemverError
from .ranges import Comparator, Range, max_satisfying, min_satisfying, satisfies
from .version import Version, compare, parse

__all__ = [
    "Comparator",
    "InvalidRange",
    "InvalidVersion",
    "Range",
    "SemverError",
    "Version",
    "compare",
    "max_satisfying",
    "min_satisfying",
    "parse",
    "satisfies",
]
