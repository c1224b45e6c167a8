"""The Anthropic Messages API (``/v1/messages``) through the official ``anthropic`` client, recorded like chat.

The engine answers with canned text (``ScriptedEngine``), chosen by the request's last user message: a reply with a
``<tool_call>`` block reaches the client as a ``tool_use`` block, and a tool result sent back gets the final text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest

from fakes import ScriptedEngine
from gyre.engine.launcher import launch_embedded
from gyre.engine.models import load_tokenizer
from gyre.journal.records import CallRecord
from gyre.router.spawn import launch_router

TOOLS: Any = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
REPLIES = {  # the last user message -> the model's reply
    "act": 'THOUGHT: list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
    "hello": "Hello there, how can I help?",
    "add": "<think>\nI should add.\n</think>\n\nThe answer is 4.",  # a reasoning model's reply (Qwen3's markers)
}
REASONING, ANSWER = "I should add.", "The answer is 4."
AFTER_TOOL = "There are three files."  # the reply to a tool result


def _script(tokenizer: Any) -> Any:
    def reply(ids: list[int]) -> str:
        last = tokenizer.decode(ids).rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        return AFTER_TOOL if "<tool_response>" in last else REPLIES[last]

    return reply


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[ScriptedEngine]:
    with ScriptedEngine(load_tokenizer(tiny_model), _script(load_tokenizer(tiny_model))) as fake:
        yield fake


@pytest.fixture(scope="module")
def router(tiny_model: Path, engine: ScriptedEngine) -> Iterator[str]:
    proc, admin = launch_router(tiny_model, [engine.url])
    with proc:
        yield admin


def _session(admin: str, execution_id: str) -> tuple[anthropic.Anthropic, str]:
    """A client for a new session (its token as the ``x-api-key``) and the session's OpenAI base URL."""
    s = httpx.post(admin + "/admin/sessions", json={"execution_id": execution_id}).json()
    root = s["base_url"].split("/s/", 1)[0]
    return anthropic.Anthropic(base_url=root, api_key=s["token"], max_retries=0), s["base_url"]


def _records(base_url: str) -> list[CallRecord]:
    raw = httpx.get(base_url + "/gyre/records").content
    return msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]


def test_text_reply_streamed_or_not(router: str, engine: ScriptedEngine) -> None:
    client, base_url = _session(router, "text")
    messages: Any = [{"role": "user", "content": "hello"}]
    reply = client.messages.create(model="tiny", max_tokens=64, messages=messages)
    assert [(b.type, getattr(b, "text", None)) for b in reply.content] == [("text", REPLIES["hello"])]
    assert reply.stop_reason == "end_turn" and reply.role == "assistant"
    (record,) = _records(base_url)
    assert reply.usage.input_tokens == len(record.new_input_ids)
    assert reply.usage.output_tokens == len(record.output_ids)

    events = list(client.messages.create(model="tiny", max_tokens=64, messages=messages, stream=True))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types[1] == "content_block_start" and types[-3] == "content_block_stop"
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == REPLIES["hello"]  # type: ignore[union-attr]
    assert events[-2].delta.stop_reason == "end_turn"  # type: ignore[union-attr]
    with client.messages.stream(model="tiny", max_tokens=64, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == REPLIES["hello"]  # type: ignore[union-attr]
    assert final.usage.output_tokens == len(record.output_ids)
    # the three calls are one prompt sampled three times: three records of the same ids
    assert [(r.new_input_ids, r.output_ids) for r in _records(base_url)] == [
        (record.new_input_ids, record.output_ids)
    ] * 3
    # max_tokens cuts the reply: stop_reason max_tokens, and the record says length
    cut = client.messages.create(model="tiny", max_tokens=3, messages=messages)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert _records(base_url)[-1].finish_reason == "length"
    client.close()


def test_system_prompt_renders_as_the_chat_system_message(router: str, engine: ScriptedEngine) -> None:
    client, base_url = _session(router, "system")
    messages: Any = [{"role": "user", "content": "hello"}]
    client.messages.create(model="tiny", max_tokens=64, system="You are terse.", messages=messages)
    blocks: Any = [{"type": "text", "text": "You are terse."}]
    client.messages.create(model="tiny", max_tokens=64, system=blocks, messages=messages)
    # the same conversation through chat completions renders to the same ids
    chat = openai.OpenAI(base_url=base_url, api_key="unused")
    system: Any = [{"role": "system", "content": "You are terse."}, *messages]
    chat.chat.completions.create(model="tiny", messages=system)
    first, second, third = _records(base_url)
    assert first.new_input_ids == second.new_input_ids == third.new_input_ids
    assert engine.requests[-1]["input_ids"] == first.new_input_ids
    assert engine.tokenizer.decode(first.new_input_ids).startswith(
        "<|im_start|>system\nYou are terse.<|im_end|>"
    )
    chat.close()
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_tool_round_trip_is_one_chain(router: str, engine: ScriptedEngine, streamed: bool) -> None:
    client, base_url = _session(router, f"tools-{streamed}")
    messages: Any = [{"role": "user", "content": "act"}]
    if streamed:
        events = list(
            client.messages.create(model="tiny", max_tokens=256, messages=messages, tools=TOOLS, stream=True)
        )
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)  # type: ignore[union-attr]
        with client.messages.stream(model="tiny", max_tokens=256, messages=messages, tools=TOOLS) as stream:
            first = stream.get_final_message()
    else:
        first = client.messages.create(model="tiny", max_tokens=256, messages=messages, tools=TOOLS)
    assert first.stop_reason == "tool_use"
    text, tool_use = first.content
    assert text.type == "text" and text.text == "THOUGHT: list the files."
    assert tool_use.type == "tool_use" and (tool_use.name, tool_use.input) == ("bash", {"command": "ls -la"})
    # the agent runs its tool and sends the result back, with the reply exactly as the client got it
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "a b c"}],
        },
    ]
    final = client.messages.create(model="tiny", max_tokens=256, messages=messages, tools=TOOLS)
    assert final.stop_reason == "end_turn" and final.content[0].text == AFTER_TOOL  # type: ignore[union-attr]
    *_, parent, child = _records(base_url)
    assert child.parent_call_id == parent.call_id
    assert child.prefix_len == len(parent.new_input_ids) + len(parent.output_ids)
    # token-exact: the engine saw the first call's ids, what it sampled, then the tool result
    sent = engine.requests[-1]["input_ids"]
    assert sent == parent.new_input_ids + parent.output_ids + child.new_input_ids
    assert final.usage.input_tokens == len(sent)
    client.close()


def test_tool_choice(router: str) -> None:
    client, _ = _session(router, "choice")
    messages: Any = [{"role": "user", "content": "act"}]
    # none: the model's tool-call text stays text
    reply = client.messages.create(
        model="tiny", max_tokens=256, messages=messages, tools=TOOLS, tool_choice={"type": "none"}
    )
    assert [b.type for b in reply.content] == ["text"] and reply.stop_reason == "end_turn"
    named = client.messages.create(
        model="tiny",
        max_tokens=256,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "bash"},
    )
    assert named.stop_reason == "tool_use"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="tiny",
            max_tokens=256,
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "tool", "name": "rm"},
        )
    assert "'rm'" in refused.value.message and refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    client.close()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}, "max_tokens"),
        ({"model": "tiny", "max_tokens": 8, "messages": []}, "messages must not be empty"),
        (
            {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
        ),
        ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role"),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "image"}]}],
            },
            "content[0]",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "tool_use"}]}],
            },
            "content[0]",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
            },
            "tool_use_id",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 3}]}],
            },
            "content[0].thinking must be a string",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
            },
            "content[0]",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "b"}]}
                ],
            },
            "input",
        ),
        (
            {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "x"}],
            },
            "input_schema",
        ),
        (
            {"model": "tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "hello"}]},
            "max_tokens",
        ),
        ({"model": "tiny", "max_tokens": 8, "temperature": 1.5, "messages": []}, "temperature"),
    ],
)
def test_malformed_requests_get_a_400_in_anthropic_shape(router: str, body: Any, says: str) -> None:
    s = httpx.post(router + "/admin/sessions", json={}).json()
    url = s["base_url"] + "/messages"
    response = httpx.post(url, json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert says in error["error"]["message"]


def test_unknown_session_is_a_401_in_anthropic_shape(router: str) -> None:
    s = httpx.post(router + "/admin/sessions", json={}).json()
    client = anthropic.Anthropic(base_url=s["base_url"].split("/s/", 1)[0], api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hello"}])
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_reasoning_is_a_thinking_block_before_the_text(router: str, streamed: bool) -> None:
    client, base_url = _session(router, f"thinking-{streamed}")
    messages: Any = [{"role": "user", "content": "add"}]
    if streamed:
        events = list(client.messages.create(model="tiny", max_tokens=64, messages=messages, stream=True))
        starts = [e for e in events if e.type == "content_block_start"]
        assert [(e.index, e.content_block.type) for e in starts] == [(0, "thinking"), (1, "text")]  # type: ignore[union-attr]
        assert starts[0].content_block.thinking == ""  # type: ignore[union-attr]
        deltas = [e for e in events if e.type == "content_block_delta"]
        thinking = [e.delta for e in deltas if e.index == 0]
        *pieces, signature = thinking
        assert {d.type for d in pieces} == {"thinking_delta"}
        assert "".join(d.thinking for d in pieces) == REASONING  # type: ignore[union-attr]
        assert signature.type == "signature_delta" and signature.signature == ""
        # the thinking block closes before the text block opens
        at = [(e.type, getattr(e, "index", None)) for e in events]
        assert at.index(("content_block_stop", 0)) < at.index(("content_block_start", 1))
        assert "".join(e.delta.text for e in deltas if e.index == 1) == ANSWER  # type: ignore[union-attr]
        with client.messages.stream(model="tiny", max_tokens=64, messages=messages) as stream:
            reply = stream.get_final_message()
    else:
        reply = client.messages.create(model="tiny", max_tokens=64, messages=messages)
    thought, text = reply.content
    assert thought.type == "thinking" and (thought.thinking, thought.signature) == (REASONING, "")
    assert text.type == "text" and text.text == ANSWER
    assert reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == len(_records(base_url)[-1].output_ids)
    client.close()


@pytest.mark.parametrize("sent_back", ["thinking", "none", "redacted_thinking"])
def test_a_reply_with_thinking_continues_the_chain(
    router: str, engine: ScriptedEngine, sent_back: str
) -> None:
    """The next turn extends the reasoning reply token-exactly, whether or not the client sends its thinking back."""
    client, base_url = _session(router, f"thinking-chain-{sent_back}")
    messages: Any = [{"role": "user", "content": "add"}]
    first = client.messages.create(model="tiny", max_tokens=64, messages=messages)
    thought, text = (b.model_dump() for b in first.content)
    assert thought["type"] == "thinking"
    blocks = {"thinking": [thought, text], "none": [text],
              "redacted_thinking": [{"type": "redacted_thinking", "data": "EmwKAhgB..."}, text]}[sent_back]  # fmt: skip
    messages += [{"role": "assistant", "content": blocks}, {"role": "user", "content": "hello"}]
    second = client.messages.create(model="tiny", max_tokens=64, messages=messages)
    assert second.content[0].text == REPLIES["hello"]  # type: ignore[union-attr]
    parent, child = _records(base_url)
    assert child.parent_call_id == parent.call_id
    assert engine.requests[-1]["input_ids"] == parent.new_input_ids + parent.output_ids + child.new_input_ids
    client.close()


def test_message_start_counts_the_prompt(router: str) -> None:
    """``message_start`` carries the prompt's tokens (clients read the context's size from it)."""
    client, _ = _session(router, "message-start")
    messages: Any = [{"role": "user", "content": "hello"}]
    events = list(client.messages.create(model="tiny", max_tokens=64, messages=messages, stream=True))
    start, delta = events[0], events[-2]
    assert start.type == "message_start" and delta.type == "message_delta"
    assert start.message.usage.input_tokens == delta.usage.input_tokens > 0
    client.close()


@pytest.fixture(scope="module")
def sampling_router(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router in front of the real embedded engine (which matches stop sequences as it samples)."""
    logs = tmp_path_factory.mktemp("anthropic-logs")
    overrides = ["engine.kv_cache_mem_gib=0.25"]
    with launch_embedded(tiny_model, overrides=overrides, log_path=logs / "engine.log") as engine:
        proc, admin = launch_router(tiny_model, [engine.url], log_path=logs / "router.log")
        with proc:
            yield admin


@pytest.mark.slow(reason="starts the embedded engine")
def test_stop_sequences_end_the_reply(sampling_router: str, tiny_model: Path) -> None:
    client, base_url = _session(sampling_router, "stop")
    messages: Any = [{"role": "user", "content": "hello"}]
    # this client version has no temperature argument: it goes as an extra field of the body
    greedy: Any = {
        "model": "tiny",
        "max_tokens": 24,
        "messages": messages,
        "extra_body": {"temperature": 0.0},
    }
    whole = client.messages.create(**greedy)
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 24
    # the tiny model's greedy reply (whitespace: its text is empty) sampled again with a stop sequence in it
    text = load_tokenizer(tiny_model).decode(_records(base_url)[-1].output_ids)
    stop = text[:1]
    cut = client.messages.create(**greedy, stop_sequences=[stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.usage.output_tokens < 24 and _records(base_url)[-1].finish_reason == "stop"
    with client.messages.stream(**greedy, stop_sequences=["no such text", stop]) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
    assert streamed.usage.output_tokens == cut.usage.output_tokens
    client.close()
