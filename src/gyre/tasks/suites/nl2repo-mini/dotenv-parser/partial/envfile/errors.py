"""Exception types raised by envfile."""

from __future__ import annotations


class EnvSyntaxError(ValueError):
    """Malformed .env text or a malformed ``${...}`` reference."""

    def __init__(self, msg: str, lineno: int | None = None) -> None:
        super().__init__(f"line {lineno}: {msg}" if lineno is not None else msg)
        self.msg = msg
        self.lineno = lineno
