"""Context parallelism: one long micro-step computed by the ranks of a group together, each holding a share of its
tokens, so a rank's activations are ~1/N of the micro-step's.

The split (``ContextSplit``): the micro-step's tokens, in their packed order, are cut into ``2N`` runs of equal
length and rank r takes runs ``r`` and ``2N-1-r`` (Megatron's load balancing: in a causal chain a token's attention
work grows with its position, so an early run and a late one give every rank the same work). Trees keep their
ancestor-only attention: a token attends to its ancestors and itself wherever they lie.

Each layer's attention (``gyre_context``, a Hugging Face attention function, as ``gyre.train.loss``'s tree
attention): a rank's queries are its own tokens; keys and values are all-gathered from every rank (a differentiable
all-gather: its backward reduce-scatters the keys' and values' gradients back to their owners), then each chain
segment of the micro-step that has queries here attends to its ancestors and its own earlier tokens, as in
``gyre.train.attention.segment_attention`` (over ranges of the gathered keys: no mask, no copy). A rank holds every
layer's keys and values of the whole micro-step while it computes (linear in its length: ``2 x kv_heads x
head_dim`` values a token a layer), the rest of its activations for its own tokens only.

Log-probabilities: token ``i`` is predicted from the logits at ``parents[i]``, which the rank holding the parent
computes, so each rank scores the children of its own tokens that carry loss weight (``logprobs_and_entropy``: zeros
elsewhere; context tokens get no logits) and the loss a rank computes (``compute_gradients``) covers those tokens
only. The micro-step's loss and every gradient are the sums over ranks (a sharded core's reduce-scatter sums them
anyway); every rank calls the same collectives in the same order (one all-gather a layer forward, one reduce-scatter
a layer backward, the reference model's forward too).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gyre.config import LossConfig
from gyre.protocol import MicroStats, MicroStep
from gyre.train.attention import Segment, key_ranges, segment_attention
from gyre.train.loss import chain_segments, chunked_logprobs, final_hidden, weighted_tokens

CONTEXT_ATTENTION = "gyre_context"


@dataclass(frozen=True)
class ContextSplit:
    """Which tokens of an ``n``-token micro-step each of ``world`` ranks holds (``owned[r]``: ascending)."""

    n: int
    world: int
    owned: list[list[int]]

    @classmethod
    def of(cls, n: int, world: int) -> ContextSplit:
        runs = [(n * k // (2 * world), n * (k + 1) // (2 * world)) for k in range(2 * world)]
        owned = []
        for r in range(world):
            (a, b), (c, d) = runs[r], runs[2 * world - 1 - r]
            owned.append([*range(a, b), *range(c, d)])
        return cls(n, world, owned)

    @property
    def width(self) -> int:
        """Tokens per rank, padded to the largest share (what one all-gather moves per rank)."""
        return max(len(o) for o in self.owned)


@dataclass(frozen=True)
class _Layout:
    """What this rank's attention needs, computed once per micro-step."""

    group: Any
    split: ContextSplit
    rank: int
    order: torch.Tensor  # global token -> its place in the gathered, rank-by-rank (padded) buffer
    # per piece of a chain segment held here: (first, last local query + 1, ranges of the keys it sees, global)
    pieces: list[Segment]


_layout: contextvars.ContextVar[_Layout] = contextvars.ContextVar("gyre_context_layout")


def _layout_for(parents: list[int], split: ContextSplit, rank: int, group: Any, device: Any) -> _Layout:
    width = split.width
    place = [0] * split.n
    for r, tokens in enumerate(split.owned):
        for j, g in enumerate(tokens):
            place[g] = r * width + j
    local = {g: j for j, g in enumerate(split.owned[rank])}
    pieces = []
    for a, b, visible in chain_segments(parents):
        ancestors = len(visible) - (b - a)
        run: list[int] = [g for g in range(a, b) if g in local]
        while run:  # this rank's queries of the segment, in contiguous runs of local positions
            first = run[0]
            length = 1
            while length < len(run) and run[length] == first + length:  # global, not local, runs
                length += 1
            last = first + length  # global [first, last) is local [local[first], local[first] + length)
            # query j of the run sees keys up to ancestors + (first - a) + j: lower-right causal over these
            keys = key_ranges(visible[: ancestors + (last - a)])
            pieces.append((local[first], local[first] + length, keys))
            run = run[length:]
    return _Layout(group, split, rank, torch.tensor(place, device=device), pieces)


class _GatherTokens(torch.autograd.Function):
    """All-gather every rank's ``[heads, width, dim]`` share (padded) along the token axis; the backward sums the
    gradient every rank computed for a share and hands it to its owner (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, share: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        out = torch.empty(world * share.numel(), dtype=share.dtype, device=share.device)
        dist.all_gather_single(out, share.contiguous().reshape(-1), group=group)
        return out.view(world, *share.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        mine = torch.empty(grad[0].numel(), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_single(mine, grad.contiguous().reshape(-1), group=ctx.group)
        return mine.view(grad.shape[1:]), None


def _gather(local: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """``[1, heads, local tokens, dim]`` -> ``[1, heads, n, dim]`` in global token order."""
    heads, count, dim = local.shape[1], local.shape[2], local.shape[3]
    share = F.pad(local[0], (0, 0, 0, layout.split.width - count))  # [heads, width, dim]
    every = _GatherTokens.apply(share, layout.group)  # [world, heads, width, dim]
    flat = every.permute(1, 0, 2, 3).reshape(heads, -1, dim)  # rank-by-rank
    return flat.index_select(1, layout.order)[None]


def _context_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention (``[batch, heads, tokens, dim]`` in, ``[batch, tokens, heads, dim]`` out) for this
    rank's tokens against the whole micro-step's keys and values (see the module)."""
    layout = _layout.get()
    # grouped key/value heads stay grouped: segment_attention uses each for its query group
    key, value = _gather(key, layout), _gather(value, layout)
    p = dropout if module.training else 0.0
    if not layout.pieces:  # (a rank with no tokens of this micro-step)
        return query[:, :, :0].transpose(1, 2).contiguous(), None
    out = segment_attention(query, key, value, layout.pieces, scaling, p)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(CONTEXT_ATTENTION, _context_attention)


_register()


def logprobs_and_entropy(
    model: Any,
    micro: MicroStep,
    temperature: float,
    split: ContextSplit,
    group: Any,
    scored: Sequence[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(collective) ``token_logprobs_and_entropy`` of the micro-step for the tokens ``scored`` (default: loss
    weight > 0) whose parent this rank holds (zeros elsewhere): this rank's forward over its own tokens, attending
    to every rank's."""
    rank = dist.get_rank(group)
    device = next(model.parameters()).device
    mine = split.owned[rank]
    token = _layout.set(_layout_for(micro.parents, split, rank, group, device))
    previous = model.config._attn_implementation
    model.set_attn_implementation(CONTEXT_ATTENTION)
    try:
        ids = torch.tensor([[micro.input_ids[g] for g in mine]], device=device)
        positions = torch.tensor([[micro.position_ids[g] for g in mine]], device=device)
        hidden = final_hidden(model, ids, positions)  # [local tokens, hidden]
    finally:
        model.set_attn_implementation(previous)
        _layout.reset(token)
    local = {g: j for j, g in enumerate(mine)}
    wanted = weighted_tokens(micro) if scored is None else scored
    # a rank with none still applies the (empty) head, so its backward runs every layer's collectives
    children = [i for i, p in enumerate(micro.parents) if p >= 0 and wanted[i] and p in local]
    source = torch.tensor([local[micro.parents[i]] for i in children], device=device, dtype=torch.long)
    target = torch.tensor(children, device=device, dtype=torch.long)
    picked_ids = torch.tensor([micro.input_ids[i] for i in children], device=device, dtype=torch.long)
    head = model.get_output_embeddings()  # the lm head in chunks (gyre.train.loss): no [tokens x vocab] whole
    picked, entropy = chunked_logprobs(hidden.index_select(0, source), head.weight, head.bias, picked_ids,
                                       temperature)  # fmt: skip
    out = torch.zeros(len(micro.input_ids), device=device, dtype=picked.dtype).index_put((target,), picked)
    ent = torch.zeros(len(micro.input_ids), device=device, dtype=entropy.dtype).index_put((target,), entropy)
    return out, ent


def scored_here(micro: MicroStep, split: ContextSplit, rank: int) -> MicroStep:
    """``micro`` with the loss weights of tokens another rank scores set to 0 (their parent is not held here)."""
    local = set(split.owned[rank])
    weights = [w if p >= 0 and p in local else 0.0 for w, p in zip(micro.weights, micro.parents, strict=True)]
    return msgspec.structs.replace(micro, weights=weights)


def compute_gradients(
    model: Any,
    micro: MicroStep,
    cfg: LossConfig,
    policy_version: int,
    group: Any,
    reference: Any | None = None,
) -> MicroStats:
    """(collective) This rank's part of one micro-step's forward and backward into ``model``'s ``.grad``: the
    gradients summed over the group's ranks are the micro-step's, and so are the figures (``merge_stats``)."""
    from gyre.train import objective

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    split = ContextSplit.of(len(micro.input_ids), world)

    def forward(m: Any, mi: MicroStep, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        return logprobs_and_entropy(m, mi, temperature, split, group)

    stats = objective.compute_gradients(model, scored_here(micro, split, rank), cfg, policy_version, reference,
                                        forward=forward)  # fmt: skip
    return msgspec.structs.replace(stats, computed_tokens=len(split.owned[rank]))
