import pytest

from eventbus.errors import EventBusError, InvalidTopicError
from eventbus.topics import is_wildcard, topic_matches, validate_pattern, validate_topic


@pytest.mark.parametrize(
    "pattern, topic, expected",
    [
        ("orders.created", "orders.created", True),
        ("orders.created", "orders.updated", False),
        ("orders.*", "orders.created", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.created", False),
        ("*.created", "users.created", True),
        ("orders.#", "orders", True),
        ("orders.#", "orders.eu.created", True),
        ("#", "anything.at.all", True),
        ("#.created", "created", True),
        ("#.created", "a.b.created", True),
        ("a.#.d", "a.d", True),
        ("a.#.d", "a.b.c.d", True),
        ("a.#.d", "a.b.c", False),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("#.#", "x", True),
        ("Orders.created", "orders.created", False),
    ],
)
def test_topic_matches(pattern, topic, expected):
    assert topic_matches(pattern, topic) is expected


@pytest.mark.parametrize("topic", ["", "a..b", ".a", "a.", "a.*", "a.#", "a.b*", 42, None])
def test_validate_topic_rejects(topic):
    with pytest.raises(InvalidTopicError):
        validate_topic(topic)


@pytest.mark.parametrize("pattern", ["", "a..b", "a.b*", "a#", "*x.y", 3])
def test_validate_pattern_rejects(pattern):
    with pytest.raises(InvalidTopicError):
        validate_pattern(pattern)


def test_validate_returns_value_unchanged():
    assert validate_topic("a.b-c.d_e") == "a.b-c.d_e"
    assert validate_pattern("a.*.#") == "a.*.#"
    assert validate_pattern("plain") == "plain"


def test_invalid_topic_error_hierarchy():
    assert issubclass(InvalidTopicError, EventBusError)
    assert issubclass(InvalidTopicError, ValueError)


def test_topic_matches_validates_arguments():
    with pytest.raises(InvalidTopicError):
        topic_matches("a.*", "a.*")
    with pytest.raises(InvalidTopicError):
        topic_matches("a.b*", "a.b")


def test_is_wildcard():
    assert is_wildcard("a.*") is True
    assert is_wildcard("#") is True
    assert is_wildcard("a.b") is False
    with pytest.raises(InvalidTopicError):
        is_wildcard("a..b")
