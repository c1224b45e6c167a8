"""The official ``openai`` client against ``gyre router``: chat, streaming, tools, logprobs, token-exact records."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig
from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.openai_types import ChatRequest
from gyre.router.routing import Router
from gyre.router.spawn import launch_router

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "engine.log"
    with launch_embedded(tiny_model, overrides=["engine.kv_cache_mem_gib=0.25"], log_path=log) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(
    tiny_model: Path, engine: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str, Path]]:
    journal = tmp_path_factory.mktemp("journal")
    proc, admin = launch_router(
        tiny_model, [engine.url], journal_dir=journal, log_path=journal / "router.log"
    )
    with proc:
        yield proc, admin, journal


def _session(admin: str, execution_id: str = "exec") -> dict[str, str]:
    return httpx.post(admin + "/admin/sessions", json={"execution_id": execution_id}).json()


def _records(base_url: str) -> list[dict[str, Any]]:
    """This session's records, each with its full ``input_ids`` rebuilt from the stored deltas."""
    raw = httpx.get(base_url + "/gyre/records").content
    records = msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]
    full = expand_inputs(records)
    return [{**msgspec.to_builtins(r), "input_ids": full[r.call_id]} for r in records]


def test_chat_stream_logprobs_and_records(router: tuple[ServerProcess, str, Path]) -> None:
    _, admin, journal = router
    s = _session(admin, "chat-1")
    client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0.7, logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = r.choices[0]
    data = r.model_dump()
    token_ids = data["choices"][0]["token_ids"]
    assert r.usage is not None and r.usage.completion_tokens == len(token_ids) <= 12
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == len(token_ids)
    assert all(len(e.top_logprobs) == 3 for e in choice.logprobs.content)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=True)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    (rec, streamed) = _records(s["base_url"])
    assert rec["output_ids"] == token_ids and rec["input_ids"] == data["prompt_token_ids"]
    assert [e.logprob for e in choice.logprobs.content] == pytest.approx(rec["output_logprobs"])
    assert rec["session"] == "chat-1" and rec["role"] == "main" and streamed["role"] == "main"
    journaled = {r.call_id for r in read_journal(journal / "calls.jsonl", CallRecord)}
    assert {rec["call_id"], streamed["call_id"]} <= journaled
    client.close()


def test_multi_turn_records_extend_token_exactly(router: tuple[ServerProcess, str, Path]) -> None:
    _, admin, _ = router
    s = _session(admin, "tito")

    async def conversation() -> None:
        client = openai.AsyncOpenAI(base_url=s["base_url"], api_key="unused")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "turn 0"}]
        for turn in range(1, 5):
            r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=10)  # type: ignore[arg-type]
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": f"turn {turn}"})
        # compaction: a fresh context from a summary is a new branch, with its own role
        summary = [{"role": "user", "content": "summary of the above"}]
        await client.chat.completions.create(
            model="tiny", messages=summary, max_tokens=5, extra_headers={"X-Gyre-Role": "main-summary"}
        )  # type: ignore[arg-type]
        await client.close()

    asyncio.run(conversation())
    recs = _records(s["base_url"])
    assert len(recs) == 5
    for prev, cur in itertools.pairwise(recs[:4]):
        head = prev["input_ids"] + prev["output_ids"]
        assert cur["input_ids"][: len(head)] == head  # never re-tokenized
        assert cur["parent_call_id"] == prev["call_id"]
    assert recs[0]["parent_call_id"] is None and recs[4]["parent_call_id"] is None
    assert recs[4]["role"] == "main-summary"


def test_tool_calls_round_trip_and_reformatted_arguments_still_extend(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    replies = iter([
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la", "n": 1}}\n</tool_call>',
        "<tool_call>\n{not json at all}\n</tool_call>",
        "All done.",
    ])  # fmt: skip
    with ScriptedEngine(tokenizer, lambda ids: next(replies)) as fake:
        proc, admin = launch_router(tiny_model, [fake.url])
        with proc:
            s = _session(admin, "tools")
            client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
            messages: list[dict[str, Any]] = [{"role": "user", "content": "list files"}]
            r1 = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            msg = r1.choices[0].message
            assert r1.choices[0].finish_reason == "tool_calls" and msg.content == "Let me look."
            assert msg.tool_calls is not None and msg.tool_calls[0].function.name == "bash"
            assert json.loads(msg.tool_calls[0].function.arguments) == {"cmd": "ls -la", "n": 1}
            echoed = msg.model_dump(exclude_none=True)  # a scaffold re-serialises the arguments its own way
            echoed["tool_calls"][0]["function"]["arguments"] = json.dumps({"n": 1, "cmd": "ls -la"}, indent=2)
            messages += [echoed, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a.py"}]
            r2 = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            assert r2.choices[0].message.tool_calls is None  # malformed: plain content, not an error
            assert "not json" in (r2.choices[0].message.content or "")
            messages += [
                r2.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "ok?"},
            ]
            r3 = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            assert r3.choices[0].message.content == "All done."
            recs = _records(s["base_url"])
            client.close()
    assert [r["parent_call_id"] for r in recs] == [None, recs[0]["call_id"], recs[1]["call_id"]]
    for prev, cur in itertools.pairwise(recs):
        head = prev["input_ids"] + prev["output_ids"]
        assert cur["input_ids"][: len(head)] == head
    sent = [r["input_ids"] for r in fake.requests]
    assert sent == [r["input_ids"] for r in recs]  # what the engine saw is what was recorded


def test_in_process_api_without_http(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, lambda ids: "four") as fake:

        async def go() -> tuple[dict[str, Any], list[CallRecord]]:
            router = Router(RouterConfig(model_path=str(tiny_model), engines=[fake.url]))
            token = router.open_session("in-process")
            req = ChatRequest(model="tiny", messages=[{"role": "user", "content": "2+2?"}])
            body = await router.chat(token, req, role="sub-agent")
            records = router.records(token)
            await router.aclose()
            return body, records

        body, records = asyncio.run(go())
    assert body["choices"][0]["message"]["content"] == "four"
    assert records[0].role == "sub-agent" and records[0].output_ids[-1] == tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )


def test_streaming_sends_content_as_it_is_generated(router: tuple[ServerProcess, str, Path]) -> None:
    _, admin, _ = router
    s = _session(admin, "stream")
    client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
    messages = [{"role": "user", "content": "tell me a long story"}]
    kwargs: dict[str, Any] = {"model": "tiny", "max_tokens": 200, "temperature": 0}
    whole = client.chat.completions.create(messages=messages, **kwargs)  # type: ignore[arg-type]
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kwargs))  # type: ignore[arg-type]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3  # it streamed, not one blob at the end
    assert "".join(pieces) == (whole.choices[0].message.content or "")
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    recs = _records(s["base_url"])
    assert recs[0]["output_ids"] == recs[1]["output_ids"]  # greedy: the streamed call sampled the same tokens
    client.close()


def test_streamed_tool_calls_arrive_whole(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    reply = 'Checking.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "pwd"}}\n</tool_call>'
    with ScriptedEngine(tokenizer, lambda ids: reply) as fake:
        proc, admin = launch_router(tiny_model, [fake.url])
        with proc:
            s = _session(admin, "stream-tools")
            client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
            messages = [{"role": "user", "content": "where am I?"}]
            stream = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True)  # type: ignore[arg-type]
            chunks = list(stream)
            client.close()
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert content == "Checking."  # the tool-call markup never leaks into the streamed text
    assert len(calls) == 1 and json.loads(calls[0].function.arguments or "") == {"cmd": "pwd"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_agents_model_client_over_http(router: tuple[ServerProcess, str, Path]) -> None:
    from gyre.agents.modelclient import HttpModelClient

    _, admin, _ = router
    s = _session(admin, "http-client")

    async def go() -> dict[str, Any]:
        client = HttpModelClient(s["base_url"], model="tiny")
        try:
            return await client.chat([{"role": "user", "content": "hi"}], role="sub-agent", max_tokens=5)
        finally:
            await client.aclose()

    body = asyncio.run(go())
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 5
    (record,) = _records(s["base_url"])
    assert record["role"] == "sub-agent" and record["call_id"] == body["id"]


def test_completions_with_token_logprobs(router: tuple[ServerProcess, str, Path]) -> None:
    _, admin, _ = router
    s = _session(admin, "completions")
    client = openai.OpenAI(base_url=s["base_url"], api_key="unused")
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, logprobs=2)
    client.close()
    choice = r.choices[0]
    (record,) = _records(s["base_url"])
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert len(choice.logprobs.tokens) == len(record["output_ids"]) <= 6
    assert choice.logprobs.token_logprobs == pytest.approx(record["output_logprobs"])
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs or [])
