"""Log-probabilities of a packed micro-step under a causal LM, and the policy loss both packings feed.

A micro-step row holds sequences whose tokens attend to their ancestors only (``parents``): a chain for a path, a
tree for a tree-packed execution, several of either side by side. Each sequence is computed on its own. A chain uses
the model's plain causal attention. A tree uses ancestor-only attention: it is cut into chain segments (maximal runs
where each token follows the one before), and each segment's queries attend to the keys and values of its ancestors'
tokens plus a causal block over its own (`gyre.train.attention`: key ranges, never a mask or a copy), so a tree costs
the attention pairs it needs and memory linear in its length. Position ids are depths, so a token's logits are
exactly those of the same token at the end of its own path.

The losses these logprobs feed live in `gyre.train.objective`.

Tree attention is a Hugging Face attention function (``gyre_tree``, registered on import) that the model uses for
the duration of one tree's forward; any model whose attention goes through ``AttentionInterface`` works.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gyre.train.attention import Segment, key_ranges, segment_attention

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gyre.train.step import MicroStep

TREE_ATTENTION = "gyre_tree"

# The segments of the tree being computed.
_segments: contextvars.ContextVar[list[Segment]] = contextvars.ContextVar("gyre_tree_segments")


def token_logprobs(
    model: Any, micro: MicroStep, temperature: float = 1.0, scored: Sequence[bool] | None = None
) -> torch.Tensor:
    """``out[i]``: log p(token i | its ancestors) under ``model`` at ``temperature`` for the tokens ``scored``
    (default: those with loss weight > 0, the only ones a loss reads; ``every_token(micro)`` for all), 0 elsewhere
    and where a sequence starts. Only scored tokens' logits are computed: in a long agent execution most tokens are
    context, and the lm head over a 152K vocabulary costs more than a small model's layers."""
    return token_logprobs_and_entropy(model, micro, temperature, scored)[0]


def token_logprobs_and_entropy(
    model: Any, micro: MicroStep, temperature: float = 1.0, scored: Sequence[bool] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs`, and the entropy (nats, without gradient) of the distribution each scored token was drawn
    from; with ``temperature``, of ``logits / temperature`` (the distribution an engine sampled from at it)."""
    wanted = weighted_tokens(micro) if scored is None else list(scored)
    if len(wanted) != len(micro.input_ids):
        raise ValueError(
            f"scored has {len(wanted)} entries for a micro-step of {len(micro.input_ids)} tokens"
        )
    pieces, entropies = [], []
    for start, end in sequence_bounds(micro.parents):
        parents = [p - start if p >= 0 else -1 for p in micro.parents[start:end]]
        lp, ent = _sequence_logprobs(
            model,
            micro.input_ids[start:end],
            micro.position_ids[start:end],
            parents,
            wanted[start:end],
            temperature,
        )
        pieces.append(lp)
        entropies.append(ent)
    if not pieces:
        empty = torch.zeros(0, device=next(model.parameters()).device)
        return empty, empty
    return torch.cat(pieces), torch.cat(entropies)


def weighted_tokens(micro: MicroStep) -> list[bool]:
    """The tokens a loss reads (loss weight > 0): what `token_logprobs` scores unless told otherwise."""
    return [w > 0 for w in micro.weights]


def every_token(micro: MicroStep) -> list[bool]:
    """Every token of ``micro``, for `token_logprobs`'s ``scored`` (e.g. to compare with an engine's logprobs)."""
    return [True] * len(micro.input_ids)


def sequence_bounds(parents: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each sequence of a packed row: each starts at a token without a parent, and its tokens'
    ancestors lie within it (sequences are laid out one after another, a tree's subtrees contiguous)."""
    starts = [i for i, p in enumerate(parents) if p < 0]
    bounds = list(zip(starts, [*starts[1:], len(parents)], strict=True))
    for start, end in bounds:
        for i in range(start + 1, end):
            if not start <= parents[i] < i:
                raise ValueError(
                    f"token {i}'s parent {parents[i]} lies outside its sequence [{start}, {end})"
                )
    return bounds


def chain_segments(parents: list[int]) -> list[tuple[int, int, list[int]]]:
    """A tree sequence's chain segments: ``(start, end, the tokens it attends to)``, ancestors first, then its own."""
    starts = [i for i, p in enumerate(parents) if i == 0 or p != i - 1]
    bounds = list(zip(starts, [*starts[1:], len(parents)], strict=True))
    segment_of: list[int] = [0] * len(parents)
    visible: list[list[int]] = []
    for s, (a, b) in enumerate(bounds):
        p = parents[a]
        if p < 0:
            ancestors: list[int] = []
        else:
            ps = segment_of[p]
            pa, pb = bounds[ps]
            ancestors = visible[ps][: len(visible[ps]) - (pb - pa) + (p - pa) + 1]  # up to and including p
        visible.append(ancestors + list(range(a, b)))
        segment_of[a:b] = [s] * (b - a)
    return [(a, b, visible[s]) for s, (a, b) in enumerate(bounds)]


def tree_segments(parents: list[int]) -> list[Segment]:
    """What `segment_attention` takes: per chain segment, ``(start, end, the key ranges it sees)``."""
    return [(a, b, key_ranges(keys)) for a, b, keys in chain_segments(parents)]


def _sequence_logprobs(
    model: Any,
    input_ids: list[int],
    position_ids: list[int],
    parents: list[int],
    wanted: list[bool],
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)
    positions = torch.tensor([position_ids], device=device)
    if all(p == i - 1 for i, p in enumerate(parents)):  # a chain: plain causal attention
        hidden = final_hidden(model, ids, positions)
    else:
        token = _segments.set(tree_segments(parents))
        previous = model.config._attn_implementation
        model.set_attn_implementation(TREE_ATTENTION)
        try:
            hidden = final_hidden(model, ids, positions)
        finally:
            model.set_attn_implementation(previous)
            _segments.reset(token)
    index = torch.tensor(parents, device=device)
    # logits only for wanted tokens with a parent (a sequence's first has none); with none, the (empty) head still
    # joins the loss to ``hidden``, so backward runs every layer (context parallelism's collectives need that)
    scored = torch.tensor([w and p >= 0 for w, p in zip(wanted, parents, strict=True)], device=device)
    scored = scored.nonzero().squeeze(-1)
    head = model.get_output_embeddings()
    picked, entropy = chunked_logprobs(
        hidden[index[scored]], head.weight, head.bias, ids[0, scored], temperature
    )
    zero = torch.zeros(len(parents), device=device, dtype=picked.dtype)
    return zero.index_put((scored,), picked), zero.detach().index_put((scored,), entropy)


def final_hidden(model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The last hidden states ``[tokens, hidden]`` of one sequence (the lm head applied separately, in chunks)."""
    return model.get_decoder()(input_ids=ids, position_ids=positions).last_hidden_state[0]


# fp32 logits of one chunk of tokens (a chunk holds two such tensors at once, forward and backward): 128 MiB is 220
# tokens of a 152K vocabulary, and the whole micro-step for a small one
LOGITS_CHUNK_BYTES = 128 * 2**20


def logits_chunk_tokens(vocab: int) -> int:
    """Tokens whose logits over ``vocab`` exist at once (`LOGITS_CHUNK_BYTES` of fp32)."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab))


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target | hidden) under the lm head ``(weight, bias)`` at ``temperature``, and the entropy (no
    gradient), ``chunk_tokens`` at a time (default: `logits_chunk_tokens`): no [tokens x vocab] tensor is ever whole,
    forward or backward. Computed in ``hidden``'s dtype promoted to fp32 at least (a bf16 model's logits are
    upcast)."""
    picked, entropy = _LinearLogprobs.apply(
        hidden, weight, bias, targets, temperature, chunk_tokens or logits_chunk_tokens(weight.shape[0])
    )
    return picked, entropy


class _LinearLogprobs(torch.autograd.Function):
    """`chunked_logprobs` with a hand-written backward, so that each chunk's logits are made once forward and once
    backward and nothing of their size is kept between the two: forward saves only ``hidden`` and the targets
    (entropy is taken there, from the same log-probabilities); backward recomputes a chunk's softmax, turns it in
    place into the logits' gradient ``(onehot - softmax) * grad / temperature`` and applies the two matmuls, the
    weight's gradient accumulated across chunks in one buffer rather than one per chunk. (Autograd through
    checkpointed chunks recomputes the entropy in backward too, makes more [tokens x vocab] intermediates (the
    log-softmax's gradient, the gather's scatter) and sums a [vocab x hidden] gradient per chunk: ~4x the time.)"""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_tokens: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        n = hidden.shape[0]
        picked = torch.empty(n, dtype=dtype, device=hidden.device)
        entropy = torch.empty(n, dtype=dtype, device=hidden.device)
        for a in range(0, n, chunk_tokens):
            b = min(a + chunk_tokens, n)
            logp = _logits(hidden[a:b], weight, bias, temperature, dtype).log_softmax(-1)
            picked[a:b] = logp.gather(-1, targets[a:b, None])[:, 0]
            # H = -sum p log p as a batched dot product: no third [tokens x vocab] tensor
            entropy[a:b] = torch.bmm(logp.exp()[:, None, :], logp[:, :, None])[:, 0, 0].neg_()
            del logp
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk_tokens, ctx.dtype = temperature, chunk_tokens, dtype
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets = ctx.saved_tensors
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        n, temperature = hidden.shape[0], ctx.temperature
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        # the weight's gradient summed over chunks in fp32 at least (a bf16 sum over hundreds of chunks drifts)
        grad_weight = torch.zeros_like(weight, dtype=ctx.dtype) if want_weight else None
        grad_bias = torch.zeros_like(bias, dtype=ctx.dtype) if want_bias else None
        for a in range(0, n, ctx.chunk_tokens):
            b = min(a + ctx.chunk_tokens, n)
            h, g = hidden[a:b], grad[a:b].to(ctx.dtype)
            if temperature != 1:
                g = g / temperature
            # d picked / d logits = (onehot(target) - softmax) / temperature, times the incoming gradient
            d = _logits(h, weight, bias, temperature, ctx.dtype).softmax(-1).mul_(g.neg()[:, None])
            d[torch.arange(b - a, device=d.device), targets[a:b]] += g
            if grad_hidden is not None:
                grad_hidden[a:b] = torch.mm(d.to(weight.dtype), weight)
            if grad_weight is not None:
                grad_weight.addmm_(d.t(), h.to(ctx.dtype))
            if grad_bias is not None:
                grad_bias += d.sum(0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float, dtype: torch.dtype
) -> torch.Tensor:
    """One chunk's logits in ``dtype``, divided by ``temperature`` (a new tensor, free to change in place)."""
    x = F.linear(h, weight, bias)
    x = x.to(dtype) if x.dtype != dtype else x
    return x.div_(temperature) if temperature != 1 else x


def _tree_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention (``[batch, heads, tokens, dim]`` in, ``[batch, tokens, heads, dim]`` out) over the
    current tree's segments: each segment's queries see only its ancestors and itself (the model's mask is unused)."""
    p = dropout if module.training else 0.0
    out = segment_attention(query, key, value, _segments.get(), scaling, p)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION, _tree_attention)


_register()
