import pytest

from retrylite.core import Attempt, RetryError, RetryState, Retrying


class FakeTime:
    """A clock plus a sleep function that only advances the clock."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def flaky(failures, exc_type=ValueError, result="ok"):
    calls = []

    def fn(*args, **kwargs):
        calls.append((args, kwargs))
        if len(calls) <= failures:
            raise exc_type(f"failure {len(calls)}")
        return result

    fn.calls = calls
    return fn


def after_attempts(n):
    return lambda state: state.attempt_number >= n


def fixed(seconds):
    return lambda state: seconds


def test_attempt_value_and_exception():
    ok = Attempt(1, value=42)
    assert ok.attempt_number == 1 and ok.value == 42 and ok.exception is None
    assert ok.failed is False and ok.result() == 42
    err = ValueError("boom")
    bad = Attempt(2, exception=err)
    assert bad.failed is True and bad.value is None
    with pytest.raises(ValueError) as info:
        bad.result()
    assert info.value is err


def test_success_first_try_does_not_sleep():
    t = FakeTime()
    fn = flaky(0)
    r = Retrying(sleep=t.sleep, clock=t.clock)
    assert r.call(fn, 1, key="v") == "ok"
    assert fn.calls == [((1,), {"key": "v"})]
    assert t.sleeps == []


def test_retries_until_success_and_sleeps_between_attempts():
    t = FakeTime()
    fn = flaky(2)
    r = Retrying(stop=after_attempts(5), wait=fixed(1.5), sleep=t.sleep, clock=t.clock)
    assert r(fn) == "ok"
    assert len(fn.calls) == 3
    assert t.sleeps == [1.5, 1.5]


def test_default_stop_is_three_attempts():
    t = FakeTime()
    fn = flaky(10)
    r = Retrying(sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError):
        r.call(fn)
    assert len(fn.calls) == 3
    assert t.sleeps == [0.0, 0.0]


def test_retry_error_carries_last_attempt():
    t = FakeTime()
    fn = flaky(10)
    r = Retrying(stop=after_attempts(4), sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError) as info:
        r.call(fn)
    err = info.value
    assert str(err) == "gave up after 4 attempts"
    assert err.last_attempt.attempt_number == 4
    assert err.last_attempt.failed
    assert str(err.last_attempt.exception) == "failure 4"
    assert err.__cause__ is err.last_attempt.exception


def test_retry_error_singular_message():
    t = FakeTime()
    with pytest.raises(RetryError, match=r"^gave up after 1 attempt$"):
        Retrying(stop=after_attempts(1), sleep=t.sleep, clock=t.clock).call(flaky(5))


def test_retry_error_reraise():
    t = FakeTime()
    with pytest.raises(RetryError) as info:
        Retrying(stop=after_attempts(2), sleep=t.sleep, clock=t.clock).call(flaky(5, KeyError))
    with pytest.raises(KeyError):
        info.value.reraise()


def test_reraise_option_raises_original_exception():
    t = FakeTime()
    fn = flaky(5, OSError)
    r = Retrying(stop=after_attempts(2), reraise=True, sleep=t.sleep, clock=t.clock)
    with pytest.raises(OSError, match="failure 2"):
        r.call(fn)
    assert len(fn.calls) == 2


def test_non_retryable_exception_propagates_immediately():
    t = FakeTime()
    fn = flaky(5, KeyError)
    r = Retrying(retry_on_exception=(ValueError, OSError), stop=after_attempts(5),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(KeyError):
        r.call(fn)
    assert len(fn.calls) == 1
    assert t.sleeps == []


def test_retry_on_single_exception_type_includes_subclasses():
    t = FakeTime()
    fn = flaky(2, FileNotFoundError)
    r = Retrying(retry_on_exception=OSError, stop=after_attempts(5), sleep=t.sleep, clock=t.clock)
    assert r.call(fn) == "ok"
    assert len(fn.calls) == 3


def test_base_exceptions_are_never_caught():
    t = FakeTime()
    fn = flaky(5, KeyboardInterrupt)
    r = Retrying(stop=after_attempts(5), sleep=t.sleep, clock=t.clock)
    with pytest.raises(KeyboardInterrupt):
        r.call(fn)
    assert len(fn.calls) == 1


def test_retry_on_result_predicate():
    t = FakeTime()
    results = iter([None, None, 7])
    r = Retrying(retry_on_result=lambda value: value is None, stop=after_attempts(5),
                 sleep=t.sleep, clock=t.clock)
    assert r.call(lambda: next(results)) == 7
    assert len(t.sleeps) == 2


def test_retry_on_result_gives_up_with_value_in_last_attempt():
    t = FakeTime()
    r = Retrying(retry_on_result=lambda value: value < 0, stop=after_attempts(3),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError) as info:
        r.call(lambda: -1)
    attempt = info.value.last_attempt
    assert attempt.failed is False and attempt.value == -1 and attempt.attempt_number == 3
    assert info.value.__cause__ is None
    with pytest.raises(RetryError):
        info.value.reraise()


def test_stop_after_delay_with_fake_clock():
    t = FakeTime()
    seen = []

    def stop(state):
        seen.append(state.elapsed)
        return state.elapsed >= 5

    with pytest.raises(RetryError) as info:
        Retrying(stop=stop, wait=fixed(2), sleep=t.sleep, clock=t.clock).call(flaky(100))
    assert seen == [0.0, 2.0, 4.0, 6.0]
    assert t.sleeps == [2, 2, 2]
    assert info.value.last_attempt.attempt_number == 4


def test_state_seen_by_wait_and_stop():
    t = FakeTime()
    records = []

    def wait(state):
        records.append(("wait", state.attempt_number, state.idle_for, state.outcome.failed))
        return state.attempt_number * 10

    r = Retrying(stop=after_attempts(3), wait=wait, sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError):
        r.call(flaky(5))
    assert records == [("wait", 1, 0.0, True), ("wait", 2, 10.0, True)]
    assert t.sleeps == [10.0, 20.0]
    state = r.last_state
    assert isinstance(state, RetryState)
    assert state.attempt_number == 3 and state.idle_for == 30.0 and state.elapsed == 30.0


def test_negative_wait_is_clamped_to_zero():
    t = FakeTime()
    Retrying(stop=after_attempts(3), wait=fixed(-4), sleep=t.sleep, clock=t.clock).call(flaky(1))
    assert t.sleeps == [0.0]


def test_before_and_after_callbacks():
    t = FakeTime()
    events = []
    r = Retrying(
        stop=after_attempts(5),
        wait=fixed(1),
        before=lambda s: events.append(("before", s.attempt_number)),
        after=lambda s: events.append(("after", s.attempt_number, s.outcome.failed, s.elapsed)),
        sleep=lambda seconds: (events.append(("sleep", seconds)), t.sleep(seconds)),
        clock=t.clock,
    )
    assert r.call(flaky(1)) == "ok"
    assert events == [
        ("before", 1), ("after", 1, True, 0.0), ("sleep", 1),
        ("before", 2), ("after", 2, False, 1.0),
    ]


def test_after_called_for_non_retryable_failure():
    t = FakeTime()
    seen = []
    r = Retrying(retry_on_exception=ValueError, after=lambda s: seen.append(s.attempt_number),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(TypeError):
        r.call(flaky(1, TypeError))
    assert seen == [1]


def test_state_exposes_call_details():
    t = FakeTime()
    captured = []

    def fn(a, b=0):
        return a + b

    r = Retrying(before=lambda s: captured.append((s.fn, s.args, s.kwargs)), sleep=t.sleep, clock=t.clock)
    assert r.call(fn, 1, b=2) == 3
    assert captured == [(fn, (1,), {"b": 2})]


def test_each_call_starts_fresh():
    t = FakeTime()
    r = Retrying(stop=after_attempts(3), sleep=t.sleep, clock=t.clock)
    assert r.call(flaky(2)) == "ok"
    assert r.call(flaky(2)) == "ok"
    assert r.last_state.attempt_number == 3


def test_copy_overrides_options():
    t = FakeTime()
    base = Retrying(stop=after_attempts(2), wait=fixed(3), sleep=t.sleep, clock=t.clock)
    other = base.copy(stop=after_attempts(4))
    assert other is not base
    assert other.wait is base.wait and other.sleep is base.sleep
    assert other.call(flaky(3)) == "ok"
    with pytest.raises(RetryError):
        base.call(flaky(3))
    with pytest.raises(TypeError):
        base.copy(colour="red")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stop": 3},
        {"wait": 1.5},
        {"sleep": None},
        {"retry_on_exception": "ValueError"},
        {"retry_on_exception": (ValueError, 3)},
        {"retry_on_result": True},
    ],
)
def test_invalid_options_rejected(kwargs):
    with pytest.raises(TypeError):
        Retrying(**kwargs)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        Retrying(lambda state: True)
