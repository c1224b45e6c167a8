"""Checkpoints: Hugging Face weights + optimizer state + step + version + data cursor; resuming is bit-for-bit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gyre.config import EngineConfig, TrainerConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.errors import ConfigError
from gyre.protocol import GenerateRequest, SamplingParams
from gyre.train.state import TrainState
from reference import random_micro_steps, train_step


def config(model: Path, **kw: object) -> TrainerConfig:
    return TrainerConfig(model_path=str(model), learning_rate=1e-3, lr_warmup_steps=2, weight_decay=0.01,
                         **kw)  # type: ignore[arg-type]  # fmt: skip


def test_resuming_from_a_checkpoint_gives_the_same_next_update_bit_for_bit(
    tiny_model: Path, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    steps = [random_micro_steps(seed, 3) for seed in range(3)]
    straight = TrainState(config(tiny_model))
    for items in steps:
        train_step(straight, items)

    first = TrainState(config(tiny_model))
    for items in steps[:2]:
        train_step(first, items)
    first.data_cursor = {"executions_consumed": 12}
    saved = first.save(tmp_path / "ckpt")
    resumed = TrainState(config(tiny_model, resume_from=str(saved)))
    assert (resumed.step, resumed.version, resumed.data_cursor) == (2, 2, {"executions_consumed": 12})
    train_step(resumed, steps[2])
    for (name, a), (_, b) in zip(straight.named, resumed.named, strict=True):
        assert torch.equal(a, b), name
    for (_, a), (_, b) in zip(straight.named, resumed.named, strict=True):
        sa, sb = straight.optimizer.state[a], resumed.optimizer.state[b]
        assert all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_a_fresh_run_can_start_from_a_checkpoints_optimizer_moments(tiny_model: Path, tmp_path: Path) -> None:
    """``optimizer_from`` (RL after gyre sft): the checkpoint's AdamW moments, the weights of ``model_path``, step and
    version 0; its next update is the one the checkpoint's own run would have made."""
    torch.manual_seed(0)
    steps = [random_micro_steps(seed, 3) for seed in range(3)]
    straight = TrainState(TrainerConfig(model_path=str(tiny_model), learning_rate=1e-3))
    for items in steps:
        train_step(straight, items)
    first = TrainState(TrainerConfig(model_path=str(tiny_model), learning_rate=1e-3))
    for items in steps[:2]:
        train_step(first, items)
    saved = first.save(tmp_path / "sft")
    warm = TrainState(TrainerConfig(model_path=str(saved), optimizer_from=str(saved), learning_rate=1e-3))
    assert (warm.step, warm.version) == (0, 0)
    train_step(warm, steps[2])
    for (name, a), (_, b) in zip(straight.named, warm.named, strict=True):
        assert torch.equal(a, b), name
    cold = TrainState(TrainerConfig(model_path=str(saved), learning_rate=1e-3))
    before = cold.flat.clone()
    train_step(cold, steps[2])  # a fresh Adam's first update: every weight moves by about the learning rate
    moved = (cold.flat - before).abs()
    assert moved.median() > 0.9e-3 and (warm.flat - before).abs().median() < 0.8 * moved.median()
    with pytest.raises(ConfigError, match="not a Gyre checkpoint"):
        TrainState(TrainerConfig(model_path=str(tiny_model), optimizer_from=str(tiny_model)))


def test_a_checkpoint_loads_in_transformers_and_in_the_embedded_engine(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    state = TrainState(config(tiny_model))
    train_step(state, random_micro_steps(7, 2))
    path = state.save(tmp_path / "ckpt")
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    for (name, p), (_, q) in zip(state.named, hf.named_parameters(), strict=True):
        assert torch.equal(p, q), name

    async def generate() -> list[int]:
        engine = EmbeddedEngine(EngineConfig(model_path=str(path), num_threads=1))
        try:
            params = SamplingParams(max_new_tokens=4, temperature=0.0)
            out = await engine.generate(GenerateRequest(input_ids=[5, 6, 7], sampling_params=params))
            return out.output_ids
        finally:
            engine.close()

    assert len(asyncio.run(generate())) == 4


def test_learning_rate_warms_up_then_follows_the_schedule(tiny_model: Path) -> None:
    state = TrainState(TrainerConfig(model_path=str(tiny_model), learning_rate=1.0, lr_warmup_steps=4,
                                     lr_schedule="cosine", lr_decay_steps=10, lr_min_ratio=0.1))  # fmt: skip
    assert [state.lr_at(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert state.lr_at(4) == pytest.approx(1.0)
    assert state.lr_at(9) == pytest.approx(0.1 + 0.9 * 0.5)
    assert state.lr_at(14) == pytest.approx(0.1) == state.lr_at(100)


def test_a_directory_that_is_not_a_checkpoint_is_refused_clearly(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="not a Gyre checkpoint"):
        TrainState(TrainerConfig(model_path=str(tiny_model), resume_from=str(tiny_model)))
    with pytest.raises(ConfigError, match="model_path is empty"):
        TrainState(TrainerConfig())
