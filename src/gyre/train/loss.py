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
    """``out[i]``: log p(token i | its ancestors) under ``model`` (0 where a sequence starts)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids = torch.tensor([micro.input_ids], device=device)
    positions = torch.tensor([micro.position_ids], device=device)
    allowed = ancestor_mask(micro.parents, device)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    logits = model(input_ids=ids, attention_mask=bias[None, None], position_ids=positions).logits[0]
    parents = torch.tensor(micro.parents, device=device)
    has_parent = parents >= 0
    source = logits[parents.clamp(min=0)].float().log_softmax(-1)
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
