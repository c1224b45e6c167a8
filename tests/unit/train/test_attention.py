"""Ancestor-only attention over key ranges: the same numbers as a dense ancestor mask, and nothing quadratic kept."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gyre.train.attention import key_ranges, segment_attention
from gyre.train.loss import chain_segments, tree_segments


def _tree(n: int, seed: int, branch: float = 0.1) -> list[int]:
    rng = random.Random(seed)
    return [-1] + [i - 1 if rng.random() > branch else rng.randrange(i) for i in range(1, n)]


def _dense(parents: list[int]) -> torch.Tensor:
    """``mask[i, j]``: token j is token i or one of its ancestors."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _qkv(n: int, heads: int = 3, dim: int = 16) -> list[torch.Tensor]:
    return [torch.randn(1, heads, n, dim, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def test_key_ranges_are_maximal_runs() -> None:
    assert key_ranges([]) == ()
    assert key_ranges([0, 1, 2, 7, 8, 4]) == ((0, 3), (7, 9), (4, 5))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_attention_equals_a_dense_ancestor_mask(seed: int) -> None:
    torch.manual_seed(seed)
    parents = _tree(400, seed)
    q, k, v = _qkv(len(parents))
    weights = torch.randn(1, 3, len(parents), 16, dtype=torch.float64)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=_dense(parents))
    expected = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    out = segment_attention(q, k, v, tree_segments(parents))
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    assert len(tree_segments(parents)) > 20  # a tree, with branches
    torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-10)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_segments_whose_own_keys_are_not_one_range_gather_their_keys() -> None:
    """Own keys given as two ranges take SDPA's lower-right path: the same numbers."""
    torch.manual_seed(3)
    parents = _tree(120, 3)
    q, k, v = _qkv(len(parents))
    split = []
    for a, b, keys in chain_segments(parents):
        ranges = key_ranges(keys)
        s, e = ranges[-1]
        split.append((a, b, (*ranges[:-1], (s, e - 1), (e - 1, e)) if e - s > 1 else ranges))
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=_dense(parents))
    torch.testing.assert_close(segment_attention(q, k, v, split), reference, rtol=1e-10, atol=1e-10)


def test_memory_kept_for_backward_is_linear_in_the_keys() -> None:
    """A segment of 512 queries over 8,192 keys keeps no [queries x keys] tensor for backward (a dense or
    materialised lower-right mask would keep 4M values): the largest kept is the keys themselves."""
    n, keys, heads, dim = 512, 8192, 2, 16
    q, k, v = (torch.randn(1, heads, keys, dim, requires_grad=True) for _ in range(3))
    kept: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = segment_attention(q, k, v, [(keys - n, keys, ((0, keys),))])
    out.sum().backward()
    assert q.grad is not None and q.grad[:, :, : keys - n].abs().sum() == 0  # only the segment's queries
    assert max(kept) <= heads * keys * dim, f"a tensor of {max(kept):,} values kept for backward"
