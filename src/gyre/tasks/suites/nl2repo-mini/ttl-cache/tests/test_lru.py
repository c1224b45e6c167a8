import pytest

from cachelite.base import CacheConfigError, CacheInfo
from cachelite.lru import LRUCache


def test_set_and_get_with_stats():
    c = LRUCache(maxsize=3)
    c.set("a", 1)
    c["b"] = 2
    assert c.get("a") == 1
    assert c["b"] == 2
    assert c.get("zzz") is None
    assert c.get("zzz", "dflt") == "dflt"
    assert c.info() == CacheInfo(hits=2, misses=2, maxsize=3, currsize=2)


def test_info_is_named_tuple():
    c = LRUCache(maxsize=5)
    info = c.info()
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (0, 0, 5, 0)


def test_default_maxsize():
    assert LRUCache().maxsize == 128


def test_evicts_least_recently_used():
    c = LRUCache(maxsize=2)
    c["a"] = 1
    c["b"] = 2
    c["c"] = 3
    assert "a" not in c
    assert c.keys() == ["b", "c"]


def test_get_refreshes_recency():
    c = LRUCache(maxsize=2)
    c["a"] = 1
    c["b"] = 2
    assert c["a"] == 1
    c["c"] = 3
    assert c.keys() == ["a", "c"]


def test_peek_and_contains_do_not_touch_recency_or_stats():
    c = LRUCache(maxsize=2)
    c["a"] = 1
    c["b"] = 2
    assert c.peek("a") == 1
    assert c.peek("nope", 0) == 0
    assert "a" in c and "nope" not in c
    c["c"] = 3
    assert c.keys() == ["b", "c"]
    assert c.info().hits == 0 and c.info().misses == 0


def test_update_existing_key_moves_to_most_recent_without_eviction():
    evicted = []
    c = LRUCache(maxsize=2, on_evict=lambda k, v: evicted.append((k, v)))
    c["a"] = 1
    c["b"] = 2
    c["a"] = 10
    assert evicted == []
    assert c.items() == [("b", 2), ("a", 10)]
    c["c"] = 3
    assert evicted == [("b", 2)]


def test_on_evict_called_only_for_capacity_evictions():
    evicted = []
    c = LRUCache(maxsize=1, on_evict=lambda k, v: evicted.append((k, v)))
    c["a"] = 1
    c["b"] = 2
    del c["b"]
    c["c"] = 3
    c.pop("c")
    c["d"] = 4
    c.clear()
    assert evicted == [("a", 1)]


def test_getitem_miss_raises_key_error_and_counts():
    c = LRUCache()
    with pytest.raises(KeyError):
        c["missing"]
    assert c.info().misses == 1


def test_none_values_are_stored():
    c = LRUCache()
    c["k"] = None
    assert "k" in c
    assert c.get("k", "dflt") is None
    assert c.info().hits == 1


def test_unbounded_cache():
    c = LRUCache(maxsize=None)
    for i in range(1000):
        c[i] = i * i
    assert len(c) == 1000
    assert c.info().maxsize is None
    assert c[0] == 0


def test_zero_maxsize_stores_nothing():
    evicted = []
    c = LRUCache(maxsize=0, on_evict=lambda k, v: evicted.append(k))
    c["a"] = 1
    assert len(c) == 0
    assert c.get("a") is None
    assert evicted == []
    assert c.info() == CacheInfo(0, 1, 0, 0)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_invalid_maxsize(bad):
    with pytest.raises(CacheConfigError):
        LRUCache(maxsize=bad)


def test_config_error_is_value_error():
    assert issubclass(CacheConfigError, ValueError)


def test_delete_and_pop():
    c = LRUCache()
    c["a"] = 1
    c["b"] = 2
    del c["a"]
    assert "a" not in c
    with pytest.raises(KeyError):
        del c["a"]
    assert c.pop("b") == 2
    assert c.pop("b", "gone") == "gone"
    with pytest.raises(KeyError):
        c.pop("b")
    assert len(c) == 0
    assert c.info().hits == 0 and c.info().misses == 0


def test_clear_resets_entries_and_stats():
    c = LRUCache(maxsize=4)
    c["a"] = 1
    c.get("a")
    c.get("b")
    c.clear()
    assert len(c) == 0
    assert c.info() == CacheInfo(0, 0, 4, 0)


def test_keys_values_items_in_recency_order():
    c = LRUCache()
    c["x"] = 1
    c["y"] = 2
    c["z"] = 3
    c.get("x")
    assert c.keys() == ["y", "z", "x"]
    assert c.values() == [2, 3, 1]
    assert c.items() == [("y", 2), ("z", 3), ("x", 1)]
