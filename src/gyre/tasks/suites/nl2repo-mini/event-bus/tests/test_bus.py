import pytest

from eventbus import (
    Event,
    EventBus,
    EventBusError,
    InvalidTopicError,
    PublishError,
    Subscription,
    filter_middleware,
    transform_middleware,
)


def test_publish_delivers_event_and_returns_count():
    bus = EventBus()
    got = []
    bus.subscribe("orders.created", got.append)
    bus.subscribe("orders.*", got.append)
    bus.subscribe("users.#", got.append)
    assert bus.publish("orders.created", {"id": 7}) == 2
    assert got == [Event("orders.created", {"id": 7})] * 2
    assert bus.publish("nobody.listens") == 0


def test_priority_order_is_stable():
    bus = EventBus()
    order = []
    bus.subscribe("t", lambda e: order.append("low"), priority=-5)
    bus.subscribe("t", lambda e: order.append("a"))
    bus.subscribe("t", lambda e: order.append("high"), priority=10)
    bus.subscribe("#", lambda e: order.append("b"))
    bus.subscribe("t", lambda e: order.append("c"), priority=0)
    bus.publish("t")
    assert order == ["high", "a", "b", "c", "low"]


def test_subscriptions_listing_in_dispatch_order():
    bus = EventBus()
    s1 = bus.subscribe("a.*", print)
    s2 = bus.subscribe("b", print, priority=3)
    s3 = bus.subscribe("#", print)
    assert bus.subscriptions() == [s2, s1, s3]
    assert bus.subscriptions("a.x") == [s1, s3]
    assert len(bus) == 3
    assert bus.has_subscribers("b") and not EventBus().has_subscribers("b")
    with pytest.raises(InvalidTopicError):
        bus.subscriptions("a.*")


def test_subscription_attributes():
    bus = EventBus()
    flt = lambda e: True
    sub = bus.subscribe("a.#", print, priority=2, filter=flt)
    assert isinstance(sub, Subscription)
    assert (sub.pattern, sub.handler, sub.priority, sub.once, sub.filter) == ("a.#", print, 2, False, flt)
    assert sub.active is True
    assert sub.matches("a.b.c") and not sub.matches("b")


def test_unsubscribe_handle():
    bus = EventBus()
    got = []
    sub = bus.subscribe("t", got.append)
    assert sub.unsubscribe() is True
    assert sub.active is False
    assert sub.unsubscribe() is False
    assert bus.unsubscribe(sub) is False
    assert bus.publish("t") == 0 and got == []
    assert len(bus) == 0


def test_unsubscribe_foreign_subscription_returns_false():
    bus, other = EventBus(), EventBus()
    sub = other.subscribe("t", print)
    assert bus.unsubscribe(sub) is False
    assert sub.active is True


def test_once_subscription_fires_once():
    bus = EventBus()
    got = []
    sub = bus.once("t", lambda e: got.append(e.payload))
    assert sub.once is True
    assert bus.publish("t", 1) == 1
    assert bus.publish("t", 2) == 0
    assert got == [1]
    assert sub.active is False


def test_once_removed_before_handler_runs():
    bus = EventBus()
    calls = []

    def handler(event):
        calls.append(event.payload)
        if event.payload < 3:
            bus.publish("t", event.payload + 1)

    bus.subscribe("t", handler, once=True)
    bus.publish("t", 1)
    assert calls == [1]


def test_once_consumed_even_if_handler_raises():
    bus = EventBus()

    def boom(event):
        raise RuntimeError("boom")

    sub = bus.once("t", boom)
    with pytest.raises(RuntimeError):
        bus.publish("t")
    assert sub.active is False
    assert bus.publish("t") == 0


def test_on_decorator_returns_function():
    bus = EventBus()
    got = []

    @bus.on("x.*", priority=1)
    def handler(event):
        got.append(event.topic)

    assert callable(handler) and handler.__name__ == "handler"
    bus.publish("x.y")
    assert got == ["x.y"]
    assert bus.subscriptions()[0].priority == 1


def test_snapshot_semantics_during_publish():
    bus = EventBus()
    order = []
    later = None

    def first(event):
        order.append("first")
        later.unsubscribe()
        bus.subscribe("t", lambda e: order.append("new"))

    bus.subscribe("t", first, priority=1)
    later = bus.subscribe("t", lambda e: order.append("later"))
    assert bus.publish("t") == 1
    assert order == ["first"]
    order.clear()
    bus.publish("t")
    assert order == ["first", "new"]


def test_subscription_filter():
    bus = EventBus()
    got = []
    sub = bus.subscribe("t", got.append, once=True, filter=lambda e: e.payload == "yes")
    assert bus.publish("t", "no") == 0
    assert sub.active is True
    assert bus.publish("t", "yes") == 1
    assert sub.active is False
    assert [e.payload for e in got] == ["yes"]


def test_raise_policy_stops_at_first_error():
    bus = EventBus()
    order = []
    bus.subscribe("t", lambda e: order.append(1), priority=2)
    bus.subscribe("t", lambda e: 1 / 0, priority=1)
    bus.subscribe("t", lambda e: order.append(3))
    with pytest.raises(ZeroDivisionError):
        bus.publish("t")
    assert order == [1]


def test_collect_policy_aggregates_errors():
    bus = EventBus(error_policy="collect")
    order = []
    bad1 = bus.subscribe("t", lambda e: 1 / 0, priority=2)
    bus.subscribe("t", lambda e: order.append("ok"), priority=1)
    bad2 = bus.subscribe("t", lambda e: {}["missing"])
    with pytest.raises(PublishError) as info:
        bus.publish("t")
    err = info.value
    assert order == ["ok"]
    assert isinstance(err, EventBusError)
    assert err.topic == "t"
    assert [s for s, _ in err.errors] == [bad1, bad2]
    assert [type(e) for e in err.exceptions] == [ZeroDivisionError, KeyError]
    assert str(err) == "2 handler(s) failed while publishing 't'"


def test_collect_policy_without_errors_returns_count():
    bus = EventBus(error_policy="collect")
    bus.subscribe("t", print)
    bus.subscribe("t", lambda e: None)
    assert bus.publish("t", "") == 2


def test_ignore_policy_and_per_publish_override():
    bus = EventBus(error_policy="ignore")
    order = []
    bus.subscribe("t", lambda e: 1 / 0, priority=1)
    bus.subscribe("t", lambda e: order.append("ok"))
    assert bus.publish("t") == 2
    assert order == ["ok"]
    with pytest.raises(ZeroDivisionError):
        bus.publish("t", error_policy="raise")
    with pytest.raises(PublishError):
        bus.publish("t", error_policy="collect")


def test_filter_errors_follow_policy():
    bus = EventBus(error_policy="collect")
    got = []
    sub = bus.subscribe("t", got.append, once=True, filter=lambda e: e.payload["k"])
    with pytest.raises(PublishError) as info:
        bus.publish("t", {})
    assert [type(e) for e in info.value.exceptions] == [KeyError]
    assert got == [] and sub.active is True


def test_base_exceptions_are_never_swallowed():
    bus = EventBus(error_policy="ignore")

    def interrupt(event):
        raise KeyboardInterrupt

    bus.subscribe("t", interrupt)
    with pytest.raises(KeyboardInterrupt):
        bus.publish("t")


@pytest.mark.parametrize("policy", ["RAISE", "log", None])
def test_invalid_policy(policy):
    with pytest.raises(ValueError):
        EventBus(error_policy=policy)
    bus = EventBus()
    assert bus.error_policy == "raise"
    with pytest.raises(ValueError):
        bus.publish("t", error_policy=policy or "nope")


def test_subscribe_validation():
    bus = EventBus()
    with pytest.raises(InvalidTopicError):
        bus.subscribe("a..b", print)
    with pytest.raises(TypeError):
        bus.subscribe("a", "not callable")
    with pytest.raises(TypeError):
        bus.subscribe("a", print, priority="high")
    with pytest.raises(TypeError):
        bus.subscribe("a", print, priority=True)
    with pytest.raises(TypeError):
        bus.subscribe("a", print, filter=5)
    with pytest.raises(InvalidTopicError):
        bus.publish("a.*")
    assert len(bus) == 0


def test_clear_removes_everything():
    bus = EventBus()
    subs = [bus.subscribe("t", print) for _ in range(3)]
    assert bus.clear() == 3
    assert len(bus) == 0
    assert not any(s.active for s in subs)


def test_middleware_transform_and_filter():
    bus = EventBus()
    got = []
    bus.subscribe("audit.#", got.append)
    bus.subscribe("orders.created", got.append)
    assert bus.use(filter_middleware(lambda e: e.payload != "spam")) is not None
    bus.use(transform_middleware(lambda e: e.with_topic("audit." + e.topic)))
    assert bus.publish("orders.created", "ok") == 1
    assert got == [Event("audit.orders.created", "ok")]
    assert bus.publish("orders.created", "spam") == 0
    assert len(got) == 1


def test_middleware_order_and_invalid_rewrite():
    bus = EventBus()
    trace = []

    def outer(event, call_next):
        trace.append("outer")
        return call_next(event)

    def inner(event, call_next):
        trace.append("inner")
        return call_next(event.with_topic("bad..topic") if event.payload else event)

    bus.use(outer)
    bus.use(inner)
    bus.subscribe("#", lambda e: trace.append("handler"))
    bus.publish("t")
    assert trace == ["outer", "inner", "handler"]
    with pytest.raises(InvalidTopicError):
        bus.publish("t", True)
    with pytest.raises(TypeError):
        bus.use(None)
