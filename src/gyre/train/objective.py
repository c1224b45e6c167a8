"""The losses a micro-step feeds, per token, weighted by the trajectory processor's admission-time weights.

For a token ``i`` with loss weight ``w_i`` (the weights of a step sum to 1), log-probability ``l_i`` under the step's
weights, behaviour log-probability ``b_i`` (what the engine sampled it with) and advantage ``A_i``:

- **policy** (tokens the policy sampled): ratio ``r_i = exp(l_i - b_i)``, which holds both the staleness of the
  sample and the train/inference mismatch. Truncated importance sampling: the ratio's *value* is cut at
  ``tis_cap`` (``r'_i = r_i * min(r_i, cap) / r_i`` with the factor held constant), so one token whose sampler and
  trainer disagree cannot dominate the step, with the gradient direction unchanged. Then the clipped surrogate with
  asymmetric bounds: ``-min(r'_i A_i, clip(r'_i, 1 - clip_low, 1 + clip_high) A_i)``; a clipped token contributes no
  gradient. Optional KL to a reference model (``kl_coef``, the k3 estimator ``exp(q - l) - (q - l) - 1``).
- **supervised** (demonstrations, e.g. a scripted expert's): ``-supervised_coef * l_i``. Behaviour log-probabilities
  of demonstrations are not a policy's and are never read.

``compute_gradients`` runs forward and backward for one micro-step and returns its `MicroStats` (sums, so a step's
figures are sums over its micro-steps, whichever process computed them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from gyre.config import LossConfig
from gyre.protocol import MicroStats, MicroStep
from gyre.train.loss import token_logprobs_and_entropy

# (model, micro-step, temperature) -> per-token log-probabilities and entropies: the model's forward as the losses see
# it (`gyre.train.loss` for Hugging Face models, `gyre.train.megatron.gpt` for Megatron-core ones). It must score
# the tokens with loss weight > 0 and may leave the others 0 (the Hugging Face forward does: their logits cost most
# of a long execution's lm head); nothing here reads an unweighted token's log-probability or entropy.
Forward = Callable[[Any, MicroStep, float], tuple[torch.Tensor, torch.Tensor]]


def policy_loss(logprobs: torch.Tensor, micro: MicroStep, cfg: LossConfig | None = None) -> torch.Tensor:
    """The clipped, truncated-importance-weighted policy-gradient loss of a micro-step (see the module)."""
    return _policy_terms(logprobs, micro, cfg or LossConfig())[0]


def supervised_loss(logprobs: torch.Tensor, micro: MicroStep, coef: float = 1.0) -> torch.Tensor:
    """The weighted negative log-likelihood of a demonstration micro-step."""
    if micro.objective != "supervised":
        raise ValueError("supervised_loss takes supervised micro-steps (build_step(objective='supervised'))")
    weights = torch.tensor(micro.weights, device=logprobs.device, dtype=logprobs.dtype)
    return -coef * (weights * logprobs).sum()


def _policy_terms(
    logprobs: torch.Tensor, micro: MicroStep, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss, ratio (before truncation, for the figures), clipped mask and truncated mask of a policy micro-step."""
    if micro.objective != "policy":
        raise ValueError(
            "the policy-gradient loss refuses a supervised micro-step: its tokens were not sampled by the policy"
        )
    device, dtype = logprobs.device, logprobs.dtype
    weights = torch.tensor(micro.weights, device=device, dtype=dtype)
    advantages = torch.tensor(micro.advantages, device=device, dtype=dtype)
    behaviour = torch.tensor(micro.behaviour_logprobs, device=device, dtype=dtype)
    # tokens without loss weight are not scored (logprob 0): ratio 1, so no inf * 0 whatever they recorded
    ratio = torch.exp(torch.where(weights > 0, logprobs - behaviour, torch.zeros_like(logprobs)))
    raw = ratio.detach().clamp(max=1e9)  # finite however far sampler and trainer disagree (figures are JSON)
    truncated = torch.zeros_like(ratio, dtype=torch.bool)
    if cfg.tis_cap > 0:
        value = ratio.detach()
        truncated = value > cfg.tis_cap
        ratio = ratio * torch.where(truncated, cfg.tis_cap / value, torch.ones_like(value))
    unclipped = ratio * advantages
    clipped_value = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * advantages
    surrogate = torch.minimum(unclipped, clipped_value)
    clipped = (clipped_value < unclipped).detach()
    return -(weights * surrogate).sum(), raw, clipped, truncated


def compute_gradients(
    model: Any,
    micro: MicroStep,
    cfg: LossConfig,
    policy_version: int,
    reference: Any | None = None,
    forward: Forward = token_logprobs_and_entropy,
) -> MicroStats:
    """Forward and backward of one micro-step into ``model``'s ``.grad`` (accumulating); returns its figures.

    ``policy_version`` is the version of ``model``'s weights (staleness = it minus each token's behaviour version);
    ``reference`` is the frozen reference model for the KL term (required when ``cfg.kl_coef > 0``); ``forward``
    computes both models' log-probabilities.
    """
    started = time.perf_counter()
    temperature = 1.0 if micro.objective == "supervised" else cfg.temperature  # as the engine sampled them
    logprobs, entropy = forward(model, micro, temperature)
    trained = torch.tensor([w > 0 for w in micro.weights], device=logprobs.device)
    n = int(trained.sum())
    stats: dict[str, Any] = {"tokens": n, "computed_tokens": len(micro.input_ids)}
    if micro.objective == "supervised":
        loss = supervised_loss(logprobs, micro, cfg.supervised_coef)
    else:
        loss, ratio, clipped, truncated = _policy_terms(logprobs, micro, cfg)
        r = ratio[trained].double()
        lag = [
            policy_version - v for v, w in zip(micro.versions, micro.weights, strict=True) if w > 0 and v >= 0
        ]
        stats |= {
            "policy_tokens": n,
            "clipped": int((clipped & trained).sum()),
            "truncated": int((truncated & trained).sum()),
            "ratio_sum": float(r.sum()),
            "ratio_sq_sum": float((r * r).sum()),
            "ratio_min": float(r.min()) if n else float("inf"),
            "ratio_max": float(r.max()) if n else 0.0,
            "staleness_sum": sum(lag),
            "staleness_max": max(lag, default=0),
        }
    if cfg.kl_coef > 0:
        if reference is None:
            raise ValueError("loss.kl_coef > 0 needs the reference model")
        with torch.no_grad():
            ref = forward(reference, micro, temperature)[0]  # at the policy's temperature too
        delta = ref - logprobs
        k3 = torch.exp(delta) - delta - 1
        weights = torch.tensor(micro.weights, device=logprobs.device, dtype=logprobs.dtype)
        loss = loss + cfg.kl_coef * (weights * k3).sum()
        stats["kl_sum"] = float(k3.detach()[trained].double().sum())
    loss.backward()
    stats["loss"] = float(loss.detach())
    stats["entropy_sum"] = float(entropy[trained].double().sum())
    stats["seconds"] = time.perf_counter() - started
    return MicroStats(**stats)


def merge_stats(items: list[MicroStats]) -> MicroStats:
    """The sums (and extremes) of several micro-steps' figures."""
    out: dict[str, Any] = {}
    for name in MicroStats.__struct_fields__:
        values = [getattr(s, name) for s in items]
        if name == "ratio_min":
            out[name] = min(values, default=float("inf"))
        elif name in ("ratio_max", "staleness_max"):
            out[name] = max(values, default=0)
        else:
            out[name] = sum(values)
    return MicroStats(**out)


def pace(stats: MicroStats, tokens_per_s: float) -> None:
    """Make a micro-step last ``computed_tokens / tokens_per_s`` at least (a modelled accelerator); 0: no pacing."""
    if tokens_per_s > 0:
        time.sleep(max(stats.computed_tokens / tokens_per_s - stats.seconds, 0.0))
