"""Waiting on what a test can observe (an engine's counters), never on a guess of how long something takes."""

from __future__ import annotations

import asyncio

from gyre.engine.engineclient import EngineClient


async def wait_generating(client: EngineClient, tokens: int = 1, timeout_s: float = 60.0) -> None:
    """Until the engine runs a request and has generated ``tokens`` more tokens (read from its statistics, so a
    loaded machine waits longer instead of acting before the generation began)."""
    start = (await client.statistics())["generated_tokens"]
    async with asyncio.timeout(timeout_s):
        while True:
            stats = await client.statistics()
            if stats["running_requests"] >= 1 and stats["generated_tokens"] - start >= tokens:
                return
            await asyncio.sleep(0.01)
