"""Random request traffic against the prefix cache, driven as the scheduler drives it, checked against a model.

The model writes, for every slot it allocates, the token prefix whose KV that slot holds. Whatever the tree does
(split, share, evict, invalidate), a matched slot must still hold the KV of exactly the prefix it is matched for,
and every slot must be owned by exactly one of: the free list, the tree, a running request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gyre.engine.embedded.cache import RadixCache, SlotPool, _Node

SIZE = 32
token_ids = st.lists(st.integers(0, 2), min_size=1, max_size=8)  # a small alphabet: prefixes are shared


@dataclass
class Running:
    ids: list[int]
    slots: torch.Tensor  # all of ids; [:cached] belong to the tree, [cached:] to the request
    cached: int
    node: _Node
    generation: int


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = SlotPool(SIZE, torch.device("cpu"))
        self.cache = RadixCache(self.pool)
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the prefix whose KV was last written into it
        self.running: list[Running] = []
        self.inserted: set[tuple[int, ...]] = set()  # prefixes handed to the tree in this generation

    # ---- the scheduler's side of the contract ---------------------------------------------------------------
    def _alloc(self, n: int) -> torch.Tensor | None:
        slots = self.pool.alloc(n)
        if slots is None and self.cache.evictable_tokens:
            self.cache.evict(n - self.pool.available)
            slots = self.pool.alloc(n)
        return slots

    def _compute(self, ids: list[int], slots: torch.Tensor, start: int) -> None:
        for j in range(start, len(ids)):
            self.kv[int(slots[j])] = tuple(ids[: j + 1])

    def _blocked(self, ids: list[int]) -> bool:
        """A request from an older generation still locks a path starting with ids[0]."""
        return any(
            r.generation != self.cache.generation and r.cached and r.ids[0] == ids[0] for r in self.running
        )

    def _check_match(self, ids: list[int]) -> torch.Tensor:
        slots, node = self.cache.match(ids)
        n = slots.shape[0]
        assert n <= len(ids)
        assert [self.kv.get(s) for s in slots.tolist()] == [tuple(ids[: j + 1]) for j in range(n)]
        assert n == 0 or tuple(ids[:n]) in self.inserted  # never more than this generation put in
        assert _path(node) == ids[:n]
        return slots

    def _give(self, ids: list[int], slots: torch.Tensor) -> int:
        """Insert and check that the whole sequence is matchable right after (unless a stale path blocks it)."""
        blocked = self._blocked(ids)
        keep = self.cache.insert(ids, slots)
        if blocked:
            assert keep == len(ids)
        else:
            self.inserted.update(tuple(ids[: j + 1]) for j in range(len(ids)))
        return keep

    @rule(ids=token_ids)
    def admit(self, ids: list[int]) -> None:
        prefix, node = self.cache.match(ids[:-1])  # at least one token is computed
        self._check_match(ids[:-1])
        self.cache.lock(node)
        cached = prefix.shape[0]
        rest = self._alloc(len(ids) - cached)
        if rest is None:
            self.cache.unlock(node)
            return
        slots = torch.cat([prefix, rest])
        self._compute(ids, slots, cached)
        self.running.append(Running(ids, slots, cached, node, self.cache.generation))

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 1000))
    def release(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        keep = len(req.ids)
        if req.generation == self.cache.generation:
            keep = self._give(req.ids, req.slots)
            assert keep >= req.cached
        if keep > req.cached:
            self.pool.free(req.slots[req.cached : keep])
        self.cache.unlock(req.node)
        if req.generation == self.cache.generation and not self._blocked(req.ids):
            again = self._check_match(req.ids)
            assert again.shape[0] == len(req.ids)
            assert again[: req.cached].tolist() == req.slots[: req.cached].tolist()

    @rule(ids=token_ids)
    def import_kv(self, ids: list[int]) -> None:
        slots = self._alloc(len(ids))
        if slots is None:
            return
        self._compute(ids, slots, 0)
        keep = self._give(ids, slots)
        self.pool.free(slots[:keep])
        if not self._blocked(ids):
            assert self._check_match(ids).shape[0] == len(ids)

    @rule(ids=token_ids)
    def match(self, ids: list[int]) -> None:
        self._check_match(ids)

    @rule(n=st.integers(0, SIZE))
    def evict(self, n: int) -> None:
        available, evictable = self.pool.available, self.cache.evictable_tokens
        freed = self.cache.evict(n)
        assert freed == self.pool.available - available
        assert min(n, evictable) <= freed <= evictable
        assert self.cache.evictable_tokens == evictable - freed

    @rule()
    def invalidate(self) -> None:
        self.cache.invalidate()
        self.inserted.clear()
        assert self.cache.evictable_tokens == 0
        for req in self.running:
            assert self.cache.match(req.ids)[0].shape[0] == 0

    # ---- invariants -----------------------------------------------------------------------------------------
    @invariant()
    def locked_prefixes_stay_matchable(self) -> None:
        for req in self.running:
            assert _path(req.node) == req.ids[: req.cached]
            if req.generation == self.cache.generation:
                assert self.cache.match(req.ids[: req.cached])[0].tolist() == req.slots[: req.cached].tolist()

    @invariant()
    def every_slot_has_exactly_one_owner(self) -> None:
        free = self.pool._free[: self.pool.available].tolist()
        tree: list[int] = []
        locks: dict[int, int] = {}
        for req in self.running:
            node = req.node
            while node.parent is not None:
                locks[id(node)] = locks.get(id(node), 0) + 1
                node = node.parent
        cached = evictable = 0
        stack: list[tuple[_Node, list[int]]] = [(c, []) for c in self.cache.root.children.values()]
        while stack:
            node, above = stack.pop()
            path = above + node.key
            assert node.slots.shape[0] == len(node.key) > 0
            first = len(above)
            assert [self.kv.get(s) for s in node.slots.tolist()] == [
                tuple(path[: first + j + 1]) for j in range(len(node.key))
            ]
            assert node.lock == locks.get(id(node), 0)
            tree += node.slots.tolist()
            cached += len(node.key)
            evictable += len(node.key) if node.lock == 0 else 0
            stack += [(c, path) for c in node.children.values()]
        private = [s for r in self.running for s in r.slots[r.cached :].tolist()]
        owned = free + tree + private
        assert len(owned) == len(set(owned)) == SIZE  # no slot leaked, none owned twice
        assert self.cache.cached_tokens == cached
        assert self.cache.evictable_tokens == evictable


def _path(node: _Node) -> list[int]:
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return [t for key in reversed(keys) for t in key]


CacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_cache_under_random_traffic = CacheMachine.TestCase
