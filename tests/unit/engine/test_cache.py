"""gyre.engine.embedded.cache: the KV slot pool and the radix tree that shares the KV of common prefixes."""

from __future__ import annotations

import torch

from gyre.engine.embedded.cache import RadixCache, SlotPool

CPU = torch.device("cpu")


def _cache(size: int = 64, enabled: bool = True) -> tuple[SlotPool, RadixCache]:
    pool = SlotPool(size, CPU)
    return pool, RadixCache(pool, enabled=enabled)


def _add(pool: SlotPool, cache: RadixCache, ids: list[int]) -> torch.Tensor:
    """Compute ``ids`` from scratch and hand them to the tree (the engine's import_kv contract)."""
    slots = pool.alloc(len(ids))
    assert slots is not None
    keep = cache.insert(ids, slots)
    pool.free(slots[:keep])
    return slots


def _matched(cache: RadixCache, ids: list[int]) -> list[int]:
    return cache.match(ids)[0].tolist()


def test_pool_hands_out_distinct_slots_until_empty() -> None:
    pool = SlotPool(8, CPU)
    a, b = pool.alloc(5), pool.alloc(3)
    assert a is not None and b is not None
    assert sorted(a.tolist() + b.tolist()) == list(range(8))
    assert pool.alloc(1) is None and pool.available == 0
    pool.free(a[:2])
    assert pool.available == 2
    again = pool.alloc(2)
    assert again is not None and sorted(again.tolist()) == sorted(a[:2].tolist())


def test_match_after_insert_returns_the_same_slots() -> None:
    pool, cache = _cache()
    slots = _add(pool, cache, [5, 6, 7, 8])
    assert _matched(cache, [5, 6, 7, 8]) == slots.tolist()
    assert _matched(cache, [5, 6, 7, 8, 9, 10]) == slots.tolist()  # longer query: the cached prefix
    assert _matched(cache, [6, 5]) == []
    assert cache.cached_tokens == 4 and pool.available == 60


def test_partial_match_splits_a_node_and_returns_the_right_slots() -> None:
    pool, cache = _cache()
    slots = _add(pool, cache, [1, 2, 3, 4])
    prefix, node = cache.match([1, 2, 9])
    assert prefix.tolist() == slots[:2].tolist()
    assert node.key == [1, 2]  # the node was split to end exactly where the match ends
    assert _matched(cache, [1, 2, 3, 4]) == slots.tolist()  # the lower half is still reachable
    assert cache.cached_tokens == 4

    other = pool.alloc(4)
    assert other is not None
    assert cache.insert([1, 2, 5, 6], other) == 2  # the tree already had the first two tokens
    pool.free(other[:2])
    assert _matched(cache, [1, 2, 5, 6]) == slots[:2].tolist() + other[2:].tolist()
    assert _matched(cache, [1, 2, 3, 4]) == slots.tolist()
    assert cache.cached_tokens == 6 and pool.available == 64 - 6


def test_insert_of_a_cached_sequence_takes_nothing() -> None:
    pool, cache = _cache()
    first = _add(pool, cache, [1, 2, 3])
    dup = pool.alloc(2)
    assert dup is not None
    assert cache.insert([1, 2], dup) == 2
    pool.free(dup)
    assert _matched(cache, [1, 2, 3]) == first.tolist()
    assert pool.available + cache.cached_tokens == 64


def test_lock_prevents_eviction_until_unlocked() -> None:
    pool, cache = _cache()
    kept = _add(pool, cache, [1, 2, 3])
    _add(pool, cache, [7, 8])
    _, node = cache.match([1, 2, 3])
    cache.lock(node)
    assert cache.evictable_tokens == 2
    assert cache.evict(100) == 2
    assert _matched(cache, [1, 2, 3]) == kept.tolist()
    assert _matched(cache, [7, 8]) == []
    cache.unlock(node)
    assert cache.evictable_tokens == 3
    assert cache.evict(100) == 3
    assert cache.cached_tokens == 0 and pool.available == 64


def test_locking_part_of_a_node_protects_that_part() -> None:
    pool, cache = _cache()
    slots = _add(pool, cache, [1, 2, 3, 4])
    _, node = cache.match([1, 2])  # splits [1, 2, 3, 4] into [1, 2] -> [3, 4]
    cache.lock(node)
    assert cache.evictable_tokens == 2
    assert cache.evict(100) == 2  # only [3, 4] may go
    assert _matched(cache, [1, 2, 3, 4]) == slots[:2].tolist()
    cache.unlock(node)
    assert cache.flush() == 2 and pool.available == 64


def test_evict_frees_least_recently_used_first() -> None:
    pool, cache = _cache()
    for ids in ([1, 1], [2, 2], [3, 3]):
        _add(pool, cache, ids)
    cache.match([1, 1])  # [2, 2] is now the least recently used
    assert cache.evict(2) == 2
    assert _matched(cache, [2, 2]) == []
    assert len(_matched(cache, [1, 1])) == 2 and len(_matched(cache, [3, 3])) == 2
    assert cache.evict(1) == 2  # whole leaves go: at least the tokens asked for
    assert len(_matched(cache, [3, 3])) == 2  # [1, 1] was used before [3, 3] was
    assert pool.available == 62


def test_evict_reaches_inner_nodes_once_their_children_are_gone() -> None:
    pool, cache = _cache()
    _add(pool, cache, [1, 2, 3])
    _add(pool, cache, [1, 2, 4])  # tree: [1, 2] -> {[3], [4]}
    assert cache.cached_tokens == 4
    freed = cache.evict(3)
    assert freed >= 3 and freed == pool.available - 60
    assert cache.evict(100) == 4 - freed
    assert cache.cached_tokens == 0 and cache.evictable_tokens == 0 and pool.available == 64


def test_invalidate_frees_unlocked_entries_and_never_matches_old_ones() -> None:
    pool, cache = _cache()
    _add(pool, cache, [1, 2, 3])
    _add(pool, cache, [4, 5])
    _, node = cache.match([1, 2, 3])
    cache.lock(node)  # a running request still reads these slots
    cache.invalidate()
    assert pool.available == 64 - 3 and cache.cached_tokens == 3
    assert _matched(cache, [1, 2, 3]) == []
    assert _matched(cache, [4, 5]) == []
    assert (
        cache.insert([1, 9], torch.tensor([40, 41])) == 2
    )  # a stale path still in use: the tree takes nothing
    cache.unlock(node)
    assert cache.evictable_tokens == 3
    fresh = _add(pool, cache, [1, 2, 3])  # replaces the stale, now unlocked entry
    assert _matched(cache, [1, 2, 3]) == fresh.tolist()
    assert cache.cached_tokens == 3 and pool.available == 61


def test_disabled_cache_never_matches_and_takes_nothing() -> None:
    pool, cache = _cache(enabled=False)
    slots = pool.alloc(3)
    assert slots is not None
    assert cache.insert([1, 2, 3], slots) == 3
    pool.free(slots)
    assert _matched(cache, [1, 2, 3]) == []
    assert cache.cached_tokens == 0 and pool.available == 64
