"""gyre.engine.weight_sync.plan_buckets: how a push is cut into update calls."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gyre.engine.weight_sync import flat_bytes, plan_buckets, split_bytes
from gyre.errors import ConfigError


@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 4000))
def test_buckets_keep_order_fit_the_limit_and_only_a_large_tensor_goes_alone(
    sizes: list[int], limit: int
) -> None:
    plan = plan_buckets(sizes, limit)
    assert [i for bucket in plan for i in bucket] == list(range(len(sizes)))  # every tensor once, in order
    for bucket in plan:
        total = sum(sizes[i] for i in bucket)
        assert len(bucket) >= 1
        assert total <= limit or len(bucket) == 1  # over a bucket only alone
    for this, following in itertools.pairwise(plan):  # greedy: the next tensor did not fit
        assert sum(sizes[i] for i in this) + sizes[following[0]] > limit


def test_no_limit_is_one_bucket_and_a_limit_must_be_positive() -> None:
    assert plan_buckets([3, 5, 7], None) == [range(0, 3)]
    assert plan_buckets([], 10) == []
    assert plan_buckets([4, 20, 4, 4], 10) == [range(0, 1), range(1, 2), range(2, 4)]
    with pytest.raises(ConfigError):
        plan_buckets([1], 0)


def test_a_bucket_of_one_buffers_views_is_sent_without_a_copy() -> None:
    flat = torch.arange(12, dtype=torch.float32)
    views = [flat[0:4].view(2, 2), flat[4:10].view(3, 2), flat[10:12]]
    sent = flat_bytes(views[1:])
    assert sent.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() and sent.numel() == 32
    back = split_bytes(sent, [torch.float32, torch.float32], [[3, 2], [2]])
    assert torch.equal(back[0], views[1]) and torch.equal(back[1], views[2])
