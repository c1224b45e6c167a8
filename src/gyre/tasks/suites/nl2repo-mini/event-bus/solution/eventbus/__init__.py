"""eventbus: a synchronous publish/subscribe bus with topic patterns."""

from .bus import ERROR_POLICIES, EventBus, Subscription
from .errors import EventBusError, InvalidTopicError, PublishError
from .events import Event
from .middleware import (
    compose,
    filter_middleware,
    tap_middleware,
    transform_middleware,
)
from .topics import is_wildcard, topic_matches, validate_pattern, validate_topic

__all__ = [
    "ERROR_POLICIES",
    "Event",
    "EventBus",
    "EventBusError",
    "InvalidTopicError",
    "PublishError",
    "Subscription",
    "compose",
    "filter_middleware",
    "is_wildcard",
    "tap_middleware",
    "topic_matches",
    "transform_middleware",
    "validate_pattern",
    "validate_topic",
]
