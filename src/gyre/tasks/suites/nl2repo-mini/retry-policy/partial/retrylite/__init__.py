"""retrylite: a small retry library with composable stop and wait strategies."""

from .core import Attempt, RetryError, RetryState, Retrying, retry
from .stop import (
    StopStrategy,
    stop_after_attempt,
    stop_after_delay,
    stop_all,
    stop_any,
    stop_never,
)
from .wait import (
    WaitStrategy,
    wait_chain,
    wait_combine,
    wait_exponential,
    wait_fixed,
    wait_none,
    wait_random,
)

__all__ = [
    "Attempt",
    "RetryError",
    "RetryState",
    "Retrying",
    "StopStrategy",
    "WaitStrategy",
    "retry",
    "stop_after_attempt",
    "stop_after_delay",
    "stop_all",
    "stop_any",
    "stop_never",
    "wait_chain",
    "wait_combine",
    "wait_exponential",
    "wait_fixed",
    "wait_none",
    "wait_random",
]
