"""How the core cell cuts the flat parameter space into its ranks' shards (``shard_bounds``)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gyre.train.sharded import shard_bounds


@given(numel=st.integers(0, 10**10), world=st.integers(1, 512))
def test_shards_partition_the_flat_space_evenly(numel: int, world: int) -> None:
    bounds = shard_bounds(numel, world)
    assert len(bounds) == world
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(
        end == start for (_, end), (start, _) in itertools.pairwise(bounds)
    )  # contiguous, in rank order
    # no rank holds more than 1/N rounded up; full shards first, then at most one partial one, then empty ones
    share = -(-numel // world)
    sizes = [end - start for start, end in bounds]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == share
    assert sum(1 for size in sizes if 0 < size < share) <= 1
