from types import SimpleNamespace

import pytest

from retrylite.stop import (
    StopStrategy,
    stop_after_attempt,
    stop_after_delay,
    stop_all,
    stop_any,
    stop_never,
)


def state(attempt_number=1, elapsed=0.0):
    return SimpleNamespace(attempt_number=attempt_number, elapsed=elapsed)


@pytest.mark.parametrize("attempt, expected", [(1, False), (2, False), (3, True), (4, True)])
def test_stop_after_attempt(attempt, expected):
    assert stop_after_attempt(3)(state(attempt_number=attempt)) is expected


def test_stop_after_one_attempt():
    assert stop_after_attempt(1)(state(attempt_number=1)) is True


@pytest.mark.parametrize("bad", [0, -2])
def test_stop_after_attempt_rejects_non_positive(bad):
    with pytest.raises(ValueError):
        stop_after_attempt(bad)


@pytest.mark.parametrize("elapsed, expected", [(0.0, False), (4.99, False), (5.0, True), (7.5, True)])
def test_stop_after_delay(elapsed, expected):
    assert stop_after_delay(5)(state(elapsed=elapsed)) is expected


def test_stop_after_delay_rejects_negative():
    with pytest.raises(ValueError):
        stop_after_delay(-1)


def test_stop_never():
    assert isinstance(stop_never, StopStrategy)
    assert stop_never(state(attempt_number=10**6, elapsed=10**9)) is False


def test_or_composition():
    combined = stop_after_attempt(5) | stop_after_delay(10)
    assert isinstance(combined, stop_any)
    assert isinstance(combined, StopStrategy)
    assert combined(state(attempt_number=2, elapsed=1)) is False
    assert combined(state(attempt_number=5, elapsed=1)) is True
    assert combined(state(attempt_number=2, elapsed=10)) is True


def test_and_composition():
    combined = stop_after_attempt(5) & stop_after_delay(10)
    assert isinstance(combined, stop_all)
    assert combined(state(attempt_number=5, elapsed=1)) is False
    assert combined(state(attempt_number=2, elapsed=10)) is False
    assert combined(state(attempt_number=5, elapsed=10)) is True


def test_chained_or_of_three():
    combined = stop_after_attempt(9) | stop_after_delay(100) | stop_never
    assert combined(state(attempt_number=8, elapsed=99)) is False
    assert combined(state(attempt_number=9, elapsed=0)) is True


def test_stop_any_and_all_keep_their_strategies():
    a, b = stop_after_attempt(2), stop_after_delay(3)
    assert stop_any(a, b).stops == (a, b)
    assert stop_all(a, b).stops == (a, b)


def test_empty_stop_any_or_all_rejected():
    with pytest.raises(ValueError):
        stop_any()
    with pytest.raises(ValueError):
        stop_all()


def test_or_with_non_strategy_is_type_error():
    with pytest.raises(TypeError):
        stop_after_attempt(3) | 5


def test_custom_subclass_composes():
    class StopOnOdd(StopStrategy):
        def __call__(self, state):
            return state.attempt_number % 2 == 1

    combined = StopOnOdd() | stop_after_attempt(4)
    assert combined(state(attempt_number=2)) is False
    assert combined(state(attempt_number=3)) is True
    assert combined(state(attempt_number=4)) is True
