"""What a record says about where its tokens came from: the weight version of every token, through a drain
mid-generation, and whether a policy or a script produced them. An engine whose version is not an integer is
refused loudly, never recorded as a made-up version."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig
from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import CallRecord
from gyre.router.openai_types import ChatRequest, RouterError
from gyre.router.routing import Router
from gyre.train.prefixtree import TrajectoryTree

HI = [{"role": "user", "content": "tell me a long story"}]
LONG = 1000  # greedy tokens; the tiny model's greedy reply to HI never ends before (~2 s on one core)


@pytest.fixture
def engines(tiny_model: Path, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two embedded engines on the same weights, one serving them as version 3 and one as version 4."""
    procs: list[ServerProcess] = []
    try:
        for version in (3, 4):
            overrides = ["engine.kv_cache_mem_gib=0.05", f"engine.weight_version={version}"]
            procs.append(
                launch_embedded(tiny_model, overrides=overrides, log_path=tmp_path / f"v{version}.log")
            )
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def _content(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.mark.slow(reason="drains an engine under live sessions and checks every record against the model")
def test_tokens_moved_by_a_drain_keep_the_version_that_sampled_them(
    tiny_model: Path, engines: list[ServerProcess], tmp_path: Path
) -> None:
    async def go() -> tuple[list[dict[str, Any]], CallRecord, list[int]]:
        router = Router(RouterConfig(model_path=str(tiny_model), engines=[e.url for e in engines],
                                     journal_dir=str(tmp_path / "journal")))  # fmt: skip
        try:
            await router.pool.drain("engine-1")  # the call starts on engine-0 (version 3)
            token = router.open_session("moved")
            req = ChatRequest(model="default", messages=HI, max_tokens=LONG, temperature=0.0, stream=True)
            chunks: list[dict[str, Any]] = []
            async with asyncio.TaskGroup() as tg:
                async for chunk in router.chat_stream(token, req):
                    if not chunks:  # engine-0 has sampled its first tokens: move the call to version 4
                        router.pool.resume("engine-1")
                        tg.create_task(router.pool.drain("engine-0"))
                    chunks.append(chunk)
            sampled = []
            for engine in engines:
                async with EngineClient(engine.url) as client:
                    sampled.append((await client.statistics())["generated_tokens"])
            return chunks, router.records(token)[0], sampled
        finally:
            await router.aclose()

    chunks, record, (on_3, on_4) = asyncio.run(go())
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # the agent saw one normal reply
    assert on_3 > 0 and on_4 > 0 and on_3 + on_4 == len(record.output_ids)
    # each token has the version of the engine that sampled it, switching exactly where the call moved
    assert record.token_versions() == [3] * on_3 + [4] * on_4
    assert record.output_versions == record.token_versions() and record.weight_version == 3
    assert (record.cell, record.source) == ("engine-1", "policy")
    journal = tmp_path / "journal" / "calls.jsonl"
    assert list(read_journal(journal, CallRecord)) == [record]
    tree = TrajectoryTree([record])
    sampled = [v for node in tree.nodes() for v, s in zip(node.versions, node.sampled, strict=True) if s]
    assert sampled == [3] * on_3 + [4] * on_4


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_reporting_a_non_integer_version_is_refused_loudly(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    tokenizer = load_tokenizer(tiny_model)
    with (
        ScriptedEngine(tokenizer, lambda ids: "from nowhere") as bad,
        ScriptedEngine(tokenizer, lambda ids: "hello", weight_version=7) as good,
    ):
        bad.weight_version = "default"  # type: ignore[assignment]  # SGLang's without --weight-version

        async def ask(router: Router, token: str) -> str:
            req = ChatRequest(model="default", messages=HI, max_tokens=16, stream=stream)
            if stream:
                return _content([c async for c in router.chat_stream(token, req)])
            return str((await router.chat(token, req))["choices"][0]["message"]["content"])

        async def go() -> tuple[list[str], list[CallRecord], dict[str, str], list[str]]:
            router = Router(RouterConfig(model_path=str(tiny_model), engines=[bad.url, good.url],
                                         journal_dir=str(tmp_path)))  # fmt: skip
            try:
                token = router.open_session("e")
                replies = [await ask(router, token), await ask(router, router.open_session("e2"))]
                states = dict(router.pool.statistics().engines)
                bad.weight_version = 5  # fixed, then resumed by the operator: it serves again
                router.pool.resume("engine-0")
                replies.append(await ask(router, router.open_session("e3")))
                records = list(read_journal(tmp_path / "calls.jsonl", CallRecord))
                return replies, records, states, [r.cell for r in records]
            finally:
                await router.aclose()

        with caplog.at_level(logging.ERROR, logger="gyre.router.pool"):
            replies, records, states, cells = asyncio.run(go())
    # the agent never noticed: its calls went on to the engine that reports a version
    assert replies == ["hello", "hello", "from nowhere"]
    assert states == {"engine-0": "misconfigured", "engine-1": "serving"}
    assert len(bad.requests) == 2  # one refused answer, then nothing until resumed
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "engine-0" in errors[0] and "'default'" in errors[0], errors
    assert "--weight-version 0" in errors[0]
    # nothing was recorded with a made-up version: every record has the version of the engine that sampled it
    assert cells == ["engine-1", "engine-1", "engine-0"]
    assert [r.weight_version for r in records] == [7, 7, 5] and all(
        r.output_versions is None for r in records
    )
    assert {r.source for r in records} == {"scripted"}  # a scripted engine's records say so


def test_with_only_a_misconfigured_engine_the_agent_gets_a_503_naming_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    with ScriptedEngine(load_tokenizer(tiny_model), lambda ids: "hello") as bad:
        bad.weight_version = "v2"  # type: ignore[assignment]

        async def go() -> tuple[RouterError, list[CallRecord]]:
            cfg = RouterConfig(model_path=str(tiny_model), engines=[bad.url], wait_for_engine_s=0.2,
                               journal_dir=str(tmp_path))  # fmt: skip
            router = Router(cfg)
            try:
                token = router.open_session("e")
                with pytest.raises(RouterError) as info:
                    await router.chat(token, ChatRequest(model="default", messages=HI, max_tokens=4))
                return info.value, router.records(token)
            finally:
                await router.aclose()

        error, records = asyncio.run(go())
    assert error.status == 503 and error.type == "service_unavailable"
    assert "misconfigured" in str(error) and "engine-0" in str(error) and "'v2'" in str(error)
    assert records == [] and (tmp_path / "calls.jsonl").read_bytes() == b""
