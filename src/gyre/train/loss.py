"""Log-probabilities of a packed micro-step under a causal LM, and the policy loss both packings feed.

A micro-step row holds sequences whose tokens attend to their ancestors only (``parents``): a chain for a path, a
tree for a tree-packed execution, several of either side by side. Each sequence is computed on its own. A chain uses
the model's plain causal attention. A tree uses ancestor-only attention: it is cut into chain segments (maximal runs
where each token follows the one before), and each segment's queries attend to the keys and values of its ancestors'
tokens (gathered by index) plus a causal block over its own, so a tree costs the attention pairs it needs, not the
square of its length. Position ids are depths, so a token's logits are exactly those of the same token at the end of
its own path.

The losses these logprobs feed live in `gyre.train.objective`.

Tree attention is a Hugging Face attention function (``gyre_tree``, registered on import) that the model uses for
the duration of one tree's forward; any model whose attention goes through ``AttentionInterface`` works.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from gyre.train.step import MicroStep

TREE_ATTENTION = "gyre_tree"

# The segments of the tree being computed: (start, end, key/value indices, mask over those keys) per chain segment.
_segments: contextvars.ContextVar[list[tuple[int, int, torch.Tensor, torch.Tensor]]] = contextvars.ContextVar(
    "gyre_tree_segments"
)


def token_logprobs(model: Any, micro: MicroStep, temperature: float = 1.0) -> torch.Tensor:
    """``out[i]``: log p(token i | its ancestors) under ``model`` at ``temperature`` (0 where a sequence starts)."""
    return token_logprobs_and_entropy(model, micro, temperature)[0]


def token_logprobs_and_entropy(
    model: Any, micro: MicroStep, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs`, and the entropy (nats, without gradient) of the distribution each token was drawn from;
    with ``temperature``, of ``logits / temperature`` (the distribution an engine sampled from at it)."""
    pieces, entropies = [], []
    for start, end in sequence_bounds(micro.parents):
        parents = [p - start if p >= 0 else -1 for p in micro.parents[start:end]]
        lp, ent = _sequence_logprobs(
            model, micro.input_ids[start:end], micro.position_ids[start:end], parents, temperature
        )
        pieces.append(lp)
        entropies.append(ent)
    if not pieces:
        empty = torch.zeros(0, device=next(model.parameters()).device)
        return empty, empty
    return torch.cat(pieces), torch.cat(entropies)


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


def tree_segments(
    parents: list[int], device: Any = None
) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """What `segment_attention` takes: per chain segment, ``(start, end, key/value indices, mask over them)``."""
    segments = []
    for a, b, keys in chain_segments(parents):
        n = b - a
        mask = torch.ones(n, len(keys), dtype=torch.bool, device=device)
        mask[:, len(keys) - n :] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        segments.append((a, b, torch.tensor(keys, device=device), mask))
    return segments


def segment_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: list[tuple[int, int, torch.Tensor, torch.Tensor]],
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Ancestor-only attention over a tree's chain segments (``[batch, heads, tokens, dim]`` in and out; key and
    value heads already repeated to the query's): each segment's queries see its ancestors and itself."""
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, keys],
            value[:, :, keys],
            attn_mask=mask,
            dropout_p=dropout,
            scale=scale,
        )
        for a, b, keys, mask in segments
    ]
    return torch.cat(outs, dim=2)


def _sequence_logprobs(
    model: Any, input_ids: list[int], position_ids: list[int], parents: list[int], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)
    positions = torch.tensor([position_ids], device=device)
    if all(p == i - 1 for i, p in enumerate(parents)):  # a chain: plain causal attention
        hidden = final_hidden(model, ids, positions)
    else:
        token = _segments.set(tree_segments(parents, device))
        previous = model.config._attn_implementation
        model.set_attn_implementation(TREE_ATTENTION)
        try:
            hidden = final_hidden(model, ids, positions)
        finally:
            model.set_attn_implementation(previous)
            _segments.reset(token)
    index = torch.tensor(parents, device=device)
    has_parent = index >= 0
    # logits only for tokens with a parent (a sequence's first has none)
    scored = has_parent.nonzero().squeeze(-1)
    head = model.get_output_embeddings()
    picked, entropy = chunked_logprobs(
        hidden[index[scored]], head.weight, head.bias, ids[0, scored], temperature
    )
    zero = torch.zeros(len(parents), device=device, dtype=picked.dtype)
    return zero.index_put((scored,), picked), zero.detach().index_put((scored,), entropy)


def final_hidden(model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The last hidden states ``[tokens, hidden]`` of one sequence (the lm head applied separately, in chunks)."""
    return model.get_decoder()(input_ids=ids, position_ids=positions).last_hidden_state[0]


LOGITS_CHUNK_TOKENS = 1024  # tokens whose logits exist at once: 1024 x a 152K vocabulary in fp32 is ~620 MB


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target | hidden) under the lm head at ``temperature``, and the entropy (no gradient), computed
    ``chunk_tokens`` at a time: each chunk's logits are recomputed in backward (checkpointed), never whole."""
    chunk_tokens = chunk_tokens or LOGITS_CHUNK_TOKENS
    picked, entropies = [], []
    for a in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[a : a + chunk_tokens], targets[a : a + chunk_tokens]
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            lp, entropy = checkpoint(_chunk_logprobs, h, weight, bias, t, temperature, use_reentrant=False)
        else:
            lp, entropy = _chunk_logprobs(h, weight, bias, t, temperature)
        picked.append(lp)
        entropies.append(entropy)
    if not picked:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(picked), torch.cat(entropies)


def _chunk_logprobs(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's picked log-probabilities and entropies (the latter detached): one pass over its logits."""
    source = (F.linear(h, weight, bias).float() / temperature).log_softmax(-1)
    with torch.no_grad():
        entropy = -(source.exp() * source).sum(-1)
    return source.gather(-1, targets[:, None]).squeeze(-1), entropy


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
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: share each key/value head
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    p = dropout if module.training else 0.0
    out = segment_attention(query, key, value, _segments.get(), scaling, p)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION, _tree_attention)


_register()
