import pytest

from retrylite.core import RetryError, Retrying, retry


class FakeSleep:
    def __init__(self):
        self.calls = []

    def __call__(self, seconds):
        self.calls.append(seconds)


def test_bare_decorator_uses_defaults():
    calls = []

    @retry
    def fn():
        calls.append(1)
        return "done"

    assert fn() == "done"
    assert calls == [1]
    assert isinstance(fn.retrying, Retrying)


def test_decorator_with_empty_parentheses():
    @retry()
    def fn(x):
        return x * 2

    assert fn(21) == 42


def test_decorator_retries_and_passes_arguments():
    sleep = FakeSleep()
    calls = []

    @retry(stop=lambda s: s.attempt_number >= 5, wait=lambda s: 0.25, sleep=sleep)
    def fn(a, *, b):
        calls.append((a, b))
        if len(calls) < 3:
            raise ConnectionError("down")
        return a + b

    assert fn(1, b=2) == 3
    assert calls == [(1, 2)] * 3
    assert sleep.calls == [0.25, 0.25]


def test_decorator_preserves_metadata():
    @retry(sleep=FakeSleep())
    def documented(x):
        """Adds one."""
        return x + 1

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Adds one."
    assert documented.__wrapped__(1) == 2


def test_decorator_gives_up_with_retry_error():
    sleep = FakeSleep()

    @retry(stop=lambda s: s.attempt_number >= 2, sleep=sleep)
    def always_fails():
        raise ValueError("nope")

    with pytest.raises(RetryError) as info:
        always_fails()
    assert info.value.last_attempt.attempt_number == 2
    assert isinstance(info.value.last_attempt.exception, ValueError)
    assert sleep.calls == [0.0]


def test_each_decorated_call_is_independent():
    sleep = FakeSleep()
    counter = {"n": 0}

    @retry(stop=lambda s: s.attempt_number >= 2, sleep=sleep)
    def fails_on_odd_calls():
        counter["n"] += 1
        if counter["n"] % 2:
            raise RuntimeError("odd")
        return counter["n"]

    assert fails_on_odd_calls() == 2
    assert fails_on_odd_calls() == 4
    assert fails_on_odd_calls.retrying.last_state.attempt_number == 2


def test_retry_with_overrides():
    sleep = FakeSleep()
    counter = {"n": 0}

    @retry(stop=lambda s: s.attempt_number >= 2, sleep=sleep)
    def flaky():
        counter["n"] += 1
        if counter["n"] < 4:
            raise OSError("again")
        return "ok"

    patient = flaky.retry_with(stop=lambda s: s.attempt_number >= 10)
    assert patient.__name__ == "flaky"
    assert patient() == "ok"
    assert counter["n"] == 4
    assert flaky.retrying.stop is not patient.retrying.stop


def test_wraps_method():
    sleep = FakeSleep()
    r = Retrying(retry_on_result=lambda v: v < 3, stop=lambda s: False, sleep=sleep)
    values = iter([1, 2, 3])
    wrapped = r.wraps(lambda: next(values))
    assert wrapped() == 3
    assert wrapped.retrying is r
    assert sleep.calls == [0.0, 0.0]


def test_decorator_rejects_unknown_option():
    with pytest.raises(TypeError):
        retry(colour="red")
