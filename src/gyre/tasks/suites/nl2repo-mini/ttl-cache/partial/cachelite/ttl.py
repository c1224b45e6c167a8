"""LRU cache with expiry (work in progress)."""

import time

from .base import CacheConfigError
from .lru import LRUCache


class TTLCache(LRUCache):
    def __init__(self, maxsize=128, ttl=600, timer=time.monotonic, on_evict=None):
        super().__init__(maxsize, on_evict)
        if not ttl or ttl < 0:
            raise CacheConfigError("ttl must be > 0")
        self.ttl = ttl
        self.timer = timer
        self._expiry = {}

    def set(self, key, value, ttl=None):
        super().set(key, value)
        self._expiry[key] = self.timer() + (ttl or self.ttl)

    def _check(self, key):
        if key in self._data and self.timer() > self._expiry[key]:
            del self._data[key]
            del self._expiry[key]

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._check(key)
        return super().__contains__(key)

    def expire(self):
        raise NotImplementedError

    def expires_in(self, key):
        raise NotImplementedError
