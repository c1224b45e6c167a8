"""The retry loop: Attempt, RetryState, RetryError, Retrying and the retry decorator."""

import functools
import time

from .stop import stop_after_attempt
from .wait import wait_none

_UNSET = object()


class Attempt:
    """The outcome of one call: a value or an exception."""

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

    def __repr__(self):
        if self.failed:
            return f"<Attempt #{self.attempt_number}: raised {self.exception!r}>"
        return f"<Attempt #{self.attempt_number}: returned {self.value!r}>"


class RetryState:
    """Mutable bookkeeping for one call of ``Retrying.call``."""

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
    """Raised when the stop condition ends the retrying."""

    def __init__(self, last_attempt):
        n = last_attempt.attempt_number
        super().__init__(f"gave up after {n} attempt{'' if n == 1 else 's'}")
        self.last_attempt = last_attempt

    def reraise(self):
        if self.last_attempt.failed:
            raise self.last_attempt.exception
        raise self


def _is_exception_spec(spec):
    if isinstance(spec, type) and issubclass(spec, BaseException):
        return True
    return isinstance(spec, tuple) and all(
        isinstance(item, type) and issubclass(item, BaseException) for item in spec
    )


class Retrying:
    """A reusable retry policy."""

    _OPTIONS = (
        "stop", "wait", "retry_on_exception", "retry_on_result",
        "before", "after", "sleep", "clock", "reraise",
    )

    def __init__(
        self,
        *,
        stop=None,
        wait=None,
        retry_on_exception=Exception,
        retry_on_result=None,
        before=None,
        after=None,
        sleep=time.sleep,
        clock=time.monotonic,
        reraise=False,
    ):
        self.stop = stop_after_attempt(3) if stop is None else stop
        self.wait = wait_none() if wait is None else wait
        for name, value in (("stop", self.stop), ("wait", self.wait), ("sleep", sleep), ("clock", clock)):
            if not callable(value):
                raise TypeError(f"{name} must be callable")
        for name, value in (("retry_on_result", retry_on_result), ("before", before), ("after", after)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None")
        if not _is_exception_spec(retry_on_exception):
            raise TypeError("retry_on_exception must be an exception class or a tuple of them")
        self.retry_on_exception = retry_on_exception
        self.retry_on_result = retry_on_result
        self.before = before
        self.after = after
        self.sleep = sleep
        self.clock = clock
        self.reraise = bool(reraise)
        self.last_state = None

    def copy(self, **overrides):
        unknown = set(overrides) - set(self._OPTIONS)
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        options = {name: getattr(self, name) for name in self._OPTIONS}
        options.update(overrides)
        return Retrying(**options)

    def _should_retry(self, attempt):
        if attempt.failed:
            return isinstance(attempt.exception, self.retry_on_exception)
        return self.retry_on_result is not None and bool(self.retry_on_result(attempt.value))

    def call(self, fn, *args, **kwargs):
        state = RetryState(fn, args, kwargs)
        self.last_state = state
        start = self.clock()
        while True:
            state.attempt_number += 1
            if self.before is not None:
                self.before(state)
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:  # BaseException-only errors propagate untouched
                attempt = Attempt(state.attempt_number, exception=exc)
            else:
                attempt = Attempt(state.attempt_number, value=value)
            state.outcome = attempt
            state.elapsed = self.clock() - start
            state.next_wait = None
            if self.after is not None:
                self.after(state)

            if not self._should_retry(attempt):
                return attempt.result()
            if self.stop(state):
                if attempt.failed:
                    if self.reraise:
                        raise attempt.exception
                    raise RetryError(attempt) from attempt.exception
                raise RetryError(attempt)

            delay = max(0.0, float(self.wait(state)))
            state.next_wait = delay
            self.sleep(delay)
            state.idle_for += delay

    __call__ = call

    def wraps(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            return self.call(fn, *args, **kwargs)

        wrapped.retrying = self
        wrapped.retry_with = lambda **overrides: self.copy(**overrides).wraps(fn)
        return wrapped


def retry(fn=None, **options):
    """Decorator: ``@retry`` or ``@retry(stop=..., wait=..., ...)``."""
    if fn is not None:
        if options or not callable(fn):
            raise TypeError("use @retry or @retry(**options)")
        return Retrying().wraps(fn)
    retrying = Retrying(**options)
    return retrying.wraps
