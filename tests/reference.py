"""Reference computations with Hugging Face transformers, which the engine must reproduce."""

from __future__ import annotations

import random
from typing import Any

import torch

from gyre.protocol import MicroStep
from gyre.train.objective import compute_gradients
from gyre.train.state import TrainState


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


def random_micro_steps(seed: int, count: int, vocab: int = 260, tokens: int = 0) -> list[MicroStep]:
    """Chains of random tokens (20-119 each, or ``tokens``) with random behaviour logprobs and advantages; weights
    sum to 1 over the list."""
    rng = random.Random(seed)
    sizes = [tokens or rng.randrange(20, 120) for _ in range(count)]
    total = sum(n - 1 for n in sizes)
    out = []
    for n in sizes:
        ids = [rng.randrange(vocab) for _ in range(n)]
        out.append(MicroStep(input_ids=ids, position_ids=list(range(n)), parents=[-1, *range(n - 1)],
                             weights=[0.0] + [1.0 / total] * (n - 1), advantages=[rng.uniform(-1, 1)] * n,
                             behaviour_logprobs=[rng.uniform(-6.0, -4.0) for _ in range(n)], versions=[0] * n,
                             sequences=1))  # fmt: skip
    return out


def train_step(state: TrainState, items: list[MicroStep]) -> None:
    for m in items:
        compute_gradients(state.model, m, state.cfg.loss, state.version, state.reference)
        state.add_model_gradients()
    state.apply()
