"""A small middleware chain.

A middleware is a callable ``middleware(event, call_next)``.  It may pass the
event (or a replacement Event) on with ``call_next(event)``, or drop it by not
calling ``call_next`` at all.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .events import Event

Middleware = Callable[[Event, Callable[[Event], Any]], Any]


def _guard(step: Callable[[Event], Any]) -> Callable[[Event], Any]:
    def call_next(event: Event) -> Any:
        if not isinstance(event, Event):
            raise TypeError(
                f"middleware must pass an Event on, got {type(event).__name__}"
            )
        return step(event)

    return call_next


def compose(middlewares: Iterable[Middleware], final: Callable[[Event], Any]) -> Callable[[Event], Any]:
    """Chain ``middlewares`` (first = outermost) in front of ``final``."""
    chain = list(middlewares)
    if not callable(final):
        raise TypeError("final must be callable")
    for mw in chain:
        if not callable(mw):
            raise TypeError(f"middleware {mw!r} is not callable")

    step = _guard(final)
    for mw in reversed(chain):
        step = _guard(_bind(mw, step))
    return step


def _bind(mw: Middleware, call_next: Callable[[Event], Any]) -> Callable[[Event], Any]:
    def step(event: Event) -> Any:
        return mw(event, call_next)

    return step


def filter_middleware(predicate: Callable[[Event], bool]) -> Middleware:
    """Pass the event on only when ``predicate(event)`` is truthy."""
    if not callable(predicate):
        raise TypeError("predicate must be callable")

    def middleware(event: Event, call_next):
        if predicate(event):
            return call_next(event)
        return None

    return middleware


def transform_middleware(fn: Callable[[Event], Event]) -> Middleware:
    """Pass ``fn(event)`` on instead of the event."""
    if not callable(fn):
        raise TypeError("fn must be callable")

    def middleware(event: Event, call_next):
        return call_next(fn(event))

    return middleware


def tap_middleware(callback: Callable[[Event], Any]) -> Middleware:
    """Call ``callback(event)`` and pass the event on unchanged."""
    if not callable(callback):
        raise TypeError("callback must be callable")

    def middleware(event: Event, call_next):
        callback(event)
        return call_next(event)

    return middleware
