"""Wait strategies: how many seconds to sleep before the next attempt."""

import builtins
import numbers
import random


def _check_number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number")


class WaitStrategy:
    """Base class. Subclasses implement ``__call__(state) -> float``."""

    def __call__(self, state):
        raise NotImplementedError

    def __add__(self, other):
        if not isinstance(other, WaitStrategy):
            return NotImplemented
        return wait_combine(self, other)

    def __radd__(self, other):
        if isinstance(other, numbers.Number) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented


class wait_none(WaitStrategy):
    """Never wait."""

    def __call__(self, state):
        return 0.0


class wait_fixed(WaitStrategy):
    """Always wait the same number of seconds."""

    def __init__(self, seconds):
        _check_number("seconds", seconds)
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self.seconds = float(seconds)

    def __call__(self, state):
        return self.seconds


class wait_exponential(WaitStrategy):
    """``multiplier * base ** (attempt_number - 1)``, clamped to ``[min, max]``."""

    def __init__(self, multiplier=1.0, base=2.0, min=0.0, max=float("inf")):
        for name, value in (("multiplier", multiplier), ("base", base), ("min", min), ("max", max)):
            _check_number(name, value)
        if min < 0:
            raise ValueError("min must be >= 0")
        if min > max:
            raise ValueError("min must be <= max")
        self.multiplier = multiplier
        self.base = base
        self.min = min
        self.max = max

    def __call__(self, state):
        try:
            value = self.multiplier * self.base ** (state.attempt_number - 1)
        except OverflowError:
            return float(self.max)
        value = builtins.max(self.min, builtins.min(self.max, value))
        try:
            return float(value)
        except OverflowError:
            return float(self.max)


class wait_random(WaitStrategy):
    """Uniform random wait in ``[min, max]`` drawn from ``rng.random()``."""

    def __init__(self, min=0.0, max=1.0, rng=None):
        _check_number("min", min)
        _check_number("max", max)
        if min < 0:
            raise ValueError("min must be >= 0")
        if min > max:
            raise ValueError("min must be <= max")
        self.min = min
        self.max = max
        self.rng = rng if rng is not None else random

    def __call__(self, state):
        return float(self.min + self.rng.random() * (self.max - self.min))


class wait_chain(WaitStrategy):
    """Use ``strategies[n - 1]`` after attempt ``n``; the last one repeats."""

    def __init__(self, *strategies):
        if not strategies:
            raise ValueError("wait_chain needs at least one strategy")
        self.strategies = strategies

    def __call__(self, state):
        index = builtins.min(builtins.max(state.attempt_number, 1), len(self.strategies)) - 1
        return float(self.strategies[index](state))


class wait_combine(WaitStrategy):
    """Sum of several strategies (what ``a + b`` builds)."""

    def __init__(self, *strategies):
        if not strategies:
            raise ValueError("wait_combine needs at least one strategy")
        self.strategies = strategies

    def __call__(self, state):
        return float(sum(strategy(state) for strategy in self.strategies))
