"""``${VAR}`` and ``${VAR:-default}`` references."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from .errors import EnvSyntaxError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _scan(text: str) -> Iterator[tuple[str, str | None, str | None]]:
    """Yield (literal, name, default) pieces; name is None for the trailing literal."""
    pos = 0
    while True:
        start = text.find("${", pos)
        if start < 0:
            yield text[pos:], None, None
            return
        end = text.find("}", start + 2)
        if end < 0:
            raise EnvSyntaxError(f"unterminated variable reference in {text!r}")
        body = text[start + 2 : end]
        name, sep, default = body.partition(":-")
        if not NAME_RE.match(name):
            raise EnvSyntaxError(f"invalid variable name {name!r} in {text!r}")
        yield text[pos:start], name, default if sep else None
        pos = end + 1


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Replace every ``${NAME}`` / ``${NAME:-default}`` in ``text`` using ``variables``."""
    out: list[str] = []
    for literal, name, default in _scan(text):
        out.append(literal)
        if name is None:
            break
        value = variables.get(name)
        if default is not None and not value:
            value = default
        out.append(value or "")
    return "".join(out)


def references(text: str) -> list[str]:
    """The variable names ``text`` refers to, in order of first appearance, without duplicates."""
    names: list[str] = []
    for _, name, _ in _scan(text):
        if name is not None and name not in names:
            names.append(name)
    return names
