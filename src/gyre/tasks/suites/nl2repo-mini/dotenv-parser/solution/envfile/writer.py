"""Writing dicts as .env text that ``parse`` reads back unchanged."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .interpolate import NAME_RE

_BARE_RE = re.compile(r"[A-Za-z0-9_./:@%+,=-]+\Z")
_DOUBLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(value: str) -> str:
    """The value as it appears after ``KEY=``."""
    if not isinstance(value, str):
        raise TypeError(f"values must be str, got {type(value).__name__}")
    if value == "" or _BARE_RE.match(value):
        return value
    if "'" not in value and "\r" not in value:
        return f"'{value}'"
    return '"' + "".join(_DOUBLE_ESCAPES.get(ch, ch) for ch in value) + '"'


def dumps(mapping: Mapping[str, str], *, export: bool = False) -> str:
    """Render ``mapping`` as .env text, one ``KEY=value`` line per item, in order."""
    out: list[str] = []
    for key, value in mapping.items():
        if not isinstance(key, str) or not NAME_RE.match(key):
            raise ValueError(f"invalid key: {key!r}")
        out.append(f"{'export ' if export else ''}{key}={quote(value)}\n")
    return "".join(out)


def dump(
    mapping: Mapping[str, str], path: str | os.PathLike, *, export: bool = False, encoding: str = "utf-8"
) -> None:
    """Write ``dumps(mapping)`` to ``path``."""
    with open(path, "w", encoding=encoding, newline="") as fh:
        fh.write(dumps(mapping, export=export))
