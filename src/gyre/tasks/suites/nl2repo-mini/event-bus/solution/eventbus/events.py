"""The Event value passed to middleware, filters and handlers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Event:
    topic: str
    payload: Any = None

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.topic.split("."))

    def with_topic(self, topic: str) -> "Event":
        return replace(self, topic=topic)

    def with_payload(self, payload: Any) -> "Event":
        return replace(self, payload=payload)
