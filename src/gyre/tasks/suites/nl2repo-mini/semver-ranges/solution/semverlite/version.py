"""Semantic versions: parsing, precedence and bumping (semver 2.0)."""

from __future__ import annotations

import functools
import re

from .errors import InvalidVersion

_NUM = r"0|[1-9]\d*"
_IDENT = r"[0-9A-Za-z-]+"
_VERSION_RE = re.compile(
    rf"^(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+(?P<build>{_IDENT}(?:\.{_IDENT})*))?$"
)
_IDENT_RE = re.compile(r"^[0-9A-Za-z-]+$")


def _pre_identifier(value: object) -> int | str:
    if isinstance(value, bool):
        raise InvalidVersion(f"invalid prerelease identifier: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidVersion(f"negative prerelease identifier: {value!r}")
        return value
    if not isinstance(value, str) or not _IDENT_RE.match(value):
        raise InvalidVersion(f"invalid prerelease identifier: {value!r}")
    if value.isdigit():
        if len(value) > 1 and value[0] == "0":
            raise InvalidVersion(f"numeric prerelease identifier with leading zero: {value!r}")
        return int(value)
    return value


def _build_identifier(value: object) -> str:
    if not isinstance(value, str) or not _IDENT_RE.match(value):
        raise InvalidVersion(f"invalid build identifier: {value!r}")
    return value


@functools.total_ordering
class Version:
    """An immutable semantic version ``MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]``."""

    __slots__ = ("major", "minor", "patch", "prerelease", "build")

    def __init__(self, major: int, minor: int = 0, patch: int = 0, prerelease=(), build=()) -> None:
        for name, part in (("major", major), ("minor", minor), ("patch", patch)):
            if isinstance(part, bool) or not isinstance(part, int) or part < 0:
                raise InvalidVersion(f"{name} must be a non-negative integer, got {part!r}")
        object.__setattr__(self, "major", major)
        object.__setattr__(self, "minor", minor)
        object.__setattr__(self, "patch", patch)
        object.__setattr__(self, "prerelease", tuple(_pre_identifier(p) for p in prerelease))
        object.__setattr__(self, "build", tuple(_build_identifier(b) for b in build))

    def __setattr__(self, name, value):
        raise AttributeError("Version is immutable")

    @classmethod
    def parse(cls, text: str) -> Version:
        if not isinstance(text, str):
            raise InvalidVersion(f"expected a string, got {type(text).__name__}")
        s = text.strip()
        if s[:1] in ("v", "="):
            s = s[1:]
        m = _VERSION_RE.match(s)
        if not m:
            raise InvalidVersion(f"invalid version: {text!r}")
        pre = m.group("pre")
        build = m.group("build")
        return cls(
            int(m.group("major")),
            int(m.group("minor")),
            int(m.group("patch")),
            pre.split(".") if pre else (),
            build.split(".") if build else (),
        )

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    @property
    def release(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def _key(self):
        if not self.prerelease:
            pre = (1,)
        else:
            # numeric identifiers sort before alphanumeric ones
            pre = (0, tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.prerelease))
        return (self.major, self.minor, self.patch, pre)

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self) -> str:
        s = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            s += "-" + ".".join(str(p) for p in self.prerelease)
        if self.build:
            s += "+" + ".".join(self.build)
        return s

    def __repr__(self) -> str:
        return f"Version('{self}')"

    def bump(self, part: str, tag: str | None = None) -> Version:
        """A new version with ``part`` incremented; build metadata is always dropped."""
        major, minor, patch, pre = self.major, self.minor, self.patch, self.prerelease
        if part == "major":
            if pre and minor == 0 and patch == 0:
                return Version(major, 0, 0)
            return Version(major + 1, 0, 0)
        if part == "minor":
            if pre and patch == 0:
                return Version(major, minor, 0)
            return Version(major, minor + 1, 0)
        if part == "patch":
            if pre:
                return Version(major, minor, patch)
            return Version(major, minor, patch + 1)
        if part == "prerelease":
            if not pre:
                return Version(major, minor, patch + 1, (tag, 0) if tag else (0,))
            if tag is not None and pre[0] != tag:
                return Version(major, minor, patch, (tag, 0))
            if isinstance(pre[-1], int):
                return Version(major, minor, patch, pre[:-1] + (pre[-1] + 1,))
            return Version(major, minor, patch, pre + (0,))
        raise ValueError(f"unknown version part: {part!r}")


def parse(text: str) -> Version:
    """Parse a version string; same as ``Version.parse``."""
    return Version.parse(text)


def _coerce(value) -> Version:
    return value if isinstance(value, Version) else Version.parse(value)


def compare(a, b) -> int:
    """-1, 0 or 1 as ``a`` has lower, equal or higher precedence than ``b``."""
    va, vb = _coerce(a), _coerce(b)
    return (va > vb) - (va < vb)
