"""Topic validation and pattern matching.

Topics are dot-separated strings such as ``"orders.created"``.  Patterns may
use ``*`` (exactly one segment) and ``#`` (zero or more segments).
"""

from __future__ import annotations

from functools import lru_cache

from .errors import InvalidTopicError

SEPARATOR = "."
SINGLE = "*"
MULTI = "#"


def _segments(value, kind: str) -> list[str]:
    if not isinstance(value, str):
        raise InvalidTopicError(f"{kind} must be a str, got {type(value).__name__}")
    if value == "":
        raise InvalidTopicError(f"{kind} must not be empty")
    segments = value.split(SEPARATOR)
    if any(seg == "" for seg in segments):
        raise InvalidTopicError(f"{kind} {value!r} has an empty segment")
    return segments


def validate_topic(topic: str) -> str:
    """Return ``topic`` unchanged if it is a valid concrete topic."""
    for seg in _segments(topic, "topic"):
        if SINGLE in seg or MULTI in seg:
            raise InvalidTopicError(f"topic {topic!r} must not contain wildcards")
    return topic


def validate_pattern(pattern: str) -> str:
    """Return ``pattern`` unchanged if it is a valid subscription pattern."""
    for seg in _segments(pattern, "pattern"):
        if (SINGLE in seg or MULTI in seg) and seg not in (SINGLE, MULTI):
            raise InvalidTopicError(
                f"pattern {pattern!r}: a wildcard must be a whole segment"
            )
    return pattern


def is_wildcard(pattern: str) -> bool:
    """True if the (valid) pattern contains a ``*`` or ``#`` segment."""
    return any(seg in (SINGLE, MULTI) for seg in validate_pattern(pattern).split(SEPARATOR))


@lru_cache(maxsize=1024)
def _match(pattern: tuple[str, ...], topic: tuple[str, ...]) -> bool:
    m = len(topic)
    # reachable[j]: pattern prefix processed so far can consume topic[:j]
    reachable = [False] * (m + 1)
    reachable[0] = True
    for seg in pattern:
        nxt = [False] * (m + 1)
        if seg == MULTI:
            seen = False
            for j in range(m + 1):
                seen = seen or reachable[j]
                nxt[j] = seen
        else:
            for j in range(m):
                if reachable[j] and (seg == SINGLE or seg == topic[j]):
                    nxt[j + 1] = True
        reachable = nxt
    return reachable[m]


def topic_matches(pattern: str, topic: str) -> bool:
    """True if ``topic`` matches ``pattern``."""
    validate_pattern(pattern)
    validate_topic(topic)
    return _match(tuple(pattern.split(SEPARATOR)), tuple(topic.split(SEPARATOR)))
