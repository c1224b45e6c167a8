"""Compact human-readable number formats such as 1.2K and 3.4M."""

_SUFFIXES = ["", "K", "M", "B", "T"]


def compact(n, precision=1):
    if not isinstance(n, (int, float)):
        raise TypeError("expected a number")
    if precision < 0:
        raise ValueError("precision must be >= 0")
    magnitude = abs(n)
    k = 0
    while k < len(_SUFFIXES) - 1 and magnitude >= 1000 ** (k + 1):
        k += 1
    text = f"{magnitude / 1000**k:.{precision}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    sign = "-" if n < 0 else ""
    return sign + text + _SUFFIXES[k]
