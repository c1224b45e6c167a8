"""Fair service under many keep-alive agent connections (issue 17), and between sessions (issue 48).

A scripted engine answers at once, so the router's one event loop is the bottleneck. Agents that connect while
others keep the router busy must be answered within a few of the others' rounds. Before the fix the router accepted
one connection per event-loop iteration (libuv's way under uvloop), and a call waiting for an engine connection
was overtaken by later ones: late agents waited until the busy ones were done (35-47x the busy agents' median call
here; p99 8-21x the p50 at 256 concurrent in ``benchmarks/router.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.router.spawn import launch_router

BUSY = 64  # agents calling back to back on their keep-alive connections
LATE = 128  # agents that connect at once while the router is busy, one call each
SPREAD = 6.0  # a late agent's first answer arrives within this many of the busy agents' median call latency


# The scripted engine in a process of its own: in this one it would share the interpreter with the agents, and the
# router would not be the bottleneck.
ENGINE = """
import sys, time
from gyre.engine.scripted import ScriptedEngine
from gyre.engine.models import load_tokenizer
with ScriptedEngine(load_tokenizer(sys.argv[1]), lambda ids: "ok") as engine:
    print(engine.url, flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def router(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    logs = tmp_path_factory.mktemp("fairness")
    command = [sys.executable, "-c", ENGINE, str(tiny_model)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as engine:
        try:
            assert engine.stdout is not None
            url = engine.stdout.readline().strip()
            assert url.startswith("http://"), "the scripted engine did not start"
            proc, admin = launch_router(tiny_model, [url], log_path=logs / "router.log")
            with proc:
                yield proc, admin
        finally:
            engine.kill()


class Agent:
    """One keep-alive HTTP/1.1 connection to the router, calling chat completions for one session."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token, self.calls = port, token, 0

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def chat(self) -> None:
        body = json.dumps({
            "model": "default", "max_tokens": 4,
            "messages": [{"role": "user", "content": f"question {self.calls}"}],
        }).encode()  # fmt: skip
        head = f"POST /s/{self.token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        self.writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        assert header.startswith(b"HTTP/1.1 200"), header
        length = next(
            int(h.split(b":")[1]) for h in header.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        await self.reader.readexactly(length)
        self.calls += 1

    def close(self) -> None:
        self.writer.close()


async def _late_agents_meet_busy_ones(port: int, tokens: list[str]) -> tuple[list[float], list[float]]:
    """(latencies of the busy agents' calls while the late ones were served, the late agents' first answers)."""
    busy = [Agent(port, token) for token in tokens[:BUSY]]
    late = [Agent(port, token) for token in tokens[BUSY:]]
    latencies: list[float] = []
    busy_enough = asyncio.Event()  # the busy agents have made three calls each (on average)
    stop = False

    async def keep_busy(agent: Agent) -> None:
        await agent.connect()
        while not stop:
            start = time.perf_counter()
            await agent.chat()
            latencies.append(time.perf_counter() - start)
            if len(latencies) >= 3 * BUSY:
                busy_enough.set()
        agent.close()

    async def first_answer(agent: Agent) -> float:
        start = time.perf_counter()
        await agent.connect()
        await agent.chat()
        agent.close()
        return time.perf_counter() - start

    async with asyncio.TaskGroup() as group:
        for agent in busy:
            group.create_task(keep_busy(agent))
        await busy_enough.wait()
        seen = len(latencies)
        firsts = await asyncio.gather(*(first_answer(agent) for agent in late))
        during = latencies[seen:]
        stop = True
    return during, firsts


@pytest.mark.slow(
    reason="waves of agents against a busy router and its own engine (~20 s with the engine's start)"
)
def test_agents_that_connect_while_the_router_is_busy_are_answered_within_a_few_rounds(
    router: tuple[ServerProcess, str],
) -> None:
    proc, admin = router
    with httpx.Client() as http:
        tokens = [
            http.post(f"{admin}/admin/sessions", json={"execution_id": f"fair-{i}"}).json()["token"]
            for i in range(BUSY + LATE)
        ]
    during, firsts = asyncio.run(_late_agents_meet_busy_ones(proc.port, tokens))
    round_s = statistics.median(during)
    slowest = max(firsts)
    assert slowest <= SPREAD * round_s, (
        f"the slowest of {LATE} agents that connected while {BUSY} kept the router busy got its first answer after "
        f"{slowest * 1e3:.0f} ms, {slowest / round_s:.1f}x the busy agents' median call ({round_s * 1e3:.0f} ms)"
    )


# ---- issue 48: one session's flood waits behind its own limit ------------------------------------------------------
FLOOD_CALLS = 6
PER_SESSION = 2


@pytest.fixture(scope="module")
def slow_router(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    """A router allowing `PER_SESSION` calls per session, in front of the embedded engine at 30 ms a step."""
    logs = tmp_path_factory.mktemp("fairness-slow")
    overrides = ["engine.kv_cache_mem_gib=0.05", "engine.modelled_step_s=0.03"]
    with launch_embedded(tiny_model, overrides=overrides, log_path=logs / "engine.log") as engine:
        proc, admin = launch_router(tiny_model, [engine.url], log_path=logs / "router.log",
                                    overrides=[f"router.max_calls_per_session={PER_SESSION}"])  # fmt: skip
        with proc:
            yield proc, admin


@pytest.mark.slow(reason="starts an embedded engine and runs three rounds of 64-token calls: ~20 s")
def test_a_flooding_sessions_calls_wait_behind_its_own_limit_while_another_sessions_call_is_answered(
    slow_router: tuple[ServerProcess, str],
) -> None:
    """Before issue 48 every call of a flooding session ran at once, and its neighbours' calls queued with them in
    the engine's batch and on the router's loop (their median latency rose 8x). Now the flood holds
    `PER_SESSION` calls; the rest wait for its own, and a neighbour's call is admitted at once."""
    _, admin = slow_router
    with httpx.Client(timeout=60) as http:
        opened = [
            http.post(f"{admin}/admin/sessions", json={"execution_id": name}).json()
            for name in ("flood", "polite")
        ]
        (flood, flood_url), (polite, polite_url) = [(o["token"], o["base_url"]) for o in opened]

        def calls(token: str) -> dict[str, Any]:
            stats: dict[str, Any] = http.get(f"{admin}/admin/sessions/{token}/calls").json()
            return stats

        def flood_call(i: int) -> int:
            body = {
                "model": "default",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": f"flood {i}"}],
            }
            return httpx.post(f"{flood_url}/chat/completions", json=body, timeout=120).status_code

        with concurrent.futures.ThreadPoolExecutor(FLOOD_CALLS) as pool:
            statuses = [pool.submit(flood_call, i) for i in range(FLOOD_CALLS)]
            deadline = time.monotonic() + 60
            # until the flood's calls queue: its limit running, the others waiting
            while (seen := calls(flood))["running"] < PER_SESSION or not seen["waiting"]:
                assert time.monotonic() < deadline, seen
                time.sleep(0.02)
            with openai.OpenAI(base_url=polite_url, api_key="unused", max_retries=0, timeout=60) as client:
                reply = client.chat.completions.create(
                    model="default", messages=[{"role": "user", "content": "hello"}], max_tokens=2
                )
            assert reply.choices[0].finish_reason in ("stop", "length")
            during = calls(flood)  # the neighbour was answered while the flood still waited for its own calls
            assert [s.result() for s in statuses] == [200] * FLOOD_CALLS
        after, neighbour = calls(flood), calls(polite)
    assert during["waiting"] >= 1 and during["running"] == PER_SESSION, during
    assert (neighbour["waited"], neighbour["calls"]) == (0, 1), neighbour
    assert after["peak_running"] == PER_SESSION, after  # never more than its limit at once
    assert after["waited"] == FLOOD_CALLS - PER_SESSION and after["calls"] == FLOOD_CALLS, after
    assert (after["running"], after["waiting"]) == (0, 0), after
