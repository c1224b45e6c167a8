"""Shared pieces: statistics tuple and exceptions."""

from collections import namedtuple

CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])


class CacheError(Exception):
    """Base class for cachelite errors."""


class CacheConfigError(CacheError, ValueError):
    """Invalid cache configuration (maxsize, ttl)."""


class UnhashableKeyError(CacheError, TypeError):
    """A memoized function was called with an unhashable argument."""


def check_maxsize(maxsize):
    if maxsize is None:
        return None
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise CacheConfigError(f"maxsize must be None or an int >= 0, got {maxsize!r}")
    return maxsize


def check_ttl(ttl):
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise CacheConfigError(f"ttl must be a number > 0, got {ttl!r}")
    return ttl
