"""The synchronous EventBus."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .errors import PublishError
from .events import Event
from .middleware import compose
from .topics import topic_matches, validate_pattern, validate_topic

ERROR_POLICIES = ("raise", "collect", "ignore")


def _check_policy(policy: str) -> str:
    if policy not in ERROR_POLICIES:
        raise ValueError(
            f"error_policy must be one of {', '.join(ERROR_POLICIES)}; got {policy!r}"
        )
    return policy


class Subscription:
    """Handle returned by :meth:`EventBus.subscribe`."""

    __slots__ = ("pattern", "handler", "priority", "once", "filter", "_bus", "_seq", "_active")

    def __init__(self, bus, pattern, handler, priority, once, filter, seq) -> None:
        self.pattern = pattern
        self.handler = handler
        self.priority = priority
        self.once = once
        self.filter = filter
        self._bus = bus
        self._seq = seq
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def matches(self, topic: str) -> bool:
        return topic_matches(self.pattern, topic)

    def unsubscribe(self) -> bool:
        return self._bus.unsubscribe(self)

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return (
            f"<Subscription {self.pattern!r} priority={self.priority}"
            f"{' once' if self.once else ''} {state}>"
        )


class EventBus:
    """A synchronous publish/subscribe bus."""

    def __init__(self, error_policy: str = "raise") -> None:
        self._policy = _check_policy(error_policy)
        self._subs: list[Subscription] = []
        self._middleware: list = []
        self._counter = itertools.count()

    @property
    def error_policy(self) -> str:
        return self._policy

    # -- subscribing -----------------------------------------------------
    def subscribe(
        self,
        pattern: str,
        handler: Callable[[Event], Any],
        *,
        priority: int = 0,
        once: bool = False,
        filter: Callable[[Event], bool] | None = None,
    ) -> Subscription:
        validate_pattern(pattern)
        if not callable(handler):
            raise TypeError("handler must be callable")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError("priority must be an int")
        if filter is not None and not callable(filter):
            raise TypeError("filter must be callable or None")
        sub = Subscription(self, pattern, handler, priority, bool(once), filter, next(self._counter))
        self._subs.append(sub)
        return sub

    def once(self, pattern, handler, *, priority: int = 0, filter=None) -> Subscription:
        return self.subscribe(pattern, handler, priority=priority, once=True, filter=filter)

    def on(self, pattern, *, priority: int = 0, once: bool = False, filter=None):
        validate_pattern(pattern)

        def decorator(fn):
            self.subscribe(pattern, fn, priority=priority, once=once, filter=filter)
            return fn

        return decorator

    def unsubscribe(self, subscription: Subscription) -> bool:
        for i, sub in enumerate(self._subs):
            if sub is subscription:
                del self._subs[i]
                sub._active = False
                return True
        return False

    def clear(self) -> int:
        removed = len(self._subs)
        for sub in self._subs:
            sub._active = False
        self._subs = []
        return removed

    def _ordered(self) -> list[Subscription]:
        return sorted(self._subs, key=lambda s: (-s.priority, s._seq))

    def subscriptions(self, topic: str | None = None) -> list[Subscription]:
        subs = self._ordered()
        if topic is None:
            return subs
        validate_topic(topic)
        return [s for s in subs if topic_matches(s.pattern, topic)]

    def has_subscribers(self, topic: str) -> bool:
        return bool(self.subscriptions(topic))

    def __len__(self) -> int:
        return len(self._subs)

    # -- middleware ------------------------------------------------------
    def use(self, middleware):
        if not callable(middleware):
            raise TypeError("middleware must be callable")
        self._middleware.append(middleware)
        return middleware

    # -- publishing ------------------------------------------------------
    def publish(self, topic: str, payload: Any = None, *, error_policy: str | None = None) -> int:
        validate_topic(topic)
        policy = self._policy if error_policy is None else _check_policy(error_policy)
        called = 0

        def final(event: Event) -> None:
            nonlocal called
            validate_topic(event.topic)
            called += self._dispatch(event, policy)

        compose(self._middleware, final)(Event(topic, payload))
        return called

    def _dispatch(self, event: Event, policy: str) -> int:
        snapshot = [s for s in self._ordered() if topic_matches(s.pattern, event.topic)]
        errors: list = []
        called = 0
        for sub in snapshot:
            if not sub._active:
                continue
            if sub.filter is not None:
                try:
                    accepted = sub.filter(event)
                except Exception as exc:
                    if policy == "raise":
                        raise
                    if policy == "collect":
                        errors.append((sub, exc))
                    continue
                if not accepted:
                    continue
            if sub.once:
                self.unsubscribe(sub)
            called += 1
            try:
                sub.handler(event)
            except Exception as exc:
                if policy == "raise":
                    raise
                if policy == "collect":
                    errors.append((sub, exc))
        if errors:
            raise PublishError(event.topic, errors)
        return called
