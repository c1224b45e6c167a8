"""Ancestor-only attention over key ranges: the same numbers as a dense ancestor mask, and nothing quadratic kept."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gyre.train.attention import (
    _RangeAttention,
    _recompute_backward,
    attend,
    attend_backward,
    flex,
    key_ranges,
    merge,
    segment_attention,
    segment_mask,
)
from gyre.train.loss import chain_segments, tree_segments

# FlexAttention on CPU runs eagerly (scores materialised) and says so: fine at a test's sizes
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


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


def _qkv(n: int, heads: int = 3, dim: int = 16, kv_heads: int | None = None) -> list[torch.Tensor]:
    shapes = [heads, kv_heads or heads, kv_heads or heads]
    return [torch.randn(1, h, n, dim, dtype=torch.float64, requires_grad=True) for h in shapes]


def _repeated(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped key/value heads laid out for every query head (the reference: ``repeat_interleave``)."""
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def test_key_ranges_are_maximal_runs() -> None:
    assert key_ranges([]) == ()
    assert key_ranges([0, 1, 2, 7, 8, 4]) == ((0, 3), (7, 9), (4, 5))


@pytest.mark.parametrize(
    "seed,heads,kv_heads", [(0, 3, 3), (1, 3, 3), (2, 3, 3), (3, 4, 1), (4, 4, 2), (5, 8, 2)]
)
def test_tree_attention_equals_a_dense_ancestor_mask(seed: int, heads: int, kv_heads: int) -> None:
    """With as many key/value heads as query heads, or grouped (4 query heads a key/value head): the output and
    every gradient of dense attention over repeated heads; the key/value gradients have the grouped heads."""
    torch.manual_seed(seed)
    parents = _tree(400, seed)
    q, k, v = _qkv(len(parents), heads, kv_heads=kv_heads)
    weights = torch.randn(1, heads, len(parents), 16, dtype=torch.float64)
    reference = F.scaled_dot_product_attention(
        q, _repeated(k, heads), _repeated(v, heads), attn_mask=_dense(parents)
    )
    expected = torch.autograd.grad((reference * weights).sum(), (q, k, v))
    out = segment_attention(q, k, v, tree_segments(parents))
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    assert len(tree_segments(parents)) > 20  # a tree, with branches
    assert got[1].shape == k.shape
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


def test_grouped_heads_are_not_repeated_for_backward() -> None:
    """With 4 query heads a key/value head, what backward keeps is the grouped keys and values themselves: no
    tensor of the repeated heads' size."""
    n, heads, kv_heads, dim = 2048, 4, 1, 16
    q = torch.randn(1, heads, n, dim, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, n, dim, requires_grad=True) for _ in range(2))
    kept: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = segment_attention(q, k, v, [(0, n, ((0, n),))])
    out.sum().backward()
    assert (1, kv_heads, n, dim) in kept and (
        1,
        heads,
        n,
        dim,
    ) in kept  # the keys as given; the query, the output
    assert sum(1 for s in kept if s == (1, heads, n, dim)) == 2  # the query and the output, no repeated keys


def _math_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One key range by plain tensor operations (differentiable everywhere): the reference for a block."""
    k, v = _repeated(k, q.shape[1]), _repeated(v, q.shape[1])
    scores = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    return (scores - lse[..., None]).exp() @ v, lse


def test_a_block_s_backward_by_recomputation_is_the_flash_kernel_s() -> None:
    """The backward FlexAttention's blocks use (recompute the block, weigh it by the merged log-sum-exp) gives the
    gradients of the flash kernel's backward for each of two ranges merged, grouped heads included."""
    torch.manual_seed(5)
    q = torch.randn(1, 4, 24, 8, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(2))
    own, other = (slice(16, 40), True), (slice(0, 16), False)
    out, lse = attend(q, k[:, :, own[0]], v[:, :, own[0]], True, None)
    out, lse = merge(out, lse, *attend(q, k[:, :, other[0]], v[:, :, other[0]], False, None))
    grad = torch.randn_like(out)
    for keys, causal in (own, other):
        want = attend_backward(grad, q, k[:, :, keys], v[:, :, keys], out, lse, causal, None)
        got = _recompute_backward(_math_block, grad, q, k[:, :, keys], v[:, :, keys], out, lse, causal, None)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@EAGER_FLEX
@pytest.mark.parametrize("heads,kv_heads", [(3, 3), (4, 1)])
def test_flex_attention_over_a_tree_s_block_mask_equals_the_cpu_path(heads: int, kv_heads: int) -> None:
    """segment_attention's CUDA branch (one FlexAttention call, its block mask built from the segments) pinned on
    CPU, forward only (FlexAttention has no backward on CPU): output and log-sum-exp of the per-range path."""
    torch.manual_seed(6)
    parents = _tree(300, 6)
    segments = tuple(tree_segments(parents))
    q, k, v = (t.detach().float() for t in _qkv(len(parents), heads, kv_heads=kv_heads))
    mask = segment_mask(segments, len(parents), "cpu")
    assert mask is not None
    got, got_lse = flex(q, k, v, mask, None)
    with torch.no_grad():
        want = _RangeAttention.apply(q, k, v, segments, None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    dense = F.scaled_dot_product_attention(q.double(), _repeated(k, heads).double(), _repeated(v, heads).double(),
                                           attn_mask=_dense(parents))  # fmt: skip
    torch.testing.assert_close(got.double(), dense, rtol=1e-5, atol=1e-5)
    scores = (q @ _repeated(k, heads).transpose(-1, -2)) * 16**-0.5
    torch.testing.assert_close(got_lse, scores.masked_fill(~_dense(parents), float("-inf")).logsumexp(-1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@EAGER_FLEX
def test_a_context_parallel_piece_s_block_mask_sees_its_ancestors_on_other_ranks() -> None:
    """Queries that are a rank's share and keys that are the whole micro-step (key ranges not starting at the
    queries): the block mask still gives each query its ancestors and itself."""
    torch.manual_seed(7)
    parents = _tree(200, 7)
    segments = tree_segments(parents)
    # the queries of the segments past the first 120 tokens, as a rank holding them would index them
    cut = next(a for a, _, _ in segments if a >= 120)
    pieces = tuple((a - cut, b - cut, ranges) for a, b, ranges in segments if a >= cut)
    q, k, v = (t.detach().float() for t in _qkv(len(parents), 4, kv_heads=2))
    mask = segment_mask(pieces, len(parents), "cpu")
    assert mask is not None
    got, _ = flex(q[:, :, cut:], k, v, mask, None)
    dense = F.scaled_dot_product_attention(q, _repeated(k, 4), _repeated(v, 4), attn_mask=_dense(parents))
    torch.testing.assert_close(got, dense[:, :, cut:], rtol=1e-5, atol=1e-5)


def test_segments_that_are_not_a_tree_have_no_block_mask() -> None:
    """Key lists that give one key two parents, or own keys split in two ranges, are not a tree: no block mask (the
    CUDA branch then gathers keys for SDPA)."""
    assert segment_mask(((0, 2, ((0, 2),)), (2, 4, ((0, 1), (2, 4)))), 4, "cpu") is not None
    assert (
        segment_mask(((0, 2, ((0, 2),)), (2, 4, ((1, 2), (2, 4)))), 4, "cpu") is None
    )  # 1: after 0 and first
    assert segment_mask(((0, 2, ((0, 2),)), (2, 4, ((0, 1), (3, 4), (2, 3)))), 4, "cpu") is None
    assert segment_mask(((0, 3, ((0, 3),)), (3, 4, ((0, 2), (3, 4)))), 4, "cpu") is not None  # a branch at 1
