"""Parsing .env text into a dict."""

from __future__ import annotations

import os
import re
from collections import ChainMap
from collections.abc import Mapping

from .errors import EnvSyntaxError
from .interpolate import NAME_RE, expand

_EXPORT_RE = re.compile(r"export[ \t]+")
_AFTER_QUOTE_RE = re.compile(r"[ \t]*(#.*)?\Z")
_COMMENT_RE = re.compile(r"[ \t]#")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


class _Lines:
    def __init__(self, text: str) -> None:
        self.lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.index = 0

    def next(self) -> str | None:
        if self.index >= len(self.lines):
            return None
        self.index += 1
        return self.lines[self.index - 1]


def _single(rest: str, lines: _Lines, lineno: int) -> tuple[str, str]:
    """``rest`` starts after the opening quote; returns (value, text after closing quote)."""
    parts: list[str] = []
    while True:
        end = rest.find("'")
        if end >= 0:
            parts.append(rest[:end])
            return "\n".join(parts), rest[end + 1 :]
        parts.append(rest)
        rest = lines.next()
        if rest is None:
            raise EnvSyntaxError("unterminated single-quoted value", lineno)


def _double(rest: str, lines: _Lines, lineno: int) -> tuple[list[tuple[str, bool]], str]:
    """Returns ([(text, expandable), ...], text after closing quote)."""
    segments: list[tuple[str, bool]] = []
    chunk: list[str] = []
    while True:
        i = 0
        while i < len(rest):
            ch = rest[i]
            if ch == '"':
                segments.append(("".join(chunk), True))
                return segments, rest[i + 1 :]
            if ch == "\\" and i + 1 < len(rest) and rest[i + 1] in _ESCAPES:
                segments.append(("".join(chunk), True))
                chunk = []
                segments.append((_ESCAPES[rest[i + 1]], False))
                i += 2
                continue
            chunk.append(ch)
            i += 1
        nxt = lines.next()
        if nxt is None:
            raise EnvSyntaxError("unterminated double-quoted value", lineno)
        chunk.append("\n")
        rest = nxt


def parse(text: str, environ: Mapping[str, str] | None = None, *, interpolate: bool = True) -> dict[str, str]:
    """Parse .env ``text``; references are resolved from earlier keys, then from ``environ``."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    result: dict[str, str] = {}
    lookup = ChainMap(result, dict(environ or {}))
    lines = _Lines(text)
    while (line := lines.next()) is not None:
        lineno = lines.index
        body = line.lstrip()  # keep trailing blanks: they may be inside a quoted value
        if not body.strip() or body.startswith("#"):
            continue
        m = _EXPORT_RE.match(body)
        if m:
            body = body[m.end() :]
        key, eq, raw = body.partition("=")
        if not eq:
            raise EnvSyntaxError(f"expected KEY=VALUE, got {line.strip()!r}", lineno)
        key = key.strip()
        if not NAME_RE.match(key):
            raise EnvSyntaxError(f"invalid key {key!r}", lineno)
        value_text = raw.lstrip(" \t")
        try:
            if value_text.startswith("'"):
                value, after = _single(value_text[1:], lines, lineno)
            elif value_text.startswith('"'):
                segments, after = _double(value_text[1:], lines, lineno)
                value = "".join(expand(s, lookup) if (interpolate and ok) else s for s, ok in segments)
            else:
                cut = _COMMENT_RE.search(raw)
                value = (raw[: cut.start()] if cut else raw).strip(" \t")
                after = ""
                if interpolate:
                    value = expand(value, lookup)
        except EnvSyntaxError as e:
            if e.lineno is not None:
                raise
            raise EnvSyntaxError(e.msg, lineno) from None
        if not _AFTER_QUOTE_RE.match(after):
            raise EnvSyntaxError(f"unexpected text after closing quote: {after.strip()!r}", lineno)
        result[key] = value
    return result


def load(
    path: str | os.PathLike,
    environ: Mapping[str, str] | None = None,
    *,
    interpolate: bool = True,
    encoding: str = "utf-8",
) -> dict[str, str]:
    """Read and parse the .env file at ``path``."""
    with open(path, encoding=encoding, newline="") as fh:
        return parse(fh.read(), environ, interpolate=interpolate)
