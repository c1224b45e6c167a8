"""Real cells (``gyre cell`` processes with embedded engines), the controller and the router in one event loop,
with agents talking to the router through the official ``openai`` client: what the control tests run against."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import torch
import uvicorn

from gyre.config import load_config
from gyre.control.cluster import Cluster
from gyre.engine.launcher import free_port
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.app import KEEP_ALIVE_S, build_agent_app
from gyre.train.step import Rollout
from gyre.train.trainerclient import TrainerClient
from reference import hf_logprobs
from robust import ROBUST

BASE = [
    "cells.engine_overrides=['engine.kv_cache_mem_gib=0.1']", "cells.num_threads=1",
    "trainer.learning_rate=1e-3", "trainer.heartbeat_s=0.25", "trainer.transfer_timeout_s=30",
    "controller.heartbeat_s=0.25",
    # cells, satellites and shards are gone after 30 s of silence, not 5: a loaded machine (CI, two test workers) can
    # hold a busy loop's heartbeats that long; the tests of lost cells set their victim's timeout
    *ROBUST,
]  # fmt: skip


async def eventually(what: str, condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Return once ``condition()`` holds (polled every 10 ms, with no await between the last poll and the return);
    AssertionError naming ``what`` after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Conversation:
    """What one agent's session saw: each reply's token ids as the API returned them."""

    token: str
    replies: list[dict[str, Any]] = field(default_factory=list)


class Live:
    """``async with Live(model, tmp, overrides) as live``: a `Cluster` serving, its router listening over HTTP for
    agents, a trainer client."""

    def __init__(self, model: Path, tmp: Path, overrides: list[str]) -> None:
        self.model, self.tmp = model, tmp
        cfg = load_config(None, [*BASE, *overrides])
        self.cluster = Cluster(cfg, model, tmp / "run")
        self.cfg, self.pool, self.router = cfg, self.cluster.pool, self.cluster.router
        self.controller = self.cluster.controller
        self.conversations: list[Conversation] = []
        self.errors: list[str] = []

    async def __aenter__(self) -> Live:
        await self.cluster.__aenter__()
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(build_agent_app(self.router), host="127.0.0.1", port=port,
                                                    log_level="warning", timeout_keep_alive=KEEP_ALIVE_S))  # fmt: skip
        self.serving = asyncio.ensure_future(self.server.serve())  # stopped in __aexit__
        for _ in range(600):  # agents may connect once it listens
            if self.server.started or self.serving.done():
                break
            await asyncio.sleep(0.05)
        assert self.server.started, "the router's HTTP server did not start"
        self.trainer = TrainerClient(self.controller.core_address, timeout_s=120)
        return self

    def kill(self, name: str) -> None:
        self.cluster.kill(name)

    async def restart(self, name: str) -> None:
        self.cluster.start(self.cluster.specs[name])
        await self.cluster.wait_started([name])

    async def __aexit__(self, *exc: object) -> None:
        self.trainer.close()
        self.server.should_exit = True
        await self.serving
        await self.cluster.__aexit__(None, None, None)

    # ---- agents ---------------------------------------------------------------------------------------------------
    async def agent(self, i: int, stop: asyncio.Event, turns: int = 3, tool_s: float = 0.0) -> None:
        """Conversations of ``turns`` calls each, one after another, until ``stop``, with ``tool_s`` on average of
        "tools" after each call; errors are collected."""
        rng = random.Random(i)
        while not stop.is_set():
            token = self.router.open_session(f"agent-{i}-{len(self.conversations)}")
            conversation = Conversation(token)
            self.conversations.append(conversation)
            client = openai.AsyncOpenAI(base_url=f"{self.base_url}/s/{token}/v1", api_key="unused",
                                        max_retries=0, timeout=600)  # fmt: skip
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"agent {i} says hello"}]
            try:
                for _ in range(turns):
                    r = await client.chat.completions.create(
                        model=self.model.name, messages=messages, max_tokens=rng.randrange(8, 48),
                        temperature=1.0, extra_body={"return_token_ids": True},
                    )  # type: ignore[call-overload]  # fmt: skip
                    conversation.replies.append(r.model_dump())
                    messages += [r.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "user", "content": "go on"}]  # fmt: skip
                    await asyncio.sleep(rng.uniform(0, 2 * tool_s))
            except openai.OpenAIError as exc:
                self.errors.append(f"agent {i}: {exc!r} caused by {exc.__cause__!r}")
            finally:
                await client.close()

    async def execution(self, index: int, group_size: int, calls: int = 2, tool_s: float = 0.0) -> Rollout:
        """A stand-in agent: ``calls`` model calls with ``tool_s`` of "tool" after each; a random reward."""
        token = self.router.open_session(f"x{index}")
        self.conversations.append(conversation := Conversation(token))
        client = openai.AsyncOpenAI(base_url=f"{self.base_url}/s/{token}/v1", api_key="unused", max_retries=0,
                                    timeout=600)  # fmt: skip
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {index // group_size}"}]
        try:
            for _ in range(calls):
                r = await client.chat.completions.create(
                    model=self.model.name, messages=messages, max_tokens=16, temperature=1.0,
                    extra_body={"return_token_ids": True},
                )  # type: ignore[call-overload]  # fmt: skip
                conversation.replies.append(r.model_dump())
                messages += [r.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "go on"}]  # fmt: skip
                await asyncio.sleep(tool_s)
        finally:
            await client.close()
        return Rollout(execution_id=f"x{index}", group=f"g{index // group_size}",
                       reward=random.Random(index).random(), records=self.router.records(token))  # fmt: skip

    # ---- checks ---------------------------------------------------------------------------------------------------
    def records(self) -> dict[str, list[CallRecord]]:
        return {c.token: self.router.records(c.token) for c in self.conversations}

    def check_token_exact(self, models: dict[int, Any]) -> int:
        """Every reply is its record, and teacher forcing at each token's weight version reproduces its logprob.
        Returns how many records were checked."""
        checked = 0
        for conversation in self.conversations:
            records = self.router.records(conversation.token)
            full = expand_inputs(records)
            assert len(records) == len(conversation.replies)
            for reply, record in zip(conversation.replies, records, strict=True):
                choice = reply["choices"][0]
                assert record.output_ids == choice["token_ids"]
                inputs = full[record.call_id]
                assert inputs == reply["prompt_token_ids"]
                versions = record.token_versions()
                want = torch.zeros(len(record.output_ids))
                for version in set(versions):
                    ref = torch.tensor(hf_logprobs(models[version], inputs, record.output_ids))
                    mask = torch.tensor([v == version for v in versions])
                    want[mask] = ref[mask]
                got = torch.tensor(record.output_logprobs)
                assert torch.allclose(got, want, atol=1e-4), (record.call_id, versions)
                checked += 1
        return checked
