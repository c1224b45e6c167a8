"""The memoize decorator."""

import functools
import time

from .base import UnhashableKeyError, check_maxsize, check_ttl
from .lru import LRUCache
from .ttl import TTLCache

_MISSING = object()
_KWD_MARK = object()


class _TypedMark:
    def __repr__(self):
        return "<typed>"


_TYPED_MARK = _TypedMark()


def make_key(args, kwargs, typed=False):
    key = tuple(args)
    items = sorted(kwargs.items())
    if items:
        key += (_KWD_MARK,) + tuple(items)
    if typed:
        key += (_TYPED_MARK,) + tuple(type(a) for a in args)
        key += tuple(type(v) for _, v in items)
    try:
        hash(key)
    except TypeError as exc:
        raise UnhashableKeyError(f"unhashable argument: {exc}") from None
    return key


def memoize(func=None, *, maxsize=128, ttl=None, typed=False, timer=time.monotonic, cache=None):
    if cache is None:
        check_maxsize(maxsize)
        if ttl is not None:
            check_ttl(ttl)

    def decorator(fn):
        if cache is not None:
            store = cache
        elif ttl is None:
            store = LRUCache(maxsize)
        else:
            store = TTLCache(maxsize, ttl, timer)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key = make_key(args, kwargs, typed)
            result = store.get(key, _MISSING)
            if result is not _MISSING:
                return result
            result = fn(*args, **kwargs)
            store.set(key, result)
            return result

        wrapper.cache = store
        wrapper.cache_info = store.info
        wrapper.cache_clear = store.clear
        return wrapper

    if func is not None:
        return decorator(func)
    return decorator
