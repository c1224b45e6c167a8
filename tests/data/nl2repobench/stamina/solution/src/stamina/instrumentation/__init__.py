# SPDX-FileCopyrightText: 2022 Hynek Schlawack <hs@ox.cx>
#
# SPDX-License-Identifier: MIT

from __future__ import annotations

from ._data import RetryDetails, RetryHook, RetryHookFactory
from ._hooks import get_on_retry_hooks, set_on_retry_hooks
from ._logging import LoggingOnRetryHook
from ._prometheus import PrometheusOnRetryHook, get_prometheus_counter
from ._structlog import StructlogOnRetryHook


__all__ = [
    "LoggingOnRetryHook",
    "PrometheusOnRetryHook",
    "RetryDetails",
    "RetryHook",
    "RetryHookFactory",
    "StructlogOnRetryHook",
    "get_on_retry_hooks",
    "get_prometheus_counter",
    "set_on_retry_hooks",
]
