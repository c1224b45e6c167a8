"""Compact human-readable number formats such as 1.2K and 3.4M."""

import math

_SUFFIXES = ["", "K", "M", "B", "T"]


def _format(value, precision):
    text = format(value, f".{precision}f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def compact(n, precision=1):
    """Format a number with a K/M/B/T suffix and at most `precision` decimals."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        raise TypeError(f"expected an int or float, got {type(n).__name__}")
    if isinstance(precision, bool) or not isinstance(precision, int):
        raise TypeError("precision must be an int")
    if precision < 0:
        raise ValueError("precision must be >= 0")
    if isinstance(n, float) and not math.isfinite(n):
        raise ValueError("cannot format a non-finite number")
    magnitude = abs(n)
    k = 0
    while k < len(_SUFFIXES) - 1 and magnitude >= 1000 ** (k + 1):
        k += 1
    text = _format(magnitude / 1000**k, precision)
    if float(text) >= 1000 and k < len(_SUFFIXES) - 1:
        k += 1
        text = _format(magnitude / 1000**k, precision)
    sign = "-" if n < 0 and text != "0" else ""
    return sign + text + _SUFFIXES[k]
