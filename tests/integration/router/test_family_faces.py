"""Three model families through the real router process and the official clients: every face, streamed and not.

Each family (Qwen3, gpt-oss's harmony, GLM-4.5) gets a model directory holding its real chat template and markers
(`model_families`), a scripted engine writing the family's exact replies, and one ``gyre router`` process shared by
its tests. The model reasons on every reply: asked, it reasons and calls ``bash {"command": "ls"}``; after a tool
result, it reasons and answers. The ``openai`` client sees the reasoning as ``reasoning_content`` on chat messages and
deltas and as ``reasoning`` items in Responses, the ``anthropic`` client as ``thinking`` blocks; the text never holds
a marker, and the second call of every tool loop extends the first (its record's ``parent_call_id``). gpt-oss also
reasons again after its preamble, which a streamed response must hand out as the unstreamed one does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest

from fakes import ScriptedEngine
from gyre.journal.records import CallRecord
from gyre.router.spawn import launch_router
from model_families import FAMILIES, family_tokenizer, reply_text

ASK = "ASK: list the files."  # every user turn holds ASK; every tool result holds RESULT
RESULT = "RESULT: a.txt b.txt c.txt"
THINK_CALL, SAY_CALL = "I should list the files first.", "Listing the files."
THINK_ANSWER, ANSWER = "Three files came back.", "There are three files."
# gpt-oss reasoning again after its preamble, then calling: harmony messages (analysis, commentary, analysis, the
# call) in one turn; asked for by INTERLEAVE
INTERLEAVE, THINK_MORE = "INTERLEAVE: list the files.", " Then ls it is."
HARMONY_INTERLEAVED = "<|start|>assistant".join([
    f"<|channel|>analysis<|message|>{THINK_CALL}<|end|>", f"<|channel|>commentary<|message|>{SAY_CALL}<|end|>",
    f"<|channel|>analysis<|message|>{THINK_MORE}<|end|>",
    '<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command":"ls"}<|call|>',
])  # fmt: skip
CHAT_TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
RESPONSES_TOOLS: Any = [{"type": "function", **CHAT_TOOLS[0]["function"]}]
MESSAGES_TOOLS: Any = [
    {"name": "bash", "description": "Run a command.", "input_schema": CHAT_TOOLS[0]["function"]["parameters"]}
]


def script(family: str, tokenizer: Any) -> Any:
    """A call after the last ask, an answer once a tool result follows it; reasoning on both."""

    def reply(ids: list[int]) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if text.rfind("RESULT") > max(text.rfind("ASK"), text.rfind("INTERLEAVE")):
            return reply_text(family, reasoning=THINK_ANSWER, content=ANSWER)
        if family == "gpt-oss" and text.rfind("INTERLEAVE") > text.rfind("ASK"):
            return HARMONY_INTERLEAVED
        return reply_text(family, reasoning=THINK_CALL, content=SAY_CALL, calls=[("bash", {"command": "ls"})])

    return reply


@pytest.fixture(scope="module", params=["qwen3", "gpt-oss", "glm45"])
def family(request: pytest.FixtureRequest) -> str:
    """The family under test (``tests/model_families.py``'s name)."""
    return str(request.param)


@pytest.fixture(scope="module")
def router(family: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The family's router process in front of its scripted engine; its admin URL."""
    model = tmp_path_factory.mktemp(f"{family}-model")
    tokenizer = family_tokenizer(family)
    tokenizer.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    with ScriptedEngine(tokenizer, script(family, tokenizer), stops=FAMILIES[family].stops) as engine:
        proc, admin = launch_router(model, [engine.url], log_path=model / "router.log")
        with proc:
            yield admin


def _session(admin: str, execution_id: str) -> tuple[str, str]:
    """A new session: (its token, its OpenAI base URL)."""
    s = httpx.post(admin + "/admin/sessions", json={"execution_id": execution_id}).json()
    return s["token"], s["base_url"]


def _openai(admin: str, execution_id: str) -> tuple[openai.OpenAI, str]:
    """An ``openai`` client for a new session, its token as the API key (as an agent holds it), and the session's
    base URL."""
    token, base_url = _session(admin, execution_id)
    root = base_url.split("/s/", 1)[0] + "/v1"
    return openai.OpenAI(base_url=root, api_key=token, max_retries=0), base_url


def _records(base_url: str) -> list[CallRecord]:
    raw = httpx.get(base_url + "/gyre/records").content
    return msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]


def _assert_chained(base_url: str, calls: int) -> None:
    """The session holds ``calls`` records, each after the first extending the one before."""
    records = _records(base_url)
    assert len(records) == calls
    assert records[0].parent_call_id is None
    for before, after in itertools.pairwise(records):
        assert after.parent_call_id == before.call_id, after.divergence


def _clean(family: str, *texts: str) -> None:
    for text in texts:
        assert not [m for m in FAMILIES[family].markers if m in text], text


def _chat(client: openai.OpenAI, messages: list[Any], stream: bool) -> dict[str, Any]:
    """One chat call, as the assistant message the client saw (streamed: its deltas joined) and its finish."""
    if not stream:
        reply = client.chat.completions.create(model="default", messages=messages, tools=CHAT_TOOLS)
        assert reply.usage is not None and reply.usage.completion_tokens_details is not None
        assert (reply.usage.completion_tokens_details.reasoning_tokens or 0) > 0
        first = reply.choices[0]
        return {**first.message.model_dump(exclude_none=True), "finish": first.finish_reason}
    chunks = list(
        client.chat.completions.create(model="default", messages=messages, tools=CHAT_TOOLS, stream=True)
    )
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                whole = calls.setdefault(call.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})  # fmt: skip
                whole["id"] += call.id or ""
                whole["function"]["name"] += (call.function and call.function.name) or ""
                whole["function"]["arguments"] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    message: dict[str, Any] = {"role": "assistant", "content": content, "finish": finish}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_tool_loop_parses_reasoning_and_calls_and_chains(family: str, router: str, stream: bool) -> None:
    client, base_url = _openai(router, f"chat-{stream}")
    messages: list[Any] = [{"role": "user", "content": ASK}]
    with client:
        first = _chat(client, messages, stream)
        assert first["reasoning_content"] == THINK_CALL
        assert first["content"] == SAY_CALL and first["finish"] == "tool_calls"
        [call] = first["tool_calls"]
        assert call["id"] and call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": "ls"}
        _clean(family, first["content"], first["reasoning_content"], call["function"]["arguments"])
        echoed = {k: v for k, v in first.items() if k != "finish"}  # the reasoning echoed back
        messages += [echoed, {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
        second = _chat(client, messages, stream)
    assert second["reasoning_content"] == THINK_ANSWER
    assert second["content"] == ANSWER and second["finish"] == "stop"
    assert not second.get("tool_calls")
    _assert_chained(base_url, 2)


def _respond(client: openai.OpenAI, stream: bool, **kwargs: Any) -> Any:
    """One response (streamed: the one ``response.completed`` carries, its reasoning streamed before its text)."""
    if not stream:
        return client.responses.create(model="default", tools=RESPONSES_TOOLS, **kwargs)
    events = list(client.responses.create(model="default", tools=RESPONSES_TOOLS, stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert types.index("response.reasoning_text.delta") < types.index("response.output_text.delta")
    done = events[-1].response
    [reasoning] = [item for item in done.output if item.type == "reasoning"]
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert [streamed] == [c.text for c in reasoning.content or []]
    return done


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_reasoning_items_and_a_chained_second_turn(family: str, router: str, stream: bool) -> None:
    client, base_url = _openai(router, f"responses-{stream}")
    with client:
        first = _respond(client, stream, input=ASK)
        assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
        reasoning, _, call = first.output
        assert [c.text for c in reasoning.content or []] == [THINK_CALL]
        assert first.output_text == SAY_CALL and first.status == "completed"
        assert call.name == "bash" and json.loads(call.arguments) == {"command": "ls"}
        assert first.usage is not None and first.usage.output_tokens_details.reasoning_tokens > 0
        _clean(family, first.output_text, call.arguments)
        output = [{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
        second = _respond(client, stream, input=output, previous_response_id=first.id)
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert [c.text for c in second.output[0].content or []] == [THINK_ANSWER]
    assert second.output_text == ANSWER and second.status == "completed"
    assert second.usage.output_tokens_details.reasoning_tokens > 0
    _assert_chained(base_url, 2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_messages_thinking_blocks_and_tool_use_chain(family: str, router: str, stream: bool) -> None:
    token, base_url = _session(router, f"messages-{stream}")
    client = anthropic.Anthropic(base_url=base_url.split("/s/", 1)[0], api_key=token, max_retries=0)

    def ask(messages: list[Any]) -> anthropic.types.Message:
        kwargs: Any = {"model": "default", "max_tokens": 512, "messages": messages, "tools": MESSAGES_TOOLS}
        if not stream:
            return client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as events:
            seen = list(events)
            final = events.get_final_message()
        assert seen[0].type == "message_start" and seen[-1].type == "message_stop"
        opened = [e.content_block.type for e in seen if e.type == "content_block_start"]
        assert opened == [b.type for b in final.content]  # each block streamed, in order
        return final

    with client:
        messages: list[Any] = [{"role": "user", "content": ASK}]
        first = ask(messages)
        assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
        thinking, text, use = first.content
        assert thinking.type == "thinking" and thinking.thinking == THINK_CALL
        assert text.type == "text" and text.text == SAY_CALL
        assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "ls"}
        assert first.stop_reason == "tool_use"
        _clean(family, thinking.thinking, text.text)
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]},
        ]
        second = ask(messages)
    blocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in second.content]
    assert blocks == [("thinking", THINK_ANSWER), ("text", ANSWER)]
    assert second.stop_reason == "end_turn"
    _assert_chained(base_url, 2)


@pytest.mark.parametrize("family", ["gpt-oss"], indirect=True)  # harmony alone writes messages in any order
def test_responses_stream_of_reasoning_after_a_preamble_is_the_whole_response(
    family: str, router: str
) -> None:
    """Streamed, a reply whose reasoning resumes after its text ends as the unstreamed one does: each output item
    once, under its own id, its text what was streamed; its output sent back extends the call."""
    ask: Any = [{"type": "message", "role": "user", "content": INTERLEAVE}]
    whole_client, _ = _openai(router, "interleaved-whole")
    client, base_url = _openai(router, "interleaved-streamed")
    with whole_client, client:
        whole = whole_client.responses.create(model="default", input=ask, tools=RESPONSES_TOOLS)
        events = list(client.responses.create(model="default", input=ask, tools=RESPONSES_TOOLS, stream=True))
        done = events[-1].response  # type: ignore[union-attr]
        output = [item.model_dump(exclude_none=True) for item in done.output]
        [call_id] = [item["call_id"] for item in output if item["type"] == "function_call"]
        result = {"type": "function_call_output", "call_id": call_id, "output": RESULT}
        again: Any = [*ask, *output, result]  # the streamed output sent back, as openai-agents does
        client.responses.create(model="default", input=again, tools=RESPONSES_TOOLS)

    def texts(items: Any, kind: str) -> str:
        return "".join(part.text for item in items if item.type == kind for part in item.content or [])

    streamed = {kind: "".join(str(getattr(e, "delta", "")) for e in events if e.type == f"response.{kind}.delta")
                for kind in ("reasoning_text", "output_text")}  # fmt: skip
    assert streamed == {"reasoning_text": THINK_CALL + THINK_MORE, "output_text": SAY_CALL}
    assert texts(whole.output, "reasoning") == THINK_CALL + THINK_MORE and whole.output_text == SAY_CALL
    ids = [item.id for item in done.output]
    assert len(set(ids)) == len(ids), [(item.type, item.id) for item in done.output]
    assert texts(done.output, "reasoning") == streamed["reasoning_text"]
    assert texts(done.output, "message") == streamed["output_text"]
    _assert_chained(base_url, 2)
