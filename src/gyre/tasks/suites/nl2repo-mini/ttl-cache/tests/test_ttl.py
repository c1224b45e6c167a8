import pytest

from cachelite.base import CacheConfigError, CacheInfo
from cachelite.ttl import TTLCache


class FakeClock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def make(maxsize=10, ttl=10, **kw):
    clock = FakeClock(100.0)
    return TTLCache(maxsize=maxsize, ttl=ttl, timer=clock, **kw), clock


def test_defaults():
    c = TTLCache()
    assert c.maxsize == 128
    assert c.ttl == 600
    c["a"] = 1
    assert c["a"] == 1


def test_entry_expires_exactly_at_ttl():
    c, clock = make(ttl=10)
    c["a"] = 1
    clock.advance(9.999)
    assert c.get("a") == 1
    clock.advance(0.001)
    assert c.get("a") is None
    assert c.info() == CacheInfo(hits=1, misses=1, maxsize=10, currsize=0)


def test_expired_entries_are_invisible():
    c, clock = make(ttl=5)
    c["a"] = 1
    c["b"] = 2
    clock.advance(5)
    assert "a" not in c
    assert c.peek("a", "none") == "none"
    assert len(c) == 0
    assert c.keys() == [] and c.items() == [] and c.values() == []
    with pytest.raises(KeyError):
        c["b"]


def test_expired_delete_and_pop():
    c, clock = make(ttl=5)
    c["a"] = 1
    c["b"] = 2
    clock.advance(6)
    with pytest.raises(KeyError):
        del c["a"]
    with pytest.raises(KeyError):
        c.pop("b")
    assert c.pop("b", 0) == 0


def test_reading_does_not_refresh_expiry_but_setting_does():
    c, clock = make(ttl=10)
    c["a"] = 1
    c["b"] = 2
    clock.advance(6)
    assert c["a"] == 1
    c["b"] = 20
    clock.advance(6)
    assert "a" not in c
    assert c["b"] == 20


def test_per_item_ttl():
    c, clock = make(ttl=10)
    c.set("short", 1, ttl=1)
    c.set("long", 2, ttl=100)
    c.set("default", 3)
    clock.advance(1)
    assert c.keys() == ["long", "default"]
    clock.advance(50)
    assert c.keys() == ["long"]


def test_expires_in():
    c, clock = make(ttl=10)
    c["a"] = 1
    clock.advance(4)
    assert c.expires_in("a") == pytest.approx(6)
    with pytest.raises(KeyError):
        c.expires_in("missing")
    clock.advance(6)
    with pytest.raises(KeyError):
        c.expires_in("a")


def test_expire_returns_removed_keys_in_recency_order():
    c, clock = make(ttl=10)
    c["a"] = 1
    c["b"] = 2
    c["c"] = 3
    c.set("keep", 4, ttl=100)
    c.get("a")
    clock.advance(10)
    assert c.expire() == ["b", "c", "a"]
    assert c.keys() == ["keep"]
    assert c.expire() == []


def test_lru_eviction_still_applies():
    c, clock = make(maxsize=2, ttl=100)
    c["a"] = 1
    c["b"] = 2
    c.get("a")
    c["c"] = 3
    assert c.keys() == ["a", "c"]


def test_expired_entries_are_purged_before_evicting_live_ones():
    evicted = []
    c, clock = make(maxsize=2, ttl=5, on_evict=lambda k, v: evicted.append((k, v)))
    c["old"] = 1
    clock.advance(3)
    c["live"] = 2
    clock.advance(3)
    c["new"] = 3
    assert c.keys() == ["live", "new"]
    assert evicted == []
    c["newer"] = 4
    assert evicted == [("live", 2)]


def test_info_counts_only_live_entries():
    c, clock = make(ttl=5)
    c["a"] = 1
    c.set("b", 2, ttl=50)
    clock.advance(10)
    assert c.info().currsize == 1


@pytest.mark.parametrize("bad", [0, -1, "10", None])
def test_invalid_ttl(bad):
    with pytest.raises(CacheConfigError):
        TTLCache(ttl=bad)


def test_invalid_per_item_ttl():
    c, _ = make()
    with pytest.raises(CacheConfigError):
        c.set("a", 1, ttl=0)
    assert "a" not in c


def test_invalid_maxsize():
    with pytest.raises(CacheConfigError):
        TTLCache(maxsize=-5)


def test_uses_real_monotonic_clock_by_default():
    c = TTLCache(ttl=3600)
    c["a"] = 1
    assert 3599 < c.expires_in("a") <= 3600
    assert c.get("a") == 1
