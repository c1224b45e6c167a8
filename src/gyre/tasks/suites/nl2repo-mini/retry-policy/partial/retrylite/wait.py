"""Wait strategies: how many seconds to sleep before the next attempt."""

import random


class WaitStrategy:
    def __call__(self, state):
        raise NotImplementedError

    def __add__(self, other):
        if not isinstance(other, WaitStrategy):
            return NotImplemented
        return wait_combine(self, other)


class wait_none(WaitStrategy):
    def __call__(self, state):
        return 0.0


class wait_fixed(WaitStrategy):
    def __init__(self, seconds):
        self.seconds = float(seconds)

    def __call__(self, state):
        return self.seconds


class wait_exponential(WaitStrategy):
    def __init__(self, multiplier=1.0, base=2.0, min=0.0, max=float("inf")):
        self.multiplier = multiplier
        self.base = base
        self.min = min
        self.max = max

    def __call__(self, state):
        # TODO: apply min/max
        return float(self.multiplier * self.base ** (state.attempt_number - 1))


class wait_random(WaitStrategy):
    def __init__(self, min=0.0, max=1.0, rng=None):
        self.min = min
        self.max = max
        self.rng = rng or random

    def __call__(self, state):
        return self.min + self.rng.random() * (self.max - self.min)


class wait_chain(WaitStrategy):
    def __init__(self, *strategies):
        self.strategies = strategies

    def __call__(self, state):
        raise NotImplementedError("wait_chain")


class wait_combine(WaitStrategy):
    def __init__(self, *strategies):
        self.strategies = strategies

    def __call__(self, state):
        return float(sum(strategy(state) for strategy in self.strategies))
