"""Context parallelism: one long micro-step computed by the ranks of a group together, each holding a share of its
tokens, so a rank's activations are ~1/N of the micro-step's.

The split (``ContextSplit``): the micro-step's tokens, in their packed order, are cut into ``2N`` runs of equal
length and rank r takes runs ``r`` and ``2N-1-r`` (Megatron's load balancing: in a causal chain a token's attention
work grows with its position, so an early run and a late one give every rank the same work). Trees keep their
ancestor-only attention: a token attends to its ancestors and itself wherever they lie.

Each layer's attention (``gyre_context``, a Hugging Face attention function, as ``gyre.train.loss``'s tree
attention) is ring attention: a rank's queries are its own tokens; the ranks' key/value blocks (each rank's own
tokens, grouped heads as the model has them, padded to the widest share) pass rank to rank around the group in
``N`` steps (send to the next rank, receive from the one before, the next block in flight while this one is
attended), and each piece of a chain segment held here attends to the ranges of the block it holds that it sees
(`gyre.train.attention.attend`: its own tokens causally in its own block, its ancestors and its segment's earlier
tokens in full), merged by log-sum-exp. Backward passes the blocks around again with their gradients: each rank adds
what its queries give a block's keys and values, and the sum arrives at the block's owner one step after the last
(``N`` sends of the gradient, ``N - 1`` of the block). A rank keeps for backward its own queries, keys, values,
output and log-sum-exp only; while a layer computes it holds two blocks more (the one attended and the one
arriving), four in backward (with their gradients, fp32 or wider) -- ``2 x kv_heads x head_dim`` values a token of
its share each, one layer at a time.

Log-probabilities: token ``i`` is predicted from the logits at ``parents[i]``, which the rank holding the parent
computes, so each rank scores the children of its own tokens that carry loss weight (``logprobs_and_entropy``: zeros
elsewhere; context tokens get no logits) and the loss a rank computes (``compute_gradients``) covers those tokens
only. The micro-step's loss and every gradient are the sums over ranks (a sharded core's reduce-scatter sums them
anyway); every rank calls the same exchanges in the same order (``N - 1`` a layer forward, ``2N - 1`` a layer
backward, the reference model's forward too; a rank with no tokens passes blocks on all the same).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gyre.config import LossConfig
from gyre.protocol import MicroStats, MicroStep
from gyre.train.attention import Range, attend, attend_backward, key_ranges, merge
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
        """Tokens per rank, padded to the largest share (a ring block's tokens)."""
        return max(len(o) for o in self.owned)


@dataclass(frozen=True)
class _Layout:
    """What this rank's attention needs, computed once per micro-step."""

    group: Any
    split: ContextSplit
    rank: int
    send_to: int  # the next rank of the ring and the one before it (global ranks, as send and recv take them)
    receive_from: int
    # per piece of a chain segment held here: its local queries [first, last), which are also its own keys (seen
    # causally, in this rank's block), and per rank the ranges of that rank's block (local indices) seen in full
    pieces: list[tuple[int, int, tuple[tuple[Range, ...], ...]]]


_layout: contextvars.ContextVar[_Layout] = contextvars.ContextVar("gyre_context_layout")


def _owners(split: ContextSplit, s: int, e: int) -> Iterator[tuple[int, Range]]:
    """Global tokens ``[s, e)`` as (rank, range of that rank's local indices) parts."""
    n, world = split.n, split.world
    for k in range(2 * world):  # the 2N runs in token order
        a, b = n * k // (2 * world), n * (k + 1) // (2 * world)
        lo, hi = max(a, s), min(b, e)
        if lo < hi:
            rank = k if k < world else 2 * world - 1 - k
            first_run = n * (rank + 1) // (2 * world) - n * rank // (2 * world)
            offset = -a if k < world else first_run - a  # a rank holds its early run, then its late one
            yield rank, (lo + offset, hi + offset)


def _layout_for(parents: list[int], split: ContextSplit, rank: int, group: Any) -> _Layout:
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
            # global [first, last) is local [local[first], local[first] + length): its own keys, causal; before
            # them every query of the run sees the segment's ancestors and its tokens before first, in full
            by_rank: list[list[Range]] = [[] for _ in range(split.world)]
            for s, e in key_ranges(visible[: ancestors + (first - a)]):
                for owner, part in _owners(split, s, e):
                    by_rank[owner].append(part)
            pieces.append((local[first], local[first] + length, tuple(tuple(r) for r in by_rank)))
            run = run[length:]
    world = split.world
    send_to, receive_from = (dist.get_global_rank(group, (rank + d) % world) for d in (1, -1))
    return _Layout(group, split, rank, send_to, receive_from, pieces)


def _exchange(send: torch.Tensor, receive: torch.Tensor, layout: _Layout, tag: int) -> list[Any]:
    """Start sending ``send`` to the next rank of the ring and receiving ``receive`` from the one before."""
    return dist.batch_isend_irecv([
        dist.P2POp(dist.isend, send, layout.send_to, layout.group, tag),
        dist.P2POp(dist.irecv, receive, layout.receive_from, layout.group, tag),
    ])  # fmt: skip


def _block(key: torch.Tensor, value: torch.Tensor, width: int) -> torch.Tensor:
    """``[2, kv heads, width, dim]``: this rank's keys and values, padded to the ring's block width."""
    pad = (0, 0, 0, width - key.shape[2])
    return torch.stack([F.pad(key[0], pad), F.pad(value[0], pad)])


class _RingAttention(torch.autograd.Function):
    """This rank's queries against every rank's keys and values, the blocks passed around the ring (see the
    module). Kept for backward: this rank's queries, keys, values, output and log-sum-exp."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: _Layout,
        scale: float | None,
    ) -> torch.Tensor:
        world, rank = layout.split.world, layout.rank
        block = _block(key, value, layout.split.width)
        outs: list[Any] = [None] * len(layout.pieces)
        lses: list[Any] = [None] * len(layout.pieces)
        for t in range(world):
            owner = (rank - t) % world
            incoming = torch.empty_like(block)
            pending = (
                _exchange(block, incoming, layout, 0) if t < world - 1 else []
            )  # the next block, meanwhile
            k, v = block[0][None], block[1][None]
            for i, (a, b, by_rank) in enumerate(layout.pieces):
                q = query[:, :, a:b]
                if t == 0:
                    outs[i], lses[i] = attend(q, key[:, :, a:b], value[:, :, a:b], True, scale)
                for s, e in by_rank[owner]:
                    outs[i], lses[i] = merge(
                        outs[i], lses[i], *attend(q, k[:, :, s:e], v[:, :, s:e], False, scale)
                    )
            for work in pending:
                work.wait()
            block = incoming
        if outs:
            out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)
        else:  # a rank with no tokens of this micro-step: it passes blocks on all the same
            out, lse = query.new_empty(query.shape), query.new_empty(query.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        query, key, value, out, lse = ctx.saved_tensors
        layout, scale = ctx.layout, ctx.scale
        world, rank, width = layout.split.world, layout.rank, layout.split.width
        grad_query = torch.zeros_like(query)
        block = _block(key, value, width)
        # the gradient of the block held travels with it and reaches its owner one step after the last use
        wide = torch.promote_types(key.dtype, torch.float32)
        grads = torch.zeros(block.shape, dtype=wide, device=block.device)
        for t in range(world):
            owner = (rank - t) % world
            incoming = torch.empty_like(block)
            pending = _exchange(block, incoming, layout, 0) if t < world - 1 else []
            k, v = block[0][None], block[1][None]
            for a, b, by_rank in layout.pieces:
                spans = [*([((a, b), True)] if t == 0 else []), *((r, False) for r in by_rank[owner])]
                for (s, e), causal in spans:
                    gq, gk, gv = attend_backward(grad[:, :, a:b], query[:, :, a:b], k[:, :, s:e], v[:, :, s:e],
                                                 out[:, :, a:b], lse[:, :, a:b], causal, scale)  # fmt: skip
                    grad_query[:, :, a:b] += gq
                    grads[0, :, s:e] += gk[0]
                    grads[1, :, s:e] += gv[0]
            if (
                world > 1
            ):  # hand this owner's gradient on; receive the next owner's (after the last step: ours)
                arrived = torch.empty_like(grads)
                pending += _exchange(grads, arrived, layout, 1)
                grads = arrived
            for work in pending:
                work.wait()
            block = incoming
        n = key.shape[2]
        return (
            grad_query,
            grads[0, :, :n][None].to(key.dtype),
            grads[1, :, :n][None].to(value.dtype),
            None,
            None,
        )


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
    rank's tokens against the whole micro-step's keys and values, passed around the ring (see the module); grouped
    key/value heads stay grouped."""
    if dropout and module.training:
        raise ValueError(
            "context parallelism applies no attention dropout: set the model's attention_dropout to 0"
        )
    out = _RingAttention.apply(query, key, value, _layout.get(), scaling)
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
    token = _layout.set(_layout_for(micro.parents, split, rank, group))
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
