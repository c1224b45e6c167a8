import random
from types import SimpleNamespace

import pytest

from retrylite.wait import (
    WaitStrategy,
    wait_chain,
    wait_combine,
    wait_exponential,
    wait_fixed,
    wait_none,
    wait_random,
)


def state(attempt_number):
    return SimpleNamespace(attempt_number=attempt_number, elapsed=0.0)


class FixedRng:
    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_wait_none_and_fixed():
    assert wait_none()(state(1)) == 0.0
    w = wait_fixed(2.5)
    assert [w(state(n)) for n in (1, 2, 7)] == [2.5, 2.5, 2.5]
    assert isinstance(wait_fixed(2)(state(1)), float)


def test_wait_fixed_rejects_negative():
    with pytest.raises(ValueError):
        wait_fixed(-1)


def test_wait_exponential_defaults():
    w = wait_exponential()
    assert [w(state(n)) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_wait_exponential_multiplier_and_base():
    w = wait_exponential(multiplier=0.5, base=3)
    assert [w(state(n)) for n in (1, 2, 3)] == [0.5, 1.5, 4.5]


def test_wait_exponential_cap_and_floor():
    w = wait_exponential(multiplier=1, max=10, min=3)
    assert [w(state(n)) for n in range(1, 7)] == [3.0, 3.0, 4.0, 8.0, 10.0, 10.0]


def test_wait_exponential_huge_attempt_is_capped():
    assert wait_exponential(max=60)(state(5000)) == 60.0
    assert wait_exponential(multiplier=1.0, base=2.0, max=30)(state(2000)) == 30.0


def test_wait_exponential_min_above_max_rejected():
    with pytest.raises(ValueError):
        wait_exponential(min=5, max=1)


def test_wait_random_with_injected_rng():
    w = wait_random(1, 3, rng=FixedRng(0.0, 0.25, 0.5))
    assert [w(state(1)), w(state(2)), w(state(3))] == [1.0, 1.5, 2.0]


def test_wait_random_seeded_is_reproducible():
    a = wait_random(0, 10, rng=random.Random(1234))
    b = wait_random(0, 10, rng=random.Random(1234))
    values = [a(state(n)) for n in range(1, 20)]
    assert values == [b(state(n)) for n in range(1, 20)]
    assert all(0 <= v <= 10 for v in values)


def test_wait_random_default_range():
    value = wait_random()(state(1))
    assert 0.0 <= value <= 1.0


def test_wait_random_min_above_max_rejected():
    with pytest.raises(ValueError):
        wait_random(2, 1)


def test_wait_chain():
    w = wait_chain(wait_fixed(1), wait_fixed(2), wait_fixed(5))
    assert [w(state(n)) for n in range(1, 7)] == [1.0, 2.0, 5.0, 5.0, 5.0, 5.0]


def test_wait_chain_requires_strategies():
    with pytest.raises(ValueError):
        wait_chain()


def test_plus_combines():
    w = wait_fixed(1) + wait_exponential(max=8)
    assert isinstance(w, wait_combine)
    assert isinstance(w, WaitStrategy)
    assert [w(state(n)) for n in range(1, 6)] == [2.0, 3.0, 5.0, 9.0, 9.0]


def test_exponential_plus_jitter():
    w = wait_exponential(multiplier=2, max=20) + wait_random(0, 1, rng=FixedRng(0.5, 0.25))
    assert w(state(1)) == 2.5
    assert w(state(5)) == 20.25


def test_sum_of_strategies():
    w = sum([wait_fixed(1), wait_fixed(2), wait_fixed(3)])
    assert isinstance(w, WaitStrategy)
    assert w(state(1)) == 6.0


def test_plus_with_number_is_type_error():
    with pytest.raises(TypeError):
        wait_fixed(1) + 2


def test_custom_subclass_combines():
    class Linear(WaitStrategy):
        def __call__(self, state):
            return float(state.attempt_number)

    w = Linear() + wait_fixed(0.5)
    assert w(state(4)) == 4.5
    chained = wait_chain(wait_none(), Linear())
    assert [chained(state(n)) for n in (1, 2, 3)] == [0.0, 2.0, 3.0]
