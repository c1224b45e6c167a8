"""Ancestor-only attention over a tree's chain segments, with memory linear in the tokens.

A chain segment's queries see the keys of its ancestors in full and its own keys causally: over the segment's keys
laid end to end (ancestors first), query ``j`` of ``n`` sees the first ``keys - n + j + 1``, a lower-right causal
mask. Its keys are described by ranges of the sequence (``Segment``), never gathered into a copy.

Grouped-query attention: keys and values may have fewer heads than the query (``heads = kv_heads x groups``); query
head ``h`` uses key/value head ``h // groups`` (as ``repeat_interleave`` would lay them out) by index, and no
repeated copy is made; backward sums a group's key/value gradients into its one head.

The building block is one key range (`attend`, `attend_backward`): the output and log-sum-exp of some queries
against one range of keys, in full or causal over a square block; partial results merge by their log-sum-exp
(`merge`), as ring attention does (`gyre.train.context` passes key blocks rank to rank with them). On CPU it is
torch's flash kernel, which takes grouped heads natively; elsewhere FlexAttention (``enable_gqa``), whose backward
recomputes the block (`_recompute_backward`).

`segment_attention` on CPU runs the block once per key range of every segment (the segment's own block causal, each
ancestor range in full) and merges them; backward runs the block's backward per range with the merged output and
log-sum-exp, so every range's probabilities are the merged ones. Memory is the queries, keys, values, output and
one log-sum-exp per query: linear. On CUDA one FlexAttention call covers every segment, its block mask built from
the segments (`segment_mask`). With dropout each segment's keys are gathered and SDPA applies
``causal_lower_right``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

Range = tuple[int, int]
# queries [start, end) and the key ranges they see, in order; the last end - start keys are the segment's own
Segment = tuple[int, int, tuple[Range, ...]]
# one key range's attention: (query, key, value, causal, scale) -> (output, fp32 log-sum-exp [batch, heads, q])
Block = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, bool, float | None], tuple[torch.Tensor, torch.Tensor]
]

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def key_ranges(keys: Sequence[int]) -> tuple[Range, ...]:
    """``keys`` (indices, in attention order) as maximal ranges of consecutive indices."""
    ranges: list[Range] = []
    for k in keys:
        if ranges and ranges[-1][1] == k:
            ranges[-1] = (ranges[-1][0], k + 1)
        else:
            ranges.append((k, k + 1))
    return tuple(ranges)


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp of ``query`` against one key range, all of it or (``causal``, as many queries as
    keys) causal; grouped key/value heads used by index."""
    if query.device.type == "cpu":
        return _flash(query, key, value, 0.0, causal, scale=scale)
    with torch.no_grad():
        return flex_block(query, key, value, causal, scale)


def attend_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``query``, ``key`` and ``value`` (with the key's heads) for one key range, given the merged
    output ``out`` and log-sum-exp ``lse`` over every range the queries see and the output's gradient ``grad``."""
    if query.device.type == "cpu":
        return _flash_backward(grad, query, key, value, out, lse, 0.0, causal, scale=scale)
    return _recompute_backward(flex_block, grad, query, key, value, out, lse, causal, scale)


def merge(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attentions of the same queries over disjoint keys as one, by their log-sum-exp."""
    merged = torch.logaddexp(lse, part_lse)
    mine, theirs = ((x - merged).exp()[..., None].to(out.dtype) for x in (lse, part_lse))
    return out * mine + part * theirs, merged


def _recompute_backward(
    block: Block,
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`attend_backward` by recomputing the block under autograd: with ``w = exp(lse_b - lse)`` (``lse`` held
    fixed) and ``D = rowsum(grad * out)``, the gradient of ``sum(grad * w * out_b) - sum(D * w)`` with respect to a
    score is ``P (dP - D)``, the merged softmax's (``P`` its probability, ``dP`` the gradient of ``P``)."""
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        part, part_lse = block(q, k, v, causal, scale)
        wide = torch.promote_types(out.dtype, torch.float32)  # bf16 products summed in fp32
        w = (part_lse - lse).exp().to(wide)
        d = (grad.to(wide) * out.to(wide)).sum(-1)
        total = ((grad.to(wide) * part.to(wide)).sum(-1) - d).mul(w).sum()
        gq, gk, gv = torch.autograd.grad(total, (q, k, v))
    return gq, gk, gv


def flex_block(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One key range through FlexAttention (grouped heads by ``enable_gqa``): output and log-sum-exp."""
    mask = _causal_mask(query.shape[2], str(query.device)) if causal else None
    return flex(query, key, value, mask, scale)


def flex(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's output and (natural) log-sum-exp; compiled on CUDA, eager (scores materialised) on CPU."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    fn = _compiled_flex() if query.device.type == "cuda" else flex_attention
    out, aux = fn(query, key, value, block_mask=mask, scale=scale, enable_gqa=key.shape[1] != query.shape[1],
                  return_aux=AuxRequest(lse=True))  # fmt: skip
    return out, aux.lse


@functools.cache
def _compiled_flex() -> Any:
    """FlexAttention compiled; torch marks shapes dynamic after a first recompile, so ring pieces of many lengths do
    not each compile (past torch's recompile limit it would run the eager form, which materialises the scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=8)
def _causal_mask(n: int, device: str) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return k <= q

    return create_block_mask(causal, None, None, n, n, device=device, _compile=device.startswith("cuda"))


@functools.lru_cache(maxsize=4)
def segment_mask(segments: tuple[Segment, ...], keys: int, device: str) -> Any:
    """A FlexAttention block mask over ``keys`` keys for ``segments`` whose queries tile ``[0, queries)`` in order
    and whose keys form a tree (each key's predecessor in every segment's key list is the same: its parent); None
    where they do not. Query ``i`` sees key ``k`` iff ``k`` is its own key or an ancestor of it, tested by an Euler
    tour (``tin[k] <= tin[self] < tout[k]``): two integers a key, nothing quadratic."""
    from torch.nn.attention.flex_attention import create_block_mask

    tour = _euler(segments, keys)
    if tour is None:
        return None
    tin, tout, self_tin = (torch.tensor(x, dtype=torch.int64, device=device) for x in tour)

    def ancestor(b: Any, h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (tin[k] <= self_tin[q]) & (self_tin[q] < tout[k])

    return create_block_mask(ancestor, None, None, len(tour[2]), keys, device=device,
                             _compile=device.startswith("cuda"))  # fmt: skip


def _euler(segments: Sequence[Segment], keys: int) -> tuple[list[int], list[int], list[int]] | None:
    """(entry time, exit time) of every key in a preorder walk of the key tree, and each query's own key's entry
    time; None where the segments do not tile their queries in order or their keys do not form one tree."""
    parent = list(range(-1, keys - 1))  # within a range, a key's parent is the key before it
    claimed: dict[int, int] = {}  # a range's first key -> its parent (the last key of the range before it)
    own: list[int] = []  # each query's own key
    for a, b, ranges in segments:
        split = _own((a, b, ranges))
        if a != len(own) or split is None or any(not 0 <= s < e <= keys for s, e in ranges):
            return None
        previous = -1
        for s, e in ranges:
            if claimed.setdefault(s, previous) != previous:
                return None
            previous = e - 1
        own.extend(range(*split[1]))
    starts = sorted(claimed)
    for s in starts:
        parent[s] = claimed[s]
    for _, _, ranges in segments:  # a key inside a range must not start another with another parent
        for s, e in ranges:
            i = bisect.bisect_right(starts, s)
            while i < len(starts) and starts[i] < e:
                if claimed[starts[i]] != starts[i] - 1:
                    return None
                i += 1
    children: list[list[int]] = [[] for _ in range(keys)]
    roots: list[int] = []
    for k, p in enumerate(parent):
        (children[p] if p >= 0 else roots).append(k)
    tin, tout = [0] * keys, [0] * keys
    clock, stack = 0, [(k, False) for k in reversed(roots)]
    while stack:
        k, leaving = stack.pop()
        if leaving:
            tout[k] = clock
            continue
        tin[k] = clock
        clock += 1
        stack.append((k, True))
        stack.extend((c, False) for c in reversed(children[k]))
    if clock != keys:  # a cycle: not a tree
        return None
    return tin, tout, [tin[k] for k in own]


def segment_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: Sequence[Segment],
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Ancestor-only attention (``[batch, heads, tokens, dim]`` in and out; key and value with the query's heads or
    a divisor of them): the output for every segment's queries, concatenated in the order of ``segments``."""
    if dropout == 0.0 and all(_own(s) is not None for s in segments):
        if query.device.type == "cpu":
            return _RangeAttention.apply(query, key, value, tuple(segments), scale)
        mask = segment_mask(tuple(segments), key.shape[2], str(query.device))
        if mask is not None and mask.seq_lengths[0] == query.shape[2]:
            return flex(query, key, value, mask, scale)[0]
    outs = []
    for a, b, ranges in segments:
        index = torch.cat([torch.arange(s, e, device=key.device) for s, e in ranges])
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, a:b],
                key[:, :, index],
                value[:, :, index],
                attn_mask=causal_lower_right(b - a, len(index)),
                dropout_p=dropout,
                scale=scale,
                enable_gqa=key.shape[1] != query.shape[1],
            )
        )
    return torch.cat(outs, dim=2)


def _own(segment: Segment) -> tuple[tuple[Range, ...], Range] | None:
    """A segment's ancestor ranges and its own (causal) range, or None where its own keys are not one range."""
    a, b, ranges = segment
    n = b - a
    if not ranges or ranges[-1][1] - ranges[-1][0] < n:
        return None
    s, e = ranges[-1]
    ancestors = (*ranges[:-1], (s, e - n)) if e - n > s else ranges[:-1]
    return ancestors, (e - n, e)


class _RangeAttention(torch.autograd.Function):
    """`segment_attention` per key range, merged by log-sum-exp (see the module)."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        segments: tuple[Segment, ...],
        scale: float | None,
    ) -> torch.Tensor:
        outs, lses = [], []
        for segment in segments:
            a, b, _ = segment
            ancestors, (s, e) = _own(segment)  # type: ignore[misc]
            q = query[:, :, a:b]
            out, lse = attend(q, key[:, :, s:e], value[:, :, s:e], True, scale)
            for s, e in ancestors:
                out, lse = merge(out, lse, *attend(q, key[:, :, s:e], value[:, :, s:e], False, scale))
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.segments, ctx.scale = segments, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        query, key, value, out, lse = ctx.saved_tensors
        grad_query, grad_key, grad_value = (
            torch.zeros_like(query),
            torch.zeros_like(key),
            torch.zeros_like(value),
        )
        i = 0  # where the segment's queries lie in the output
        for segment in ctx.segments:
            a, b, _ = segment
            ancestors, own = _own(segment)  # type: ignore[misc]
            j = i + b - a
            args = (grad[:, :, i:j], query[:, :, a:b])
            for (s, e), causal in [(own, True), *((r, False) for r in ancestors)]:
                gq, gk, gv = attend_backward(
                    *args, key[:, :, s:e], value[:, :, s:e], out[:, :, i:j], lse[:, :, i:j], causal, ctx.scale
                )
                grad_query[:, :, a:b] += gq
                grad_key[:, :, s:e] += gk
                grad_value[:, :, s:e] += gv
            i = j
        return grad_query, grad_key, grad_value, None, None
