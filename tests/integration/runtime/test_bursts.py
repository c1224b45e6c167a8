"""Bursts overlap: a new burst starts while the last one's tail still runs, each keeps its own counters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gyre.config import RouterConfig, SandboxConfig
from gyre.router.routing import Router
from gyre.runtime import ExecutionSpec, OracleAgentSpec, Runtime
from gyre.tasks import Task


def oracle(task_id: str, seconds: float) -> ExecutionSpec:
    task = Task(
        id=task_id, instruction="write a", solution_files={"a": "1"}, solution_command=f"sleep {seconds}"
    )
    return ExecutionSpec(task=task, group_index=0, agent=OracleAgentSpec())


async def wait_until(what: str, condition: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_new_burst_starts_while_the_last_ones_tail_runs(tiny_model: Path) -> None:
    async def go() -> None:
        router = Router(RouterConfig(model_path=str(tiny_model)))
        runtime = Runtime(router, SandboxConfig(), verifier=False)
        try:
            tail = asyncio.create_task(runtime.run([oracle("slow", 30), oracle("slow", 30)]))
            await wait_until("the tail to start", lambda: runtime.statistics().running == 2)
            assert runtime.new_burst() == 1  # the tail of burst 0 still runs: not refused
            await runtime.run([oracle("quick", 0)])
            now, first = runtime.statistics(), runtime.statistics(0)
            assert (now.burst, now.dispatched, now.finished, now.water_level) == (1, 1, 1, 0)
            assert (first.dispatched, first.finished, first.water_level) == (2, 0, 2)
            assert now.in_flight == first.in_flight == 2  # the water level of every burst together
            tail.cancel()
            await asyncio.gather(tail, return_exceptions=True)
            assert runtime.statistics(0).by_status == {"cancelled": 2} and runtime.statistics().in_flight == 0
        finally:
            await runtime.aclose()
            await router.aclose()

    asyncio.run(go())
