"""The retry loop: Attempt, RetryState, RetryError, Retrying and the retry decorator."""

import functools
import time

from .stop import stop_after_attempt
from .wait import wait_none


class Attempt:
    def __init__(self, attempt_number, value=None, exception=None):
        self.attempt_number = attempt_number
        self.value = value
        self.exception = exception

    @property
    def failed(self):
        return self.exception is not None

    def result(self):
        if self.exception is not None:
            raise self.exception
        return self.value


class RetryState:
    def __init__(self, fn, args, kwargs):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.attempt_number = 0
        self.outcome = None
        self.elapsed = 0.0
        self.idle_for = 0.0
        self.next_wait = None


class RetryError(Exception):
    def __init__(self, last_attempt):
        super().__init__(f"gave up after {last_attempt.attempt_number} attempts")
        self.last_attempt = last_attempt


class Retrying:
    # TODO: retry_on_result, after, reraise, copy(), validation
    def __init__(self, *, stop=None, wait=None, retry_on_exception=Exception,
                 before=None, sleep=time.sleep, clock=time.monotonic):
        self.stop = stop or stop_after_attempt(3)
        self.wait = wait or wait_none()
        self.retry_on_exception = retry_on_exception
        self.before = before
        self.sleep = sleep
        self.clock = clock
        self.last_state = None

    def call(self, fn, *args, **kwargs):
        state = RetryState(fn, args, kwargs)
        self.last_state = state
        start = self.clock()
        while True:
            state.attempt_number += 1
            if self.before is not None:
                self.before(state)
            try:
                return fn(*args, **kwargs)
            except self.retry_on_exception as exc:
                attempt = Attempt(state.attempt_number, exception=exc)
            state.outcome = attempt
            state.elapsed = self.clock() - start
            if self.stop(state):
                raise RetryError(attempt)
            delay = self.wait(state)
            self.sleep(delay)
            state.idle_for += delay

    __call__ = call

    def wraps(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            return self.call(fn, *args, **kwargs)

        wrapped.retrying = self
        return wrapped


def retry(**options):
    return Retrying(**options).wraps
