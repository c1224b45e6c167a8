import dataclasses

import pytest

from eventbus.events import Event
from eventbus.middleware import compose, filter_middleware, tap_middleware, transform_middleware


def test_event_is_frozen_value():
    e = Event("a.b", {"x": 1})
    assert e.topic == "a.b" and e.payload == {"x": 1}
    assert Event("a.b") == Event("a.b", None)
    assert e.segments == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.topic = "c"


def test_event_with_helpers_return_new_events():
    e = Event("a.b", 1)
    assert e.with_topic("c.d") == Event("c.d", 1)
    assert e.with_payload(2) == Event("a.b", 2)
    assert e == Event("a.b", 1)


def test_compose_order_outermost_first():
    trace = []

    def mw(name):
        def middleware(event, call_next):
            trace.append(f"{name}>")
            result = call_next(event)
            trace.append(f"<{name}")
            return result

        return middleware

    def final(event):
        trace.append("final")
        return "done"

    chain = compose([mw("a"), mw("b")], final)
    assert chain(Event("t")) == "done"
    assert trace == ["a>", "b>", "final", "<b", "<a"]


def test_compose_without_middleware_calls_final():
    chain = compose([], lambda e: e.payload * 2)
    assert chain(Event("t", 21)) == 42


def test_middleware_can_drop_event():
    seen = []
    chain = compose([lambda event, call_next: "blocked"], seen.append)
    assert chain(Event("t")) == "blocked"
    assert seen == []


def test_call_next_requires_event():
    chain = compose([lambda event, call_next: call_next({"topic": "t"})], lambda e: e)
    with pytest.raises(TypeError):
        chain(Event("t"))


def test_compose_rejects_non_callables():
    with pytest.raises(TypeError):
        compose([42], lambda e: e)
    with pytest.raises(TypeError):
        compose([], "nope")


def test_filter_middleware():
    seen = []
    chain = compose([filter_middleware(lambda e: e.payload > 0)], seen.append)
    chain(Event("t", 5))
    assert chain(Event("t", -1)) is None
    assert seen == [Event("t", 5)]


def test_transform_middleware():
    seen = []
    chain = compose(
        [transform_middleware(lambda e: e.with_payload(e.payload + 1)),
         transform_middleware(lambda e: e.with_topic("x.y"))],
        seen.append,
    )
    chain(Event("a.b", 1))
    assert seen == [Event("x.y", 2)]


def test_transform_middleware_must_return_event():
    chain = compose([transform_middleware(lambda e: e.payload)], lambda e: e)
    with pytest.raises(TypeError):
        chain(Event("t", 1))


def test_tap_middleware_observes_without_changing():
    tapped, seen = [], []
    chain = compose([tap_middleware(tapped.append)], seen.append)
    chain(Event("t", 1))
    assert tapped == [Event("t", 1)] and seen == [Event("t", 1)]


@pytest.mark.parametrize("factory", [filter_middleware, transform_middleware, tap_middleware])
def test_factories_reject_non_callables(factory):
    with pytest.raises(TypeError):
        factory(None)
