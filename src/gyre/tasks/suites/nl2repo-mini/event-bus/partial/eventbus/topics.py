"""Topic validation and pattern matching."""

from __future__ import annotations

from .errors import InvalidTopicError


def validate_topic(topic: str) -> str:
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError(f"invalid topic {topic!r}")
    for seg in topic.split("."):
        if not seg or "*" in seg or "#" in seg:
            raise InvalidTopicError(f"invalid topic {topic!r}")
    return topic


def validate_pattern(pattern: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise InvalidTopicError(f"invalid pattern {pattern!r}")
    for seg in pattern.split("."):
        if not seg:
            raise InvalidTopicError(f"invalid pattern {pattern!r}")
    return pattern


def is_wildcard(pattern: str) -> bool:
    return "*" in pattern or "#" in pattern


def _match(pattern: list[str], topic: list[str]) -> bool:
    if not pattern:
        return not topic
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        # TODO: can '#' match zero segments? assume it needs at least one for now
        return any(_match(rest, topic[i:]) for i in range(1, len(topic) + 1))
    if not topic:
        return False
    if head == "*" or head == topic[0]:
        return _match(rest, topic[1:])
    return False


def topic_matches(pattern: str, topic: str) -> bool:
    return _match(pattern.split("."), topic.split("."))
