"""Live agents through role switches of real cells: nobody notices, every record is token-exact, and every
micro-step is trained exactly once (the update equals one process computing each whole batch)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import torch
from live import Live, eventually
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gyre.config import TrainerConfig
from gyre.journal import read_journal
from gyre.protocol import MicroStep, StepMetrics, SwitchRecord
from gyre.train.state import TrainState
from reference import random_micro_steps, train_step

# The size that shows each property (every switch under load moves calls, a satellite joins steps under way, each
# record spans the versions it was sampled at): 64 agents through 24 switches. The scale case (200 agents through
# 1,000 switches) is benchmarks/chaos.py's.
AGENTS = 64
CYCLES = 6  # four switches each: 24


def _load(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()


@pytest.mark.slow(reason="64 live agents through 24 role switches; every record checked against 7 models")
def test_live_agents_through_switches(tiny_model: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    overrides = ["cells.count=2", "cells.standalone=1", "trainer.checkpoint_every_steps=1",
                 f'trainer.checkpoint_dir="{checkpoints}"']  # fmt: skip
    steps = [random_micro_steps(1000 + k, 6) for k in range(CYCLES)]

    async def main() -> tuple[Live, list[StepMetrics]]:
        async with Live(tiny_model, tmp_path, overrides) as live:
            stop = asyncio.Event()
            agents = [asyncio.ensure_future(live.agent(i, stop, tool_s=2.0)) for i in range(AGENTS)]

            async def calls_on(name: str) -> None:
                engine = live.pool.engines[name]
                await eventually(f"calls in flight on {name}", lambda: bool(engine.inflight))

            metrics = []
            for k, items in enumerate(steps):
                # each serve -> train drains a cell with calls in flight (the switch moves them mid-generation);
                # without the wait a cell just back from training may not have been given a call yet
                await calls_on("cell-0")
                await live.controller.to_train("cell-0")
                await asyncio.to_thread(live.trainer.submit, k, items[:3])
                await calls_on("cell-1")
                await live.controller.to_train("cell-1")  # joins a step under way
                await asyncio.to_thread(live.trainer.submit, k, items[3:], True)
                metrics.append(await asyncio.to_thread(live.trainer.wait_step, k, 300))
                await live.controller.to_serve("cell-1")
                await live.controller.to_serve("cell-0")
            stop.set()
            await asyncio.gather(*agents)
            return live, metrics

    live, metrics = asyncio.run(main())

    assert live.errors == []  # no agent saw a switch
    switches = list(read_journal(tmp_path / "run" / "switches.jsonl", SwitchRecord))
    assert len(switches) == 4 * CYCLES and not any(s.error for s in switches)
    assert sum(s.moved_calls for s in switches) > 0  # calls really were moved mid-generation
    assert {s.version for s in switches if s.direction == "train_to_serve"} == set(range(1, CYCLES + 1))
    assert set(next(iter(s.phases)) for s in switches if s.direction == "serve_to_train") == {"drain"}

    # every micro-step's gradient summed exactly once, and the satellite did join steps under way
    for m, items in zip(metrics, steps, strict=True):
        assert m.micro_steps == len(items) and sum(m.by_member.values()) == len(items)
    assert sum(m.by_member.get("cell-1", 0) for m in metrics) > 0
    reference = TrainState(TrainerConfig(model_path=str(tiny_model), learning_rate=1e-3))
    for items in steps:
        train_step(reference, items)
    final = load_file(str(checkpoints / f"step-{CYCLES}" / "model.safetensors"))
    worst = max(float((final[n] - p.detach()).abs().max()) for n, p in reference.named if n in final)
    assert worst <= 1e-5, f"the cells' update differs from one process computing each batch by {worst:g}"

    # every record is what the model at its tokens' versions sampled
    models = {0: _load(tiny_model), **{v: _load(checkpoints / f"step-{v}") for v in range(1, CYCLES + 1)}}
    assert live.check_token_exact(models) >= AGENTS * 3


def _step_items(seed: int) -> list[MicroStep]:
    return random_micro_steps(seed, 8)


@pytest.mark.timing  # a loaded machine once held the core's answer to SetEngine past 120 s here
def test_switch_phases_and_statistics(tiny_model: Path, tmp_path: Path) -> None:
    """A serve -> train -> serve cycle of each trainable cell, its phases in order, the roles as it goes."""

    async def main() -> tuple[list[SwitchRecord], list[dict[str, Any]]]:
        async with Live(tiny_model, tmp_path, ["cells.count=2"]) as live:
            seen = [msgspec.to_builtins(live.controller.statistics())]
            records = [await live.controller.to_train("cell-0")]
            seen.append(msgspec.to_builtins(live.controller.statistics()))
            records.append(await live.controller.to_serve("cell-0"))
            with pytest.raises(Exception, match="cannot start serving"):
                await live.controller.to_serve("cell-1")
            return records, seen

    records, seen = asyncio.run(main())
    assert [c["role"] for c in seen[0]["cells"]] == ["serving", "serving"]
    assert [c["role"] for c in seen[1]["cells"]] == ["training", "serving"]
    assert list(records[0].phases) == ["drain", "stop_pushes", "release", "join"]
    assert list(records[1].phases) == ["leave", "resume", "weights", "route"]
    assert records[1].version == 0


@pytest.mark.slow(
    reason="a second switch scenario on a live cluster; the fast tier switches in test_switch_phases_and_statistics"
)
def test_a_request_left_on_the_engine_does_not_fail_the_switch(tiny_model: Path, tmp_path: Path) -> None:
    """A request that reached the cell's engine by its URL (not through the router, so no drain moves it) is ended
    as aborted by serve -> train instead of failing the switch; the cell serves again after train -> serve."""

    async def main() -> tuple[SwitchRecord, dict[str, Any], dict[str, Any]]:
        async with Live(tiny_model, tmp_path, ["cells.count=2"]) as live:
            url = live.controller.cells["cell-0"].engine_url.rstrip("/")
            body = {"input_ids": [1, 2, 3], "stream": True,
                    "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}  # fmt: skip
            async with httpx.AsyncClient(timeout=120) as http:
                running, chunks = asyncio.Event(), []

                async def generate() -> None:
                    async with http.stream("POST", f"{url}/generate", json=body) as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                                chunks.append(json.loads(line[5:]))
                                running.set()

                left = asyncio.ensure_future(generate())
                await asyncio.wait_for(running.wait(), 60)
                record = await live.controller.to_train("cell-0")
                await asyncio.wait_for(left, 60)
                await live.controller.to_serve("cell-0")
                short = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}
                served = (await http.post(f"{url}/generate", json=short)).json()
                return record, chunks[-1], served

    record, last, served = asyncio.run(main())
    assert not record.error and list(record.phases) == ["drain", "stop_pushes", "release", "join"], record
    assert last["meta_info"]["finish_reason"]["type"] == "abort", last["meta_info"]
    assert len(last["output_ids"]) < 20000
    assert len(served["output_ids"]) == 3, served  # it steps again
