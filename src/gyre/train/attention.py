"""Ancestor-only attention over a tree's chain segments, with memory linear in the tokens.

A chain segment's queries see the keys of its ancestors in full and its own keys causally: over the segment's keys
laid end to end (ancestors first), query ``j`` of ``n`` sees the first ``keys - n + j + 1``, a lower-right causal
mask. Its keys are described by ranges of the sequence (``Segment``), never gathered into a copy.

On CPU, where SDPA would materialise a lower-right mask as a dense ``[queries x keys]`` tensor (and keep it for
backward), `segment_attention` runs torch's flash kernel once per key range (the segment's own block causal, each
ancestor range in full) and merges the partial results by their log-sum-exp, as ring attention does; backward calls
the kernel's backward per range with the merged output and log-sum-exp, so every range's probabilities are the
merged ones. Memory is the queries, keys, values, output and one log-sum-exp per query: linear. Elsewhere (CUDA,
dropout) each segment's keys are gathered and SDPA applies `causal_lower_right` itself (CUDA's flash and efficient
kernels apply it natively).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

Range = tuple[int, int]
# queries [start, end) and the key ranges they see, in order; the last end - start keys are the segment's own
Segment = tuple[int, int, tuple[Range, ...]]

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


def segment_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: Sequence[Segment],
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Ancestor-only attention (``[batch, heads, tokens, dim]`` in and out; key and value heads already repeated to
    the query's): the output for every segment's queries, concatenated in the order of ``segments``."""
    if query.device.type == "cpu" and dropout == 0.0 and all(_own(s) is not None for s in segments):
        return _RangeAttention.apply(query, key, value, tuple(segments), scale)
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
    """`segment_attention` on CPU: flash per key range, merged by log-sum-exp (see the module)."""

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
            out, lse = _flash(q, key[:, :, s:e], value[:, :, s:e], 0.0, True, scale=scale)
            for s, e in ancestors:
                part, part_lse = _flash(q, key[:, :, s:e], value[:, :, s:e], 0.0, False, scale=scale)
                merged = torch.logaddexp(lse, part_lse)
                mine, theirs = ((x - merged).exp()[..., None].to(out.dtype) for x in (lse, part_lse))
                out, lse = out * mine + part * theirs, merged
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
                gq, gk, gv = _flash_backward(
                    *args, key[:, :, s:e], value[:, :, s:e], out[:, :, i:j], lse[:, :, i:j], 0.0, causal,
                    scale=ctx.scale,
                )  # fmt: skip
                grad_query[:, :, a:b] += gq
                grad_key[:, :, s:e] += gk
                grad_value[:, :, s:e] += gv
            i = j
        return grad_query, grad_key, grad_value, None, None
