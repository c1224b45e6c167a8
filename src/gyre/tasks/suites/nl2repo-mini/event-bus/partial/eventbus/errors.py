"""Exception types raised by eventbus."""

from __future__ import annotations


class EventBusError(Exception):
    """Base class of every exception raised by eventbus itself."""


class InvalidTopicError(EventBusError, ValueError):
    """A topic or pattern is not well formed."""


class PublishError(EventBusError):
    """One or more handlers failed while publishing under the "collect" policy."""

    def __init__(self, topic: str, errors) -> None:
        self.topic = topic
        self.errors = list(errors)
        super().__init__(
            f"{len(self.errors)} handler(s) failed while publishing {topic!r}"
        )

    @property
    def exceptions(self) -> list:
        return [exc for _, exc in self.errors]
