"""LRU cache whose entries also expire after a time-to-live."""

import time

from .base import check_ttl
from .lru import LRUCache


class TTLCache(LRUCache):
    """An LRU cache whose entries expire ``ttl`` seconds after they were set."""

    def __init__(self, maxsize=128, ttl=600, timer=time.monotonic, on_evict=None):
        super().__init__(maxsize, on_evict)
        self._ttl = check_ttl(ttl)
        self._timer = timer

    @property
    def ttl(self):
        return self._ttl

    def _expired(self, stored, now):
        return now >= stored[1]

    def _live(self, key):
        stored = self._data.get(key)
        if stored is None:
            return False
        if self._expired(stored, self._timer()):
            del self._data[key]
            return False
        return True

    def _purge(self):
        self.expire()

    def _unwrap(self, stored):
        return stored[0]

    def _wrap(self, value, ttl=None):
        ttl = self._ttl if ttl is None else check_ttl(ttl)
        return (value, self._timer() + ttl)

    def set(self, key, value, ttl=None):
        self._set(key, value, self._wrap(value, ttl))

    def expire(self):
        now = self._timer()
        dead = [k for k, stored in self._data.items() if self._expired(stored, now)]
        for k in dead:
            del self._data[k]
        return dead

    def expires_in(self, key):
        if not self._live(key):
            raise KeyError(key)
        return self._data[key][1] - self._timer()
