"""Roman numerals in both directions with strict validation."""

from .errors import OutOfRangeError, RomanNumeralError  # noqa: F401


def to_roman(n):
    raise NotImplementedError


def from_roman(text):
    raise NotImplementedError


def is_roman(text):
    raise NotImplementedError
