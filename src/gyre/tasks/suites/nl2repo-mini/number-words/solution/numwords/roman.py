"""Roman numerals in both directions with strict validation."""

import re

from .errors import OutOfRangeError, RomanNumeralError

_SYMBOLS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_CANONICAL = re.compile(r"M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")


def to_roman(n):
    """Convert 1..3999 to a canonical Roman numeral."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an int, got {type(n).__name__}")
    if not 1 <= n <= 3999:
        raise OutOfRangeError(f"{n} cannot be written as a Roman numeral")
    parts = []
    for value, symbol in _SYMBOLS:
        count, n = divmod(n, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text):
    """Convert a canonical upper-case Roman numeral to an int."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    if not text or not _CANONICAL.fullmatch(text):
        raise RomanNumeralError(f"{text!r} is not a valid Roman numeral")
    total = 0
    i = 0
    for value, symbol in _SYMBOLS:
        while text.startswith(symbol, i):
            total += value
            i += len(symbol)
    return total


def is_roman(text):
    """Return True when text is a valid canonical Roman numeral."""
    try:
        from_roman(text)
    except (RomanNumeralError, TypeError):
        return False
    return True
