"""Least-recently-used cache."""

from collections import OrderedDict

from .base import CacheConfigError, CacheInfo

_MISSING = object()


class LRUCache:
    def __init__(self, maxsize=128, on_evict=None):
        if maxsize is not None and maxsize < 0:
            raise CacheConfigError("maxsize must be >= 0")
        self.maxsize = maxsize
        self.on_evict = on_evict
        self._data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        if key in self._data:
            self.hits += 1
            self._data.move_to_end(key)
            return self._data[key]
        self.misses += 1
        return default

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def peek(self, key, default=None):
        return self._data.get(key, default)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def keys(self):
        return list(self._data)

    def values(self):
        return list(self._data.values())

    def items(self):
        return list(self._data.items())

    def set(self, key, value):
        if self.maxsize == 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while self.maxsize is not None and len(self._data) > self.maxsize:
            k, v = self._data.popitem(last=False)
            if self.on_evict:
                self.on_evict(k, v)

    def __setitem__(self, key, value):
        self.set(key, value)

    def __delitem__(self, key):
        del self._data[key]

    def pop(self, key, default=_MISSING):
        if default is _MISSING:
            return self._data.pop(key)
        return self._data.pop(key, default)

    def clear(self):
        # TODO: should stats be reset too?
        self._data.clear()

    def info(self):
        return CacheInfo(self.hits, self.misses, self.maxsize, len(self._data))
