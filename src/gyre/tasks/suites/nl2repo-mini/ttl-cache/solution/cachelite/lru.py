"""Least-recently-used cache."""

from collections import OrderedDict

from .base import CacheInfo, check_maxsize

_MISSING = object()


class LRUCache:
    """A mapping-like cache that evicts the least recently used entry when full."""

    def __init__(self, maxsize=128, on_evict=None):
        self._maxsize = check_maxsize(maxsize)
        self._on_evict = on_evict
        self._data = OrderedDict()
        self._hits = 0
        self._misses = 0

    @property
    def maxsize(self):
        return self._maxsize

    # -- hooks used by TTLCache ------------------------------------------------
    def _live(self, key):
        """Return True if key is stored and usable (no stats, no recency change)."""
        return key in self._data

    def _purge(self):
        pass

    def _store(self, key, value):
        self._data[key] = value

    def _unwrap(self, stored):
        return stored

    # -- reading ---------------------------------------------------------------
    def get(self, key, default=None):
        if self._live(key):
            self._hits += 1
            self._data.move_to_end(key)
            return self._unwrap(self._data[key])
        self._misses += 1
        return default

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def peek(self, key, default=None):
        if self._live(key):
            return self._unwrap(self._data[key])
        return default

    def __contains__(self, key):
        return self._live(key)

    def __len__(self):
        self._purge()
        return len(self._data)

    def keys(self):
        self._purge()
        return list(self._data)

    def values(self):
        self._purge()
        return [self._unwrap(v) for v in self._data.values()]

    def items(self):
        self._purge()
        return [(k, self._unwrap(v)) for k, v in self._data.items()]

    # -- writing ---------------------------------------------------------------
    def set(self, key, value):
        self._set(key, value, self._wrap(value))

    def _wrap(self, value):
        return value

    def _set(self, key, value, stored):
        if self._maxsize == 0:
            return
        self._purge()
        if key in self._data:
            self._data.move_to_end(key)
        self._store(key, stored)
        while self._maxsize is not None and len(self._data) > self._maxsize:
            old_key, old = self._data.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_key, self._unwrap(old))

    def __setitem__(self, key, value):
        self.set(key, value)

    def __delitem__(self, key):
        if not self._live(key):
            self._data.pop(key, None)
            raise KeyError(key)
        del self._data[key]

    def pop(self, key, default=_MISSING):
        if self._live(key):
            return self._unwrap(self._data.pop(key))
        self._data.pop(key, None)
        if default is _MISSING:
            raise KeyError(key)
        return default

    def clear(self):
        self._data.clear()
        self._hits = 0
        self._misses = 0

    def info(self):
        return CacheInfo(self._hits, self._misses, self._maxsize, len(self))

    def __repr__(self):
        return f"{type(self).__name__}(maxsize={self._maxsize!r}, currsize={len(self)})"
