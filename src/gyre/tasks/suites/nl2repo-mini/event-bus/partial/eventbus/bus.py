"""The synchronous EventBus."""

from __future__ import annotations

from .events import Event
from .topics import topic_matches, validate_pattern, validate_topic

ERROR_POLICIES = ("raise", "collect", "ignore")


class Subscription:
    def __init__(self, bus, pattern, handler, priority, once, filter):
        self.pattern = pattern
        self.handler = handler
        self.priority = priority
        self.once = once
        self.filter = filter
        self._bus = bus
        self.active = True

    def matches(self, topic):
        return topic_matches(self.pattern, topic)

    def unsubscribe(self):
        return self._bus.unsubscribe(self)


class EventBus:
    def __init__(self, error_policy="raise"):
        if error_policy not in ERROR_POLICIES:
            raise ValueError(error_policy)
        self.error_policy = error_policy
        self._subs = []

    def subscribe(self, pattern, handler, *, priority=0, once=False, filter=None):
        validate_pattern(pattern)
        if not callable(handler):
            raise TypeError("handler must be callable")
        sub = Subscription(self, pattern, handler, priority, once, filter)
        self._subs.append(sub)
        self._subs.sort(key=lambda s: -s.priority)
        return sub

    def once(self, pattern, handler, *, priority=0, filter=None):
        return self.subscribe(pattern, handler, priority=priority, once=True, filter=filter)

    def on(self, pattern, *, priority=0, once=False, filter=None):
        def decorator(fn):
            self.subscribe(pattern, fn, priority=priority, once=once, filter=filter)
            return fn

        return decorator

    def unsubscribe(self, subscription):
        if subscription in self._subs:
            self._subs.remove(subscription)
            subscription.active = False
            return True
        return False

    def clear(self):
        n = len(self._subs)
        for s in self._subs:
            s.active = False
        self._subs = []
        return n

    def subscriptions(self, topic=None):
        if topic is None:
            return list(self._subs)
        return [s for s in self._subs if s.matches(topic)]

    def has_subscribers(self, topic):
        return bool(self.subscriptions(topic))

    def __len__(self):
        return len(self._subs)

    def use(self, middleware):
        raise NotImplementedError("middleware support not finished")

    def publish(self, topic, payload=None, *, error_policy=None):
        validate_topic(topic)
        policy = error_policy or self.error_policy
        if policy == "collect":
            raise NotImplementedError("collect policy")
        event = Event(topic, payload)
        called = 0
        for sub in self._subs:
            if not sub.matches(topic):
                continue
            if sub.filter is not None and not sub.filter(event):
                continue
            called += 1
            try:
                sub.handler(event)
            except Exception:
                if policy == "raise":
                    raise
            if sub.once:
                self.unsubscribe(sub)
        return called
