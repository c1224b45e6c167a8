"""Log-probabilities of a packed micro-step under a causal LM, and the policy loss both packings feed.

A micro-step row holds sequences whose tokens attend to their ancestors only (``parents``): a chain for a path, a
tree for a tree-packed execution, several of either side by side. The attention mask is that ancestor relation and
the position ids are depths, so a token's logits are exactly those of the same token at the end of its own path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gyre.train.step import MicroStep


def ancestor_mask(parents: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``mask[i, j]``: token j is token i or one of its ancestors (parents come before children)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    for i, p in enumerate(parents):
        if p >= 0:
            if p >= i:
                raise ValueError(f"token {i}'s parent {p} does not come before it")
            mask[i, : p + 1] = mask[p, : p + 1]
        mask[i, i] = True
    return mask


def token_logprobs(model: Any, micro: MicroStep) -> torch.Tensor:
    """``out[i]``: log p(token i | its ancestors) under ``model`` (0 where a sequence starts).

    The row's sequences are independent (each starts at a token without a parent), so each is computed on its own:
    a chain (a path) with the model's plain causal attention, a tree with its ancestor mask. Attention then costs the
    sum of the squared sequence lengths, not the square of the row's.
    """
    pieces = []
    for start, end in sequence_bounds(micro.parents):
        parents = [p - start if p >= 0 else -1 for p in micro.parents[start:end]]
        pieces.append(
            _sequence_logprobs(model, micro.input_ids[start:end], micro.position_ids[start:end], parents)
        )
    if not pieces:
        return torch.zeros(0, device=next(model.parameters()).device)
    return torch.cat(pieces)


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


def _sequence_logprobs(
    model: Any, input_ids: list[int], position_ids: list[int], parents: list[int]
) -> torch.Tensor:
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids = torch.tensor([input_ids], device=device)
    positions = torch.tensor([position_ids], device=device)
    chain = all(p == i - 1 for i, p in enumerate(parents))
    if chain:
        logits = model(input_ids=ids, position_ids=positions).logits[0]
    else:
        allowed = ancestor_mask(parents, device)
        bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
        bias.masked_fill_(~allowed, torch.finfo(dtype).min)
        logits = model(input_ids=ids, attention_mask=bias[None, None], position_ids=positions).logits[0]
    index = torch.tensor(parents, device=device)
    has_parent = index >= 0
    source = logits[index.clamp(min=0)].float().log_softmax(-1)
    picked = source.gather(-1, ids[0, :, None]).squeeze(-1)
    return torch.where(has_parent, picked, torch.zeros_like(picked))


def policy_loss(logprobs: torch.Tensor, micro: MicroStep, clip: float = 0.2) -> torch.Tensor:
    """The clipped importance-weighted policy-gradient loss of a micro-step, weighted per token.

    ``sum_i w_i * -min(r_i * A_i, clip(r_i) * A_i)`` with ``r_i = exp(logprob_i - behaviour_logprob_i)``; the
    weights of a step sum to 1, so the micro-steps' losses add up to the step's loss.
    """
    device = logprobs.device
    weights = torch.tensor(micro.weights, device=device)
    advantages = torch.tensor(micro.advantages, device=device)
    behaviour = torch.tensor(micro.behaviour_logprobs, device=device)
    ratio = torch.exp(logprobs - behaviour)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip, 1 + clip) * advantages
    return -(weights * torch.minimum(unclipped, clipped)).sum()
