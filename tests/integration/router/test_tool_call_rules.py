"""Which replies come back as tool calls (SGLang's rules), through the official ``openai`` client.

The engine answers with canned text (``ScriptedEngine``), chosen by the request's last user message, so one reply
can be asked for with and without tools and its record compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from fakes import ScriptedEngine
from gyre.engine.models import load_tokenizer
from gyre.journal.records import CallRecord
from gyre.router.spawn import launch_router

TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
REPLIES = {  # the last user message -> the model's reply
    "act": f"THOUGHT: list the files.\n{CALL}",
    "parameters": '<tool_call>\n{"name": "bash", "parameters": {"command": "pwd"}}\n</tool_call>',
    "unoffered": 'I will clean up.\n<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>',
    "string arguments": 'Listing.\n<tool_call>\n{"name": "bash", "arguments": "ls -la"}\n</tool_call>',
    "list arguments": '<tool_call>\n{"name": "bash", "arguments": ["ls", "-la"]}\n</tool_call>',
    "done": "All done.",
}


def _last_user(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[ScriptedEngine]:
    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, lambda ids: REPLIES[_last_user(tokenizer.decode(ids))]) as fake:
        yield fake


@pytest.fixture(scope="module")
def router(tiny_model: Path, engine: ScriptedEngine) -> Iterator[str]:
    proc, admin = launch_router(tiny_model, [engine.url])
    with proc:
        yield admin


def _client(admin: str, execution_id: str) -> tuple[openai.OpenAI, str]:
    s = httpx.post(admin + "/admin/sessions", json={"execution_id": execution_id}).json()
    return openai.OpenAI(base_url=s["base_url"], api_key="unused"), s["base_url"]


def _records(base_url: str) -> list[CallRecord]:
    raw = httpx.get(base_url + "/gyre/records").content
    return msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]


def _ask(client: openai.OpenAI, case: str, **kwargs: Any) -> tuple[str | None, list[Any] | None, str]:
    """(content, tool calls, finish reason) of one non-streamed call."""
    messages: Any = [{"role": "user", "content": case}]
    choice = client.chat.completions.create(model="tiny", messages=messages, **kwargs).choices[0]
    return choice.message.content, choice.message.tool_calls, choice.finish_reason


def _ask_streamed(client: openai.OpenAI, case: str, **kwargs: Any) -> tuple[str, list[Any], str | None]:
    """(content, tool calls, finish reason) of one streamed call, the deltas joined."""
    messages: Any = [{"role": "user", "content": case}]
    chunks = [
        c for c in client.chat.completions.create(model="tiny", messages=messages, stream=True, **kwargs)
    ]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    return content, calls, chunks[-1].choices[0].finish_reason


def test_a_tool_call_block_without_tools_is_content(router: str, engine: ScriptedEngine) -> None:
    client, base_url = _client(router, "no-tools")
    content, calls, finish = _ask(client, "act")
    # a text-based agent (mini-swe-agent style) finds its whole action in the content
    assert (content, calls, finish) == (REPLIES["act"], None, "stop")
    assert _ask_streamed(client, "act") == (REPLIES["act"], [], "stop")
    # the model's text sent back as it came extends the call token-exactly
    messages: Any = [
        {"role": "user", "content": "act"},
        {"role": "assistant", "content": content},
        {"role": "user", "content": "done"},
    ]
    reply = client.chat.completions.create(model="tiny", messages=messages).choices[0].message
    assert reply.content == "All done."
    first, streamed, third = _records(base_url)
    assert third.parent_call_id in (first.call_id, streamed.call_id)
    client.close()


def test_a_request_with_tools_gets_the_call_and_the_same_record(router: str) -> None:
    client, base_url = _client(router, "tools")
    content, calls, finish = _ask(client, "act", tools=TOOLS)
    assert content == "THOUGHT: list the files." and finish == "tool_calls"
    assert calls is not None and [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("bash", {"command": "ls -la"})
    ]
    content, calls, finish = _ask_streamed(client, "act", tools=TOOLS)
    assert content == "THOUGHT: list the files." and finish == "tool_calls"
    assert [json.loads(c.function.arguments) for c in calls] == [{"command": "ls -la"}]
    assert _ask(client, "act", tools=TOOLS, tool_choice="none") == (REPLIES["act"], None, "stop")
    assert _ask_streamed(client, "act", tools=TOOLS, tool_choice="none") == (REPLIES["act"], [], "stop")
    # a tool call or not, the record keeps exactly the sampled tokens
    plain_client, plain_url = _client(router, "tools-plain")
    _ask(plain_client, "act")
    [plain] = _records(plain_url)
    assert [r.output_ids for r in _records(base_url)] == [plain.output_ids] * 4
    client.close()
    plain_client.close()


def test_parameters_are_the_arguments(router: str) -> None:
    client, _ = _client(router, "parameters")
    for content, calls, finish in (
        _ask(client, "parameters", tools=TOOLS),
        _ask_streamed(client, "parameters", tools=TOOLS),
    ):
        assert not content and finish == "tool_calls"
        assert calls and [json.loads(c.function.arguments) for c in calls] == [{"command": "pwd"}]
    client.close()


@pytest.mark.parametrize("case", ["unoffered", "string arguments", "list arguments"])
def test_a_call_that_breaks_the_rules_stays_in_the_content(router: str, case: str) -> None:
    client, _ = _client(router, case.replace(" ", "-"))
    assert _ask(client, case, tools=TOOLS) == (REPLIES[case], None, "stop")
    assert _ask_streamed(client, case, tools=TOOLS) == (REPLIES[case], [], "stop")
    client.close()


def test_unoffered_functions_are_forwarded_when_the_router_says_so(
    tiny_model: Path, engine: ScriptedEngine
) -> None:
    proc, admin = launch_router(tiny_model, [engine.url], overrides=["router.forward_unknown_tools=true"])
    with proc:
        client, _ = _client(admin, "forward")
        for content, calls, finish in (
            _ask(client, "unoffered", tools=TOOLS),
            _ask_streamed(client, "unoffered", tools=TOOLS),
        ):
            assert (content, finish) == ("I will clean up.", "tool_calls")
            assert calls and [c.function.name for c in calls] == ["rm_rf"]
        assert _ask(client, "unoffered") == (REPLIES["unoffered"], None, "stop")  # still only with tools
        client.close()


def test_completions_never_parse_tool_calls(router: str) -> None:
    client, _ = _client(router, "completions")
    prompt = "<|im_start|>user\nact<|im_end|>\n<|im_start|>assistant\n"
    text = client.completions.create(model="tiny", prompt=prompt, max_tokens=200).choices[0].text
    assert text.removesuffix("<|im_end|>") == REPLIES["act"]  # raw text, as the model wrote it
    client.close()
