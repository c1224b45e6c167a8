"""A cell killed while it serves and one killed while it trains: no execution is lost, no agent sees an error, the
step completes with the same update, and a restarted cell rejoins."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from live import Live, eventually
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gyre.config import TrainerConfig
from gyre.protocol import MicroStep
from gyre.train.state import TrainState
from reference import random_micro_steps, train_step

pytestmark = pytest.mark.slow(reason="kills cells of a live cluster and waits out their timeouts")
AGENTS = 40
# 20 s, not less: the killed cell's timeouts are its healthy peers' too (cell-0 and serve-0 serving 40 agents, the
# restarted cell-1 training as a satellite, which judges the core silent after twice member_timeout_s)
FAULTS = ["cells.count=2", "cells.standalone=1", "controller.cell_timeout_s=20", "trainer.member_timeout_s=20",
          "trainer.checkpoint_every_steps=1"]  # fmt: skip


def same_update(model: Path, steps: list[list[MicroStep]], saved: Path) -> float:
    reference = TrainState(TrainerConfig(model_path=str(model), learning_rate=1e-3))
    for items in steps:
        train_step(reference, items)
    final = load_file(str(saved / "model.safetensors"))
    return max(float((final[n] - p.detach()).abs().max()) for n, p in reference.named if n in final)


def models(tiny_model: Path, checkpoints: Path, last: int) -> dict[int, object]:
    load = AutoModelForCausalLM.from_pretrained
    return {0: load(tiny_model, local_files_only=True, dtype=torch.float32).eval(),
            **{v: load(checkpoints / f"step-{v}", local_files_only=True, dtype=torch.float32).eval()
               for v in range(1, last + 1)}}  # fmt: skip


def test_a_cell_killed_while_serving(tiny_model: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    steps = [random_micro_steps(7, 4), random_micro_steps(8, 4)]

    async def main() -> Live:
        async with Live(tiny_model, tmp_path, [*FAULTS, f'trainer.checkpoint_dir="{checkpoints}"']) as live:
            stop = asyncio.Event()
            agents = [asyncio.ensure_future(live.agent(i, stop)) for i in range(AGENTS)]
            cell = live.pool.engines["cell-1"]
            await eventually("calls in flight on cell-1", lambda: len(cell.inflight) >= 3)
            live.kill("cell-1")  # mid-generation: its engine dies with it
            await live.controller.wait_role("cell-1", ("gone",), 120)
            # the step goes on without it
            await live.controller.to_train("cell-0")
            await asyncio.to_thread(live.trainer.submit, 0, steps[0], True)
            await asyncio.to_thread(live.trainer.wait_step, 0, 300)
            await live.controller.to_serve("cell-0")
            # restarted, it rejoins: serves, then trains in the next step as a satellite
            await live.restart("cell-1")
            await live.controller.to_train("cell-0")
            await live.controller.to_train("cell-1")
            await asyncio.to_thread(live.trainer.submit, 1, steps[1], True)
            metrics = await asyncio.to_thread(live.trainer.wait_step, 1, 300)
            await live.controller.to_serve("cell-1")
            await live.controller.to_serve("cell-0")
            assert metrics.micro_steps == 4 and sum(metrics.by_member.values()) == 4
            stop.set()
            await asyncio.gather(*agents)
            return live

    live = asyncio.run(main())
    assert live.errors == []
    stats = live.controller.statistics()
    assert stats.gone == 1 and [c.role for c in stats.cells] == ["serving"] * 3
    assert live.pool.statistics().engine_failures >= 1  # the calls in flight there moved
    assert same_update(tiny_model, steps, checkpoints / "step-2") <= 1e-5
    assert live.check_token_exact(models(tiny_model, checkpoints, 2)) >= AGENTS


def test_a_cell_killed_while_training(tiny_model: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    items = random_micro_steps(9, 24)

    async def main() -> Live:
        async with Live(tiny_model, tmp_path, [*FAULTS, f'trainer.checkpoint_dir="{checkpoints}"']) as live:
            stop = asyncio.Event()
            agents = [asyncio.ensure_future(live.agent(i, stop)) for i in range(AGENTS)]
            await live.controller.to_train("cell-0")
            await live.controller.to_train("cell-1")
            await asyncio.to_thread(live.trainer.submit, 0, items, True)

            def holds() -> bool:
                return "cell-1" in live.trainer.statistics().claims

            proc = live.cluster.procs["cell-1"]
            for _ in range(50):  # stopped at a moment the core sees it holding one (what it sent has landed)
                await eventually("cell-1 to hold a micro-step", holds)
                os.kill(proc.pid, signal.SIGSTOP)
                await asyncio.sleep(0.3)
                if holds():
                    break
                os.kill(proc.pid, signal.SIGCONT)
            live.kill("cell-1")  # mid-micro-step
            metrics = await asyncio.to_thread(live.trainer.wait_step, 0, 300)
            assert metrics.micro_steps == len(items) and sum(metrics.by_member.values()) == len(items)
            assert metrics.reclaimed >= 1  # what it held was computed by the core
            await live.controller.wait_role("cell-1", ("gone",), 120)
            await live.controller.to_serve("cell-0")
            stop.set()
            await asyncio.gather(*agents)
            return live

    live = asyncio.run(main())
    assert live.errors == []
    assert same_update(tiny_model, [items], checkpoints / "step-1") <= 1e-5
    assert live.check_token_exact(models(tiny_model, checkpoints, 1)) >= AGENTS
