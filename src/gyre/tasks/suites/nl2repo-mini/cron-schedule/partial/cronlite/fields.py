"""Parsing of the individual fields of a cron expression."""

from __future__ import annotations

from .errors import FieldError

FIELD_NAMES = ("minute", "hour", "day", "month", "weekday")

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")

# field -> (lowest, highest value '*' covers, highest value allowed, names)
_SPECS = {
    "minute": (0, 59, 59, {}),
    "hour": (0, 23, 23, {}),
    "day": (1, 31, 31, {}),
    "month": (1, 12, 12, {name: i + 1 for i, name in enumerate(_MONTHS)}),
    "weekday": (0, 6, 7, {name: i for i, name in enumerate(_DAYS)}),
}

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _value(token: str, field: str, text: str) -> int:
    lo, _, hi, names = _SPECS[field]
    # TODO: month / weekday names (JAN, MON, ...)
    if not token.isdigit() or not token.isascii():
        raise FieldError(field, text, f"{token!r} is not a number" + (" or a name" if names else ""))
    value = int(token)
    if not lo <= value <= hi:
        raise FieldError(field, text, f"{value} is out of range {lo}-{hi}")
    return value


def parse_field(text: str, field: str) -> tuple[int, ...]:
    """The sorted values one field matches; raises FieldError when ``text`` is invalid."""
    if field not in _SPECS:
        raise ValueError(f"unknown field: {field!r}")
    lo, star_hi, _, _ = _SPECS[field]
    if not isinstance(text, str) or not text:
        raise FieldError(field, str(text), "empty field")
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise FieldError(field, text, "empty list element")
        base, sep, step_text = item.partition("/")
        if sep:
            if not step_text.isdigit() or not step_text.isascii():
                raise FieldError(field, text, f"bad step {step_text!r}")
            step = int(step_text)
            if step == 0:
                raise FieldError(field, text, "step must be at least 1")
        else:
            step = 1
        if base == "*":
            start, end = lo, star_hi
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = _value(a, field, text), _value(b, field, text)
            if start > end:
                raise FieldError(field, text, f"range {base!r} runs backwards")
        else:
            start = end = _value(base, field, text)
        values.update(range(start, end + 1, step))
    return tuple(sorted(values))
