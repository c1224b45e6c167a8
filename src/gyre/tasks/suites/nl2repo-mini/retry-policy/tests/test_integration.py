import random

import pytest

import retrylite
from retrylite import (
    RetryError,
    Retrying,
    retry,
    stop_after_attempt,
    stop_after_delay,
    wait_chain,
    wait_exponential,
    wait_fixed,
    wait_random,
)


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def always_fails():
    raise TimeoutError("slow")


def test_public_api_is_exported():
    for name in [
        "Attempt", "RetryError", "RetryState", "Retrying", "StopStrategy", "WaitStrategy",
        "retry", "stop_after_attempt", "stop_after_delay", "stop_all", "stop_any",
        "stop_never", "wait_chain", "wait_combine", "wait_exponential", "wait_fixed",
        "wait_none", "wait_random",
    ]:
        assert hasattr(retrylite, name), name


def test_exponential_backoff_with_cap():
    t = FakeTime()
    r = Retrying(stop=stop_after_attempt(6), wait=wait_exponential(multiplier=0.5, max=4),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError):
        r.call(always_fails)
    assert t.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_attempts_or_delay_whichever_first():
    t = FakeTime()
    r = Retrying(stop=stop_after_attempt(10) | stop_after_delay(7), wait=wait_fixed(3),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError) as info:
        r.call(always_fails)
    assert info.value.last_attempt.attempt_number == 4
    assert t.sleeps == [3.0, 3.0, 3.0]


def test_chain_plus_jitter_with_seeded_rng():
    t = FakeTime()
    rng = random.Random(7)
    expected_rng = random.Random(7)
    jitter = [expected_rng.random() for _ in range(3)]
    r = Retrying(stop=stop_after_attempt(4),
                 wait=wait_chain(wait_fixed(1), wait_fixed(10)) + wait_random(0, 2, rng=rng),
                 sleep=t.sleep, clock=t.clock)
    with pytest.raises(RetryError):
        r.call(always_fails)
    assert t.sleeps == pytest.approx([1 + 2 * jitter[0], 10 + 2 * jitter[1], 10 + 2 * jitter[2]])


def test_decorator_with_strategies_and_result_predicate():
    t = FakeTime()
    statuses = iter([503, 503, 200])

    @retry(stop=stop_after_attempt(5), wait=wait_exponential(), retry_on_result=lambda s: s >= 500,
           sleep=t.sleep, clock=t.clock)
    def fetch():
        return next(statuses)

    assert fetch() == 200
    assert t.sleeps == [1.0, 2.0]
