"""Reference computations with Hugging Face transformers, which the engine must reproduce."""

from __future__ import annotations

from typing import Any

import torch


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """Hugging Face ``generate`` greedy continuation of exactly ``n`` tokens."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return [int(t) for t in out[0, len(prompt) :]]


def hf_logprobs(model: Any, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """Teacher-forced log-probabilities of ``output`` after ``prompt`` (temperature-scaled)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]
