"""gyre.engine.embedded.cache.DecodeLanes: each running request's KV in one contiguous lane, within a budget."""

from __future__ import annotations

import pytest
import torch

from gyre.engine.embedded.cache import DecodeLanes

CPU = torch.device("cpu")
LAYERS, HEADS, HEAD_DIM = 2, 2, 3
DIM = HEADS * HEAD_DIM


def _lanes(budget: int, max_lanes: int = 8, lanes: int = 2, lane_len: int = 4) -> DecodeLanes:
    return DecodeLanes(
        LAYERS, HEADS, HEAD_DIM, budget, max_lanes, CPU, torch.float32, lanes=lanes, lane_len=lane_len
    )


def _kv(n: int, seed: float) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(LAYERS * n * DIM, dtype=torch.float32).view(LAYERS, n, DIM) + seed
    return k, -k


def _put(lanes: DecodeLanes, owner: object, n: int, seed: float) -> int:
    lane = lanes.assign(owner, n + 1)
    if lane >= 0:
        lanes.fill(lane, *_kv(n, seed))
    return lane


def _holds(lanes: DecodeLanes, owner: object, n: int, seed: float) -> bool:
    lane = lanes.lane(owner)
    k, v = _kv(n, seed)
    as_pool = (lanes.k[:, lane, :, :n].transpose(1, 2).reshape(LAYERS, n, DIM), lanes.v[:, lane, :, :n])
    head_major = v.view(LAYERS, n, HEADS, HEAD_DIM).transpose(1, 2)  # [layers, heads, n, head_dim]
    return bool(torch.equal(as_pool[0], k) and torch.equal(as_pool[1], head_major))


def test_lanes_are_allocated_on_first_use_and_hold_what_was_filled() -> None:
    lanes = _lanes(budget=64)
    assert lanes.capacity == (0, 0) and lanes.positions == 0
    a, b = object(), object()
    assert _put(lanes, a, 3, 0.0) == 0 and _put(lanes, b, 2, 100.0) == 1
    assert lanes.capacity == (2, 4) and lanes.count == 2
    assert _holds(lanes, a, 3, 0.0) and _holds(lanes, b, 2, 100.0)
    assert lanes.lengths == [3, 2]


def test_growth_doubles_lanes_then_length_and_keeps_contents() -> None:
    lanes = _lanes(budget=64)
    owners = [object() for _ in range(4)]
    for i, o in enumerate(owners):
        assert _put(lanes, o, 3, 10.0 * i) == i
    assert lanes.capacity == (4, 4)  # two more lanes: doubled
    assert lanes.reserve(9)  # a request outgrows its lane: every lane lengthens to 16
    assert lanes.capacity == (4, 16) and lanes.positions == 64
    assert all(_holds(lanes, o, 3, 10.0 * i) for i, o in enumerate(owners))


def test_release_moves_the_last_lane_into_the_hole() -> None:
    lanes = _lanes(budget=64)
    a, b, c = object(), object(), object()
    _put(lanes, a, 1, 0.0), _put(lanes, b, 2, 10.0), _put(lanes, c, 3, 20.0)
    lanes.release(a)
    assert lanes.lane(a) == -1 and lanes.lane(c) == 0 and lanes.lane(b) == 1 and lanes.count == 2
    assert _holds(lanes, c, 3, 20.0) and _holds(lanes, b, 2, 10.0)
    lanes.release(b)  # the last lane: nothing moves
    assert lanes.owners == [c] and _holds(lanes, c, 3, 20.0)
    lanes.release(object())  # never had a lane: nothing happens
    assert lanes.count == 1


def test_over_budget_requests_get_no_lane_and_storage_stays_within_it() -> None:
    lanes = _lanes(budget=16, max_lanes=8)
    owners = [object() for _ in range(5)]
    placed = [_put(lanes, o, 2, float(i)) for i, o in enumerate(owners)]
    assert placed == [0, 1, 2, 3, -1]  # 4 lanes of 4 fill the budget: the fifth falls back to the gather path
    assert lanes.positions <= 16
    assert not lanes.reserve(5)  # lengthening 4 lanes to 8 would need 32 positions
    assert lanes.capacity == (4, 4)
    assert lanes.assign(object(), 17) == -1  # longer than the whole budget


def test_lanes_stop_at_max_lanes() -> None:
    lanes = _lanes(budget=1000, max_lanes=3)
    assert [_put(lanes, object(), 1, 0.0) for _ in range(4)] == [0, 1, 2, -1]
    assert lanes.capacity[0] == 3


@pytest.mark.parametrize("budget", [0, 3])
def test_a_budget_too_small_for_one_lane_disables_lanes(budget: int) -> None:
    lanes = DecodeLanes(LAYERS, HEADS, HEAD_DIM, budget, 8, CPU, torch.float32)
    assert not lanes.enabled
    assert lanes.assign(object(), 1) == -1 and lanes.positions == 0
