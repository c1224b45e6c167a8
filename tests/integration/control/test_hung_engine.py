"""An engine that stops answering but keeps its sockets open (SIGSTOP): the router judges it hung from its silent
``/health``, its calls in flight continue on the other cell with no error and token-exact records, and once it runs
again it serves again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from live import Live, eventually
from transformers import AutoModelForCausalLM

from gyre.engine.engineclient import EngineClient
from gyre.protocol import TrainerStatistics
from gyre.router.pool import EngineState
from reference import random_micro_steps

pytestmark = pytest.mark.slow(
    reason="hangs an engine of a live cluster and waits out probes and push deadlines"
)
AGENTS = 16
# the controller keeps hearing the cell: only the router's probe can tell its engine stopped. Its deadlines are the
# busy healthy engine's (cell-0's) too: a probe answered within 10 s, none missed for 20 s
HUNG = ["cells.count=1", "cells.standalone=1", "router.probe_timeout_s=10", "router.hung_after_s=20"]


def engine_pid(port: int) -> int:
    """The engine serving at ``port``: the ``gyre serve-engine`` process with ``port`` on its command line (the
    cell's child, or a child of the suite's fork server that the cell asked for)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "serve-engine" in words and str(port) in words:
            return int(entry)
    raise AssertionError(f"no engine process on port {port}")


def test_a_hung_engine(tiny_model: Path, tmp_path: Path) -> None:
    async def main() -> Live:
        async with Live(tiny_model, tmp_path, HUNG) as live:
            stop = asyncio.Event()
            agents = [asyncio.ensure_future(live.agent(i, stop, turns=4)) for i in range(AGENTS)]
            engine = live.pool.engines["serve-0"]
            await eventually("calls in flight on serve-0", lambda: len(engine.inflight) >= 3)
            port = int(engine.url.rsplit(":", 1)[1])
            pid = engine_pid(port)
            os.kill(pid, signal.SIGSTOP)
            try:
                await eventually("serve-0 judged hung", lambda: engine.state is EngineState.HUNG, 120)
                await eventually("its calls to leave it", lambda: not engine.inflight, 30)
                replies = sum(len(c.replies) for c in live.conversations)
                await eventually("agents to go on", lambda: sum(len(c.replies) for c in live.conversations)
                                 >= replies + AGENTS)  # fmt: skip
                assert live.controller.statistics().cells[1].role == "serving"  # the cell itself is fine
            finally:
                os.kill(pid, signal.SIGCONT)
            await eventually("serve-0 to serve again", lambda: engine.state is EngineState.SERVING, 60)
            calls = engine.calls
            await eventually("new calls on serve-0", lambda: engine.calls > calls + 3)
            stop.set()
            await asyncio.gather(*agents)
            return live

    live = asyncio.run(main())
    assert live.errors == []
    stats = live.pool.statistics()
    assert stats.hung_engines == 1  # serve-0, once: busy cells that answer their probe are never judged hung
    assert stats.moved_calls >= 3 and stats.engines == {"cell-0": "serving", "serve-0": "serving"}
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model, local_files_only=True, dtype=torch.float32
    ).eval()
    assert live.check_token_exact({0: model}) >= AGENTS


def test_a_hung_engine_misses_weight_pushes_without_holding_training_up(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The core's push to a hung engine ends at ``transfer_timeout_s``, the engine is detached (steps after it do
    not wait for it at all), and once it answers again it is attached again with the newest weights."""
    deadline = 20.0  # also the healthy pushes' (cell-0's own engine, the revived one) and weight-group joins'
    steps = [random_micro_steps(11, 2), random_micro_steps(12, 2), random_micro_steps(13, 2)]

    async def main() -> tuple[TrainerStatistics, TrainerStatistics, int]:
        async with Live(tiny_model, tmp_path, [*HUNG, f"trainer.transfer_timeout_s={deadline}"]) as live:
            engine = live.pool.engines["serve-0"]
            port = int(engine.url.rsplit(":", 1)[1])
            pid = engine_pid(port)
            await live.controller.to_train("cell-0")
            os.kill(pid, signal.SIGSTOP)
            try:
                for step, items in enumerate(steps):  # version 1 is pushed to the stopped engine
                    await asyncio.to_thread(live.trainer.submit, step, items, True)
                    await asyncio.to_thread(live.trainer.wait_step, step, 300)
                detached = await asyncio.to_thread(live.trainer.statistics)
            finally:
                os.kill(pid, signal.SIGCONT)
            client = EngineClient(engine.url, timeout_s=60)
            try:
                for _ in range(240):  # it answers again: the core attaches it and pushes what it missed
                    attached = await asyncio.to_thread(live.trainer.statistics)
                    if engine.url in attached.engines:
                        version = await client.get_weight_version()
                        if version == len(steps):
                            break
                    await asyncio.sleep(0.5)
            finally:
                await client.aclose()
            await live.controller.to_serve("cell-0")
            return detached, attached, version

    # the mechanism, not the steps' seconds (a loaded machine stretches those): the push to the stopped engine
    # timed out and detached it, so later steps did not wait for it; once it answers it is attached again
    detached, attached, version = asyncio.run(main())
    url = next(iter(detached.detached))  # serve-0's engine, and only it
    assert "serve-0" not in str(detached.engines) and url not in detached.engines
    assert "timed out" in detached.detached[url] or "did not" in detached.detached[url], detached.detached
    assert url in attached.engines and not attached.detached
    assert version == len(steps)  # it serves the newest weights
