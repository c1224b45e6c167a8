"""KV memory: a token-granular slot pool and a radix tree that shares the KV of common prefixes.

One slot holds one token's keys and values in every layer. The radix tree owns the slots of the tokens it holds;
a running request owns the slots it computed beyond its cached prefix and locks the tree path it reuses, so locked
nodes are never evicted. Eviction frees least-recently-used unlocked leaves.
"""

from __future__ import annotations

import heapq
import itertools

import torch


class SlotPool:
    """Free-list of KV slot indices; all operations are O(slots moved)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self._free = torch.arange(size, dtype=torch.int64, device=device)
        self._n_free = size

    @property
    def available(self) -> int:
        """Slots not held by anything."""
        return self._n_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` free slots, or None when fewer are free."""
        if n > self._n_free:
            return None
        self._n_free -= n
        return self._free[self._n_free : self._n_free + n].clone()

    def free(self, slots: torch.Tensor) -> None:
        """Return slots to the pool."""
        n = slots.numel()
        if n:
            self._free[self._n_free : self._n_free + n] = slots
            self._n_free += n


class _Node:
    __slots__ = ("children", "generation", "key", "last_access", "lock", "parent", "slots")
    _clock = itertools.count()

    def __init__(self, key: list[int], slots: torch.Tensor, parent: _Node | None, generation: int) -> None:
        self.key = key
        self.slots = slots
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.lock = 0
        self.generation = generation
        self.last_access = next(self._clock)


class RadixCache:
    """Prefix tree over token ids whose nodes hold KV slots.

    ``generation`` is bumped by a weight update: nodes from an older generation are never matched again and are
    evicted once unlocked, so no request reuses KV computed with stale weights.
    """

    def __init__(self, pool: SlotPool, enabled: bool = True) -> None:
        self.pool = pool
        self.enabled = enabled
        self.generation = 0
        self.root = _Node([], torch.empty(0, dtype=torch.int64), None, 0)
        self.root.lock = 1
        self.cached_tokens = 0  # tokens held by the tree
        self.evictable_tokens = 0  # tokens held by unlocked nodes

    def match(self, ids: list[int]) -> tuple[torch.Tensor, _Node]:
        """Slots of the longest cached prefix of ``ids`` and the node where it ends (split to end exactly)."""
        node, pieces, i = self.root, [], 0
        if not self.enabled:
            return self.root.slots, self.root
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None or child.generation != self.generation:
                break
            key = child.key
            n = _common(key, ids, i)
            if n < len(key):
                child = self._split(child, n)
            child.last_access = next(_Node._clock)
            pieces.append(child.slots)
            node, i = child, i + n
            if n < len(key):
                break
        slots = torch.cat(pieces) if pieces else self.root.slots
        return slots, node

    def insert(self, ids: list[int], slots: torch.Tensor) -> int:
        """Add ``ids`` with their ``slots``; return how many leading slots the tree did not take.

        The caller keeps responsibility for ``slots[:returned]`` (it frees those it owns); the tree owns the rest.
        """
        if not self.enabled:
            return len(ids)
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                break
            if child.generation != self.generation:
                if child.lock:
                    return len(ids)  # a stale path still in use: the tree takes nothing
                self._remove_subtree(child)
                break
            n = _common(child.key, ids, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_Node._clock)
            node, i = child, i + n
        if i < len(ids):
            leaf = _Node(ids[i:], slots[i:].clone(), node, self.generation)
            node.children[ids[i]] = leaf
            self.cached_tokens += len(leaf.key)
            self.evictable_tokens += len(leaf.key)
        return i

    def lock(self, node: _Node) -> None:
        """Protect the path root..node from eviction (a running request uses it)."""
        while node is not self.root:
            if node.lock == 0:
                self.evictable_tokens -= len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: _Node) -> None:
        """Undo one ``lock``."""
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable_tokens += len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, n_tokens: int) -> int:
        """Free at least ``n_tokens`` slots from unlocked leaves, least recently used first; return freed."""
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock == 0]
        heapq.heapify(leaves)
        freed = 0
        while leaves and freed < n_tokens:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            freed += self._drop(leaf)
            if parent is not None and parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return freed

    def flush(self) -> int:
        """Evict everything not locked by a running request; return freed slots."""
        return self.evict(self.cached_tokens)

    def invalidate(self) -> None:
        """Weights changed: drop every unlocked entry and never match the rest again."""
        self.generation += 1
        self.flush()

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _drop(self, leaf: _Node) -> int:
        assert leaf.parent is not None and not leaf.children and leaf.lock == 0
        del leaf.parent.children[leaf.key[0]]
        self.pool.free(leaf.slots)
        self.cached_tokens -= len(leaf.key)
        self.evictable_tokens -= len(leaf.key)
        return len(leaf.key)

    def _remove_subtree(self, node: _Node) -> None:
        for child in list(node.children.values()):
            if child.lock == 0:
                self._remove_subtree(child)
        if not node.children and node.lock == 0:
            self._drop(node)

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node`` after its first ``n`` tokens; return the new upper part."""
        assert node.parent is not None
        upper = _Node(node.key[:n], node.slots[:n], node.parent, node.generation)
        upper.lock, upper.last_access = node.lock, node.last_access
        node.parent.children[node.key[0]] = upper
        node.key, node.slots, node.parent = node.key[n:], node.slots[n:], upper
        upper.children[node.key[0]] = node
        return upper


def _common(key: list[int], ids: list[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``ids[start:]``."""
    n = min(len(key), len(ids) - start)
    if key[:n] == ids[start : start + n]:
        return n
    lo, hi = 0, n  # binary search for the first mismatch: list slices compare in C
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key[:mid] == ids[start : start + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecodeLanes:
    """Running requests' keys and values, each in one contiguous lane, so batched decode attention reads a strided
    view of lanes ``0..n-1`` instead of gathering every row from the slot pool at every step.

    Storage is ``[layers, lanes, kv_heads, lane_len, head_dim]`` for keys and the same for values (head-major:
    attention reads each head's keys as one contiguous run, ~30% less time than token-major rows on a cold cache),
    allocated on first use and grown (lanes, then lane length, doubling) while ``lanes * lane_len`` stays within
    ``budget`` token positions. Growing copies into new storage, so for a moment the old and new ones coexist: at
    most 1.5 ``budget`` positions, which the engine carves out of the KV budget, so the pool and the lanes together
    never exceed it. A request that does not fit gets no lane (or loses it) and decodes through the gather path.
    Lanes stay compact: when one is freed, the last lane moves into it, so lanes ``0..count-1`` are always occupied.
    The pool keeps every token too (the prefix cache takes a finished request's KV from it); a lane is a copy,
    written alongside.
    """

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        budget: int,
        max_lanes: int,
        device: torch.device,
        dtype: torch.dtype,
        lanes: int = 8,
        lane_len: int = 256,
    ) -> None:
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.budget, self.max_lanes = budget, max_lanes
        self.device, self.dtype = device, dtype
        self._lanes, self._lane_len = min(lanes, max_lanes), lane_len
        while self._lanes * self._lane_len > budget and self._lane_len > 16:
            self._lane_len //= 2
        while self._lanes * self._lane_len > budget and self._lanes > 1:
            self._lanes //= 2
        self.enabled = self._lanes * self._lane_len <= budget
        self.k = self.v = torch.empty(0, device=device, dtype=dtype)
        self.owners: list[object] = []  # lane -> the request in it
        self.lengths: list[int] = []  # lane -> tokens it holds
        self._lane: dict[object, int] = {}

    @property
    def count(self) -> int:
        """Occupied lanes."""
        return len(self.owners)

    @property
    def capacity(self) -> tuple[int, int]:
        """(lanes, lane length) of the storage as allocated now; (0, 0) before first use."""
        return (self.k.shape[1], self.k.shape[3]) if self.k.dim() == 5 else (0, 0)

    @property
    def positions(self) -> int:
        """Token positions allocated (lanes * lane length), at most ``budget``."""
        lanes, length = self.capacity
        return lanes * length

    def lane(self, owner: object) -> int:
        """The lane holding ``owner``, or -1."""
        return self._lane.get(owner, -1)

    def assign(self, owner: object, room: int) -> int:
        """Give ``owner`` a lane with space for ``room`` tokens (fill it with `fill`); -1 when the budget does not
        allow it."""
        assert owner not in self._lane
        if not self.enabled or room > self.budget:
            return -1
        if self.k.dim() != 5:
            self._resize(self._lanes, self._lane_len)
        lanes, length = self.capacity
        if self.count == lanes and (
            lanes >= self.max_lanes or not self._resize(min(2 * lanes, self.max_lanes), length)
        ):
            return -1
        if not self.reserve(room):
            return -1
        lane = self.count
        self.owners.append(owner)
        self.lengths.append(0)
        self._lane[owner] = lane
        return lane

    def fill(self, lane: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put ``k``/``v`` ([layers, n, kv_heads * head_dim], as in the pool) at the start of ``lane``."""
        n = k.shape[1]
        self.k[:, lane, :, :n] = k.view(self.num_layers, n, self.kv_heads, self.head_dim).transpose(1, 2)
        self.v[:, lane, :, :n] = v.view(self.num_layers, n, self.kv_heads, self.head_dim).transpose(1, 2)
        self.lengths[lane] = n

    def reserve(self, room: int) -> bool:
        """Make every lane able to hold ``room`` tokens, lengthening them if needed; False over budget."""
        lanes, length = self.capacity
        if room <= length:
            return True
        new = length
        while new < room:
            new *= 2
        return self._resize(lanes, new)

    def release(self, owner: object) -> None:
        """Free ``owner``'s lane (if any); the last lane moves into it."""
        lane = self._lane.pop(owner, -1)
        if lane < 0:
            return
        last = self.count - 1
        if lane != last:
            moved, n = self.owners[last], self.lengths[last]
            self.k[:, lane, :, :n] = self.k[:, last, :, :n]
            self.v[:, lane, :, :n] = self.v[:, last, :, :n]
            self.owners[lane], self.lengths[lane] = moved, n
            self._lane[moved] = lane
        self.owners.pop()
        self.lengths.pop()

    def _resize(self, lanes: int, length: int) -> bool:
        if lanes * length > self.budget:
            return False
        shape = (self.num_layers, lanes, self.kv_heads, length, self.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros_like(k)
        if self.k.dim() == 5 and self.count:
            old = self.k.shape[3]
            k[:, : self.count, :, :old] = self.k[:, : self.count]
            v[:, : self.count, :, :old] = self.v[:, : self.count]
        self.k, self.v = k, v
        return True
