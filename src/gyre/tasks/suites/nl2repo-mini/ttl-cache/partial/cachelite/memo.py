"""The memoize decorator."""

import functools
import time

from .lru import LRUCache
from .ttl import TTLCache


def make_key(args, kwargs, typed=False):
    # TODO: typed keys
    key = (tuple(args), frozenset(kwargs.items()))
    hash(key)
    return key


def memoize(func=None, *, maxsize=128, ttl=None, typed=False, timer=time.monotonic, cache=None):
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
            result = store.get(key)
            if result is None:
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
