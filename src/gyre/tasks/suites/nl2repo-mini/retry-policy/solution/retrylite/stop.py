"""Stop conditions: decide, after a retryable attempt, whether to give up."""

import numbers


class StopStrategy:
    """Base class. Subclasses implement ``__call__(state) -> bool``."""

    def __call__(self, state):
        raise NotImplementedError

    def __or__(self, other):
        if not isinstance(other, StopStrategy):
            return NotImplemented
        return stop_any(self, other)

    def __and__(self, other):
        if not isinstance(other, StopStrategy):
            return NotImplemented
        return stop_all(self, other)


class _StopNever(StopStrategy):
    def __call__(self, state):
        return False

    def __repr__(self):
        return "stop_never"


stop_never = _StopNever()


class stop_after_attempt(StopStrategy):
    """Stop once ``max_attempts`` attempts have been made."""

    def __init__(self, max_attempts):
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise TypeError("max_attempts must be an int")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.max_attempts = max_attempts

    def __call__(self, state):
        return state.attempt_number >= self.max_attempts

    def __repr__(self):
        return f"stop_after_attempt({self.max_attempts})"


class stop_after_delay(StopStrategy):
    """Stop once ``max_delay`` seconds have elapsed since the first attempt started."""

    def __init__(self, max_delay):
        if isinstance(max_delay, bool) or not isinstance(max_delay, numbers.Real):
            raise TypeError("max_delay must be a number")
        if max_delay < 0:
            raise ValueError("max_delay must be >= 0")
        self.max_delay = max_delay

    def __call__(self, state):
        return state.elapsed >= self.max_delay

    def __repr__(self):
        return f"stop_after_delay({self.max_delay})"


class stop_any(StopStrategy):
    """Stop when any of the given strategies says stop."""

    def __init__(self, *stops):
        if not stops:
            raise ValueError("stop_any needs at least one strategy")
        self.stops = stops

    def __call__(self, state):
        return any(stop(state) for stop in self.stops)


class stop_all(StopStrategy):
    """Stop only when all of the given strategies say stop."""

    def __init__(self, *stops):
        if not stops:
            raise ValueError("stop_all needs at least one strategy")
        self.stops = stops

    def __call__(self, state):
        return all(stop(state) for stop in self.stops)
