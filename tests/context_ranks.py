"""Ranks of a context-parallel group over gloo that compute one micro-step of the tiny model together
(`tests/integration/train/test_context_parallel.py`): each rank is its own process (``torch.multiprocessing``)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch
import torch.distributed as dist

from gyre.config import LossConfig
from gyre.protocol import MicroStep


def tree_micro_step(seed: int, tokens: int, branches: int, vocab: int = 260) -> MicroStep:
    """A tree of ``tokens`` tokens: a trunk, then ``branches`` chains each growing from a random earlier token (a
    shared prefix and its continuations, as a tree-packed execution), random policy weights on every branch."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(tokens // 4, tokens - 1), branches))
    parents: list[int] = []
    for i in range(tokens):
        if i == 0:
            parents.append(-1)
        elif i in cuts:
            parents.append(rng.randrange(0, i - 1))  # a new branch from an earlier token
        else:
            parents.append(i - 1)
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    weights = [0.0 if p < 0 else rng.uniform(0.0, 2.0) / tokens for p in parents]
    return MicroStep(input_ids=[rng.randrange(vocab) for _ in range(tokens)], position_ids=depth, parents=parents,
                     weights=weights, advantages=[rng.uniform(-1, 1) for _ in range(tokens)],
                     behaviour_logprobs=[rng.uniform(-6.0, -4.0) for _ in range(tokens)], versions=[0] * tokens,
                     sequences=1)  # fmt: skip


def grouped_model(directory: Path, kv_heads: int, seed: int = 0) -> Path:
    """The tiny preset's shape with ``kv_heads`` key/value heads (its 4 query heads share them: 4 query heads a
    key/value head at 1), randomly initialised, written to ``directory`` with the tiny model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gyre.engine.models import init_model

    init_model(directory, preset="tiny", seed=seed)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    config.num_key_value_heads = kv_heads
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def run_rank(rank: int, world: int, port: int, model_dir: str, micro_json: str, out: str) -> None:
    """One rank: its part of the micro-step's forward and backward; rank 0 writes the sums over ranks."""
    import msgspec

    from gyre.train import context
    from gyre.train.state import flat_gradient, load_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        micro = msgspec.json.decode(micro_json, type=MicroStep)
        model = load_model(model_dir)
        stats = context.compute_gradients(model, micro, LossConfig(), 0, dist.group.WORLD)
        gradient = flat_gradient(model).double()
        dist.all_reduce(gradient)
        figures = torch.tensor([stats.loss, stats.tokens, stats.computed_tokens], dtype=torch.float64)
        dist.all_reduce(figures)
        if rank == 0:
            torch.save(gradient, f"{out}/gradient.pt")
            Path(f"{out}/figures.json").write_text(json.dumps(figures.tolist()))
    finally:
        dist.destroy_process_group()
