"""cachelite: LRU and TTL caches plus a memoize decorator."""

from .base import CacheConfigError, CacheError, CacheInfo, UnhashableKeyError
from .lru import LRUCache
from .memo import make_key, memoize
from .ttl import TTLCache

__all__ = [
    "CacheConfigError",
    "CacheError",
    "CacheInfo",
    "LRUCache",
    "TTLCache",
    "UnhashableKeyError",
    "make_key",
    "memoize",
]
