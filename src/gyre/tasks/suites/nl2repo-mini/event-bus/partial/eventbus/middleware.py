"""A small middleware chain."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .events import Event


def compose(middlewares: Iterable, final: Callable[[Event], Any]) -> Callable[[Event], Any]:
    chain = list(middlewares)
    step = final
    for mw in reversed(chain):
        step = _bind(mw, step)
    return step


def _bind(mw, call_next):
    def step(event):
        return mw(event, call_next)

    return step


def filter_middleware(predicate):
    def middleware(event, call_next):
        if predicate(event):
            return call_next(event)
        return None

    return middleware


def transform_middleware(fn):
    def middleware(event, call_next):
        return call_next(fn(event))

    return middleware


def tap_middleware(callback):
    raise NotImplementedError("tap_middleware")
