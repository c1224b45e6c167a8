"""npm-style version ranges: comparators, x-ranges, ~, ^, hyphen ranges and ``||``."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .errors import InvalidRange, InvalidVersion
from .version import Version

_OPS = ("<=", ">=", "<", ">", "=")
_WILD = ("x", "X", "*")
_PART = r"(?:0|[1-9]\d*|[xX*])"
_PARTIAL_RE = re.compile(
    rf"^v?(?P<a>{_PART})(?:\.(?P<b>{_PART})(?:\.(?P<c>{_PART})"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?)?)?$"
)
# a version that nothing is below: "<0.0.0-0" matches no version at all
_NOTHING = ("<", Version(0, 0, 0, (0,)))


class Comparator:
    """One primitive comparison such as ``>=1.2.3``."""

    __slots__ = ("operator", "version")

    def __init__(self, operator: str, version: Version) -> None:
        if operator not in _OPS:
            raise InvalidRange(f"unknown operator: {operator!r}")
        self.operator = operator
        self.version = version

    def test(self, version: Version) -> bool:
        op, v = self.operator, self.version
        if op == "=":
            return version == v
        if op == "<":
            return version < v
        if op == "<=":
            return version <= v
        if op == ">":
            return version > v
        return version >= v

    def __str__(self) -> str:
        return f"{self.operator}{self.version}"

    def __repr__(self) -> str:
        return f"Comparator('{self}')"

    def __eq__(self, other):
        if not isinstance(other, Comparator):
            return NotImplemented
        return self.operator == other.operator and self.version == other.version

    def __hash__(self):
        return hash((self.operator, self.version))


class _Partial:
    """A possibly incomplete version: missing or wildcard parts are None."""

    def __init__(self, text: str, where: str) -> None:
        m = _PARTIAL_RE.match(text)
        if not m:
            raise InvalidRange(f"invalid version {text!r} in range {where!r}")
        parts = []
        wild = False
        for g in ("a", "b", "c"):
            p = m.group(g)
            if p is None or p in _WILD:
                wild = True
            parts.append(None if wild else int(p))
        self.major, self.minor, self.patch = parts
        self.pre = tuple(m.group("pre").split(".")) if m.group("pre") else ()
        if self.pre and self.patch is None:
            raise InvalidRange(f"prerelease on a partial version in {where!r}")

    @property
    def full(self) -> bool:
        return self.patch is not None

    def floor(self) -> Version:
        return Version(self.major or 0, self.minor or 0, self.patch or 0, self.pre)

    def ceiling(self) -> Version:
        """The first version above every version this partial covers (partial only)."""
        if self.minor is None:
            return Version(self.major + 1, 0, 0)
        return Version(self.major, self.minor + 1, 0)


def _primitive(op: str, p: _Partial) -> list[tuple[str, Version]]:
    if op == "":
        op = "="
    if p.major is None:
        return [_NOTHING] if op in ("<", ">") else []
    if p.full:
        return [(op, p.floor())]
    if op == "=":
        return [(">=", p.floor()), ("<", p.ceiling())]
    if op == ">":
        return [(">=", p.ceiling())]
    if op == ">=":
        return [(">=", p.floor())]
    if op == "<":
        return [("<", p.floor())]
    return [("<", p.ceiling())]  # "<="


def _tilde(p: _Partial) -> list[tuple[str, Version]]:
    if p.major is None:
        return []
    if p.minor is None:
        return [(">=", p.floor()), ("<", Version(p.major + 1, 0, 0))]
    return [(">=", p.floor()), ("<", Version(p.major, p.minor + 1, 0))]


def _caret(p: _Partial) -> list[tuple[str, Version]]:
    if p.major is None:
        return []
    low = (">=", p.floor())
    if p.major > 0 or p.minor is None:
        return [low, ("<", Version(p.major + 1, 0, 0))]
    if p.minor > 0 or p.patch is None:
        return [low, ("<", Version(0, p.minor + 1, 0))]
    return [low, ("<", Version(0, 0, p.patch + 1))]


def _parse_set(text: str, where: str) -> list[Comparator]:
    tokens = text.split()
    # TODO: hyphen ranges ("1.2.3 - 2.3.4")
    # glue a lone operator to the version that follows it: "> 1.2.3" -> ">1.2.3"
    glued: list[str] = []
    pending = ""
    for tok in tokens:
        if tok in _OPS or tok in ("~", "^"):
            if pending:
                raise InvalidRange(f"operator without a version in {where!r}")
            pending = tok
            continue
        glued.append(pending + tok)
        pending = ""
    if pending:
        raise InvalidRange(f"operator without a version in {where!r}")
    result: list[tuple[str, Version]] = []
    for tok in glued:
        if tok[0] == "~":
            result += _tilde(_Partial(tok[1:], where))
        elif tok[0] == "^":
            result += _caret(_Partial(tok[1:], where))
        else:
            op = next((o for o in _OPS if tok.startswith(o)), "")
            result += _primitive(op, _Partial(tok[len(op):], where))
    return [Comparator(op, v) for op, v in result]


class Range:
    """A parsed range: a union (``||``) of comparator sets that must all hold."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise InvalidRange(f"expected a string, got {type(text).__name__}")
        self.raw = text
        self.sets: list[list[Comparator]] = [_parse_set(part, text) for part in text.split("||")]

    def test(self, version) -> bool:
        if not isinstance(version, Version):
            try:
                version = Version.parse(version)
            except InvalidVersion:
                return False
        return any(_set_matches(s, version) for s in self.sets)

    def __contains__(self, version) -> bool:
        return self.test(version)

    def __str__(self) -> str:
        return " || ".join(" ".join(str(c) for c in s) if s else "*" for s in self.sets)

    def __repr__(self) -> str:
        return f"Range('{self}')"


def _set_matches(comparators: list[Comparator], version: Version) -> bool:
    # TODO: npm's prerelease rule
    return all(c.test(version) for c in comparators)


def _as_range(range_) -> Range:
    return range_ if isinstance(range_, Range) else Range(range_)


def satisfies(version, range_) -> bool:
    """Whether ``version`` (str or Version) is in ``range_`` (str or Range)."""
    return _as_range(range_).test(version)


def _candidates(versions: Iterable, range_):
    r = _as_range(range_)
    for item in versions:
        try:
            v = item if isinstance(item, Version) else Version.parse(item)
        except InvalidVersion:
            continue
        if r.test(v):
            yield v, item


def max_satisfying(versions: Iterable, range_):
    """The highest item of ``versions`` in the range (as given), or None."""
    best = None
    for v, item in _candidates(versions, range_):
        if best is None or v > best[0]:
            best = (v, item)
    return None if best is None else best[1]


def min_satisfying(versions: Iterable, range_):
    """The lowest item of ``versions`` in the range (as given), or None."""
    raise NotImplementedError
