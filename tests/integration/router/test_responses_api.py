"""The OpenAI Responses API (``/v1/responses``) through the official ``openai`` client and openai-agents' default
model, recorded like chat.

The engine answers with canned text (``ScriptedEngine``), chosen by the request's last user message: a reply with a
``<tool_call>`` block reaches the client as a ``function_call`` item, and a ``function_call_output`` sent back gets
the final text.
"""

from __future__ import annotations

import asyncio
import os
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

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # openai-agents never tries the network

TOOLS: Any = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]
REPLIES = {  # the last user message -> the model's reply
    "act": 'THOUGHT: list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
    "hello": "Hello there, how can I help?",
    "report": '{"files": 3, "names": ["a", "b", "c"]}',
    "add": "<think>\nI should add.\n</think>\n\nThe answer is 4.",  # a reasoning model's reply (Qwen3's markers)
}
REASONING, ANSWER = "I should add.", "The answer is 4."
REPORT_SCHEMA: Any = {
    "type": "object",
    "properties": {"files": {"type": "integer"}, "names": {"type": "array", "items": {"type": "string"}}},
    "required": ["files", "names"],
    "additionalProperties": False,
}
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


def _session(admin: str, execution_id: str) -> tuple[openai.OpenAI, str]:
    """A client for a new session (its token as the API key) and the session's base URL."""
    s = httpx.post(admin + "/admin/sessions", json={"execution_id": execution_id}).json()
    root = s["base_url"].split("/s/", 1)[0] + "/v1"
    return openai.OpenAI(base_url=root, api_key=s["token"], max_retries=0), s["base_url"]


def _records(base_url: str) -> list[CallRecord]:
    raw = httpx.get(base_url + "/gyre/records").content
    return msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]


def _assert_chain(parent: CallRecord, child: CallRecord, engine: ScriptedEngine) -> None:
    """``child`` (the engine's last call) extends ``parent`` (the one before) token-exactly: the engine saw the
    parent's input, what it sampled, then the new ids."""
    assert child.parent_call_id == parent.call_id
    assert child.prefix_len == parent.prefix_len + len(parent.new_input_ids) + len(parent.output_ids)
    *_, before, sent = (r["input_ids"] for r in engine.requests)
    assert before[parent.prefix_len :] == parent.new_input_ids
    assert sent == before + parent.output_ids + child.new_input_ids


def _echo(items: list[Any]) -> list[Any]:
    """Output items as a client sends them back as input."""
    return [item.model_dump(exclude_none=True) for item in items]


def test_text_reply_streamed_or_not(router: str, engine: ScriptedEngine) -> None:
    client, base_url = _session(router, "text")
    reply = client.responses.create(model="tiny", input="hello")
    assert reply.output_text == REPLIES["hello"] and reply.status == "completed"
    assert reply.id.startswith("resp_") and reply.output[0].type == "message"
    (record,) = _records(base_url)
    assert reply.usage is not None and reply.usage.input_tokens == len(record.new_input_ids)
    assert reply.usage.output_tokens == len(record.output_ids)

    events = list(client.responses.create(model="tiny", input="hello", stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLIES["hello"]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == REPLIES["hello"] and final.usage.output_tokens == len(record.output_ids)
    with client.responses.stream(model="tiny", input="hello") as stream:
        helped = stream.get_final_response()
    assert helped.output_text == REPLIES["hello"]
    # the three calls are one prompt sampled three times: three records of the same ids
    assert [(r.new_input_ids, r.output_ids) for r in _records(base_url)] == [
        (record.new_input_ids, record.output_ids)
    ] * 3
    # max_output_tokens cuts the reply: incomplete, and the record says length
    cut = client.responses.create(model="tiny", input="hello", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.usage and cut.usage.output_tokens == 3
    assert _records(base_url)[-1].finish_reason == "length"
    events = list(client.responses.create(model="tiny", input="hello", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"
    client.close()


def test_instructions_render_as_the_chat_system_message(router: str, engine: ScriptedEngine) -> None:
    client, base_url = _session(router, "instructions")
    client.responses.create(model="tiny", instructions="You are terse.", input="hello")
    as_items: Any = [{"role": "developer", "content": "You are terse."},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}]  # fmt: skip
    client.responses.create(model="tiny", input=as_items)
    # the same conversation through chat completions renders to the same ids
    system: Any = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
    client.chat.completions.create(model="tiny", messages=system)
    first, second, third = _records(base_url)
    assert first.new_input_ids == second.new_input_ids == third.new_input_ids
    assert engine.tokenizer.decode(first.new_input_ids).startswith(
        "<|im_start|>system\nYou are terse.<|im_end|>"
    )
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_tool_round_trip_is_one_chain(router: str, engine: ScriptedEngine, streamed: bool) -> None:
    client, base_url = _session(router, f"tools-{streamed}")
    items: Any = [{"role": "user", "content": "act"}]
    if streamed:
        events = list(client.responses.create(model="tiny", input=items, tools=TOOLS, stream=True))
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [e.arguments for e in done] == ['{"command": "ls -la"}']  # type: ignore[union-attr]
        with client.responses.stream(model="tiny", input=items, tools=TOOLS) as stream:
            first = stream.get_final_response()
    else:
        first = client.responses.create(model="tiny", input=items, tools=TOOLS)
    message, call = first.output
    assert message.type == "message" and first.output_text == "THOUGHT: list the files."
    assert call.type == "function_call" and (call.name, call.arguments) == ("bash", '{"command": "ls -la"}')
    # the agent runs its tool and sends the result back, with the output items exactly as it got them
    items += [
        *_echo(first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b c"},
    ]
    final = client.responses.create(model="tiny", input=items, tools=TOOLS)
    assert final.output_text == AFTER_TOOL and [o.type for o in final.output] == ["message"]
    *_, parent, child = _records(base_url)
    _assert_chain(parent, child, engine)
    assert final.usage is not None and final.usage.input_tokens == len(engine.requests[-1]["input_ids"])
    assert final.usage.input_tokens_details.cached_tokens == child.prefix_len
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_previous_response_id_continues_the_chain(
    router: str, engine: ScriptedEngine, streamed: bool
) -> None:
    client, base_url = _session(router, f"previous-{streamed}")
    first = client.responses.create(model="tiny", instructions="Be brief.", input="act", tools=TOOLS)
    call = first.output[-1]
    assert call.type == "function_call"
    result: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "a b c"}]
    kwargs: Any = {"model": "tiny", "instructions": "Be brief.", "tools": TOOLS}
    if streamed:
        with client.responses.stream(previous_response_id=first.id, input=result, **kwargs) as stream:
            second = stream.get_final_response()
    else:
        second = client.responses.create(previous_response_id=first.id, input=result, **kwargs)
    assert second.output_text == AFTER_TOOL and second.previous_response_id == first.id
    parent, child = _records(base_url)
    _assert_chain(parent, child, engine)
    third = client.responses.create(previous_response_id=second.id, input="hello", **kwargs)
    assert third.output_text == REPLIES["hello"]
    _assert_chain(child, _records(base_url)[-1], engine)
    # retrievable in this session; unknown in another
    assert client.responses.retrieve(second.id).output_text == AFTER_TOOL
    other, _ = _session(router, f"other-{streamed}")
    with pytest.raises(openai.BadRequestError) as refused:
        other.responses.create(model="tiny", previous_response_id=first.id, input="hello")
    assert f"Previous response with id '{first.id}' not found" in refused.value.message
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    # store=False: answered, not kept
    unstored = client.responses.create(model="tiny", input="hello", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", previous_response_id=unstored.id, input="hello")
    other.close()
    client.close()


def test_tool_choice_and_tools(router: str) -> None:
    client, _ = _session(router, "choice")
    # none: the model's tool-call text stays text
    reply = client.responses.create(model="tiny", input="act", tools=TOOLS, tool_choice="none")
    assert [o.type for o in reply.output] == ["message"] and "<tool_call>" in reply.output_text
    named = client.responses.create(
        model="tiny", input="act", tools=TOOLS, tool_choice={"type": "function", "name": "bash"}
    )
    assert named.output[-1].type == "function_call" and named.tool_choice.name == "bash"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="tiny", input="act", tools=TOOLS, tool_choice={"type": "function", "name": "rm"}
        )
    assert "'rm'" in refused.value.message
    with pytest.raises(openai.BadRequestError) as hosted:
        client.responses.create(model="tiny", input="act", tools=[{"type": "web_search"}])
    assert "'web_search' tools are not served" in hosted.value.message
    client.close()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input": "hello"}, "model"),
        ({"model": "tiny"}, "input must hold"),
        ({"model": "tiny", "input": 3}, "input"),
        ({"model": "tiny", "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"model": "tiny", "input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "not served"),
        ({"model": "tiny", "input": [{"type": "function_call", "name": "b", "arguments": "{}"}]}, "call_id"),
        ({"model": "tiny", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        (
            {"model": "tiny", "input": [{"type": "reasoning", "content": "x"}]},
            "input[0].content must be a list",
        ),
        (
            {"model": "tiny", "input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]},
            "summary[0]",
        ),
        (
            {"model": "tiny", "input": [{"type": "item_reference", "id": "x"}]},
            "'item_reference' are not served",
        ),
        ({"model": "tiny", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "tiny", "input": "hi", "tool_choice": "required"}, "tool_choice requires tools"),
        ({"model": "tiny", "input": "hi", "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"model": "tiny", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "tiny", "input": "hi", "temperature": 3}, "temperature"),
        ({"model": "tiny", "input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        (
            {"model": "tiny", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "schema",
        ),
        ({"model": "tiny", "input": "hi", "conversation": "conv_1"}, "conversation is not served"),
        ({"model": "tiny", "input": "hi", "previous_response_id": "resp_nope"}, "resp_nope' not found"),
    ],
)
def test_malformed_requests_get_a_400(router: str, body: Any, says: str) -> None:
    s = httpx.post(router + "/admin/sessions", json={}).json()
    response = httpx.post(s["base_url"] + "/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"], error


def test_unknown_session_is_a_401(router: str) -> None:
    s = httpx.post(router + "/admin/sessions", json={}).json()
    client = openai.OpenAI(base_url=s["base_url"].split("/s/", 1)[0] + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(model="tiny", input="hello")
    with pytest.raises(openai.AuthenticationError):
        client.responses.retrieve("resp_x")
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_agents_default_model_runs_its_tool(
    router: str, engine: ScriptedEngine, streamed: bool
) -> None:
    """An openai-agents Agent with its default model (OpenAIResponsesModel) calls its tool, then answers."""
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)
    s = httpx.post(router + "/admin/sessions", json={"execution_id": f"agents-{streamed}"}).json()
    ran: list[str] = []

    @function_tool
    def bash(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "a b c"

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=s["base_url"].split("/s/", 1)[0] + "/v1", api_key=s["token"],
                                    max_retries=0)  # fmt: skip
        agent = Agent(name="lister", instructions="List files when asked.", tools=[bash], model="tiny")
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        try:
            if not streamed:
                return await Runner.run(agent, "act", run_config=config)
            result = Runner.run_streamed(agent, "act", run_config=config)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    result = asyncio.run(run())
    assert ran == ["ls -la"] and result.final_output == AFTER_TOOL
    parent, child = _records(s["base_url"])
    _assert_chain(parent, child, engine)
    assert engine.tokenizer.decode(parent.new_input_ids).startswith(
        "<|im_start|>system\nList files when asked."
    )


def test_langchain_use_responses_api_runs_a_tool_round_trip(router: str, engine: ScriptedEngine) -> None:
    """langchain's ChatOpenAI with ``use_responses_api=True``: a tool call, its result sent back, the final answer."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    s = httpx.post(router + "/admin/sessions", json={"execution_id": "langchain"}).json()
    llm = ChatOpenAI(model="tiny", base_url=s["base_url"].split("/s/", 1)[0] + "/v1", api_key=s["token"],
                     use_responses_api=True, max_retries=0)  # fmt: skip
    bound = llm.bind_tools([TOOLS[0]])
    messages: list[Any] = [HumanMessage("act")]
    first = bound.invoke(messages)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("bash", {"command": "ls -la"})]
    messages += [first, ToolMessage("a b c", tool_call_id=first.tool_calls[0]["id"])]
    final = bound.invoke(messages)
    assert final.text == AFTER_TOOL
    parent, child = _records(s["base_url"])
    _assert_chain(parent, child, engine)


def test_structured_output(router: str, engine: ScriptedEngine) -> None:
    """``text.format`` json_schema reaches the chat path as ``response_format``; openai-agents' ``output_type`` parses
    the reply."""
    import pydantic
    from agents import Agent, RunConfig, Runner, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    client, base_url = _session(router, "structured")
    fmt: Any = {"type": "json_schema", "name": "report", "schema": REPORT_SCHEMA, "strict": True}
    reply = client.responses.create(model="tiny", input="report", text={"format": fmt})
    assert (
        reply.text is not None and reply.text.format is not None and reply.text.format.type == "json_schema"
    )
    assert msgspec.json.decode(reply.output_text) == {"files": 3, "names": ["a", "b", "c"]}

    class Report(pydantic.BaseModel):
        files: int
        names: list[str]

    set_tracing_disabled(True)
    token = client.api_key

    async def run() -> Any:
        aclient = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=token, max_retries=0)
        agent = Agent(name="reporter", instructions="Report.", output_type=Report, model="tiny")
        config = RunConfig(model_provider=OpenAIProvider(openai_client=aclient), tracing_disabled=True)
        try:
            return await Runner.run(agent, "report", run_config=config)
        finally:
            await aclient.close()

    assert asyncio.run(run()).final_output == Report(files=3, names=["a", "b", "c"])
    assert len(_records(base_url)) == 2
    client.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_reasoning_is_an_output_item_before_the_message(
    router: str, engine: ScriptedEngine, streamed: bool
) -> None:
    client, base_url = _session(router, f"reasoning-{streamed}")
    if streamed:
        events = list(client.responses.create(model="tiny", input="add", stream=True))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        reasoning_events = [e.type for e in events if e.type.startswith("response.reasoning_text.")]
        assert reasoning_events[-1] == "response.reasoning_text.done" and len(reasoning_events) >= 2
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]  # type: ignore[union-attr]
        (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
        deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
        assert "".join(e.delta for e in deltas) == done.text  # type: ignore[union-attr]
        assert {(e.item_id, e.output_index, e.content_index) for e in [*deltas, done]} == {  # type: ignore[union-attr]
            (added[0].item.id, 0, 0)  # type: ignore[union-attr]
        }
        # the reasoning item ends before the message starts
        order = [e.type for e in events]
        assert order.index("response.reasoning_text.done") < order.index("response.output_text.delta")
        reply = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type == "response.completed"
        with client.responses.stream(model="tiny", input="add") as stream:
            assert [o.type for o in stream.get_final_response().output] == ["reasoning", "message"]
    else:
        reply = client.responses.create(model="tiny", input="add")
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert reasoning.status == "completed" and reasoning.content is not None
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", REASONING)]
    assert message.type == "message" and reply.output_text == ANSWER
    # reasoning tokens: counted, and as the chat path counts them for the same reply
    assert reply.usage is not None
    thought = reply.usage.output_tokens_details.reasoning_tokens
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "add"}])
    assert chat.usage is not None and chat.usage.completion_tokens_details is not None
    assert 0 < thought == chat.usage.completion_tokens_details.reasoning_tokens < reply.usage.output_tokens
    assert reply.usage.output_tokens == len(_records(base_url)[0].output_ids)
    client.close()


@pytest.mark.parametrize("how", ["echo", "echo-without-reasoning", "previous_response_id"])
def test_a_reply_with_reasoning_continues_the_chain(router: str, engine: ScriptedEngine, how: str) -> None:
    """The next turn extends the reasoning reply token-exactly, whether or not the client sends its reasoning back."""
    client, base_url = _session(router, f"reasoning-chain-{how}")
    first = client.responses.create(model="tiny", input="add")
    assert [o.type for o in first.output] == ["reasoning", "message"]
    if how == "previous_response_id":
        second = client.responses.create(model="tiny", previous_response_id=first.id, input="hello")
    else:
        echoed = [o for o in _echo(first.output) if how == "echo" or o["type"] != "reasoning"]
        items: Any = [{"role": "user", "content": "add"}, *echoed, {"role": "user", "content": "hello"}]
        second = client.responses.create(model="tiny", input=items)
    assert second.output_text == REPLIES["hello"]
    parent, child = _records(base_url)
    _assert_chain(parent, child, engine)
    client.close()


def test_reasoning_items_without_text_are_accepted(router: str) -> None:
    """A reasoning item from another server (``encrypted_content`` only, or an empty summary) is not rendered."""
    client, _ = _session(router, "reasoning-encrypted")
    items: Any = [
        {"role": "user", "content": "act"},
        {"type": "reasoning", "id": "rs_elsewhere", "summary": [], "encrypted_content": "gAAAAB..."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"role": "user", "content": "hello"},
    ]
    assert client.responses.create(model="tiny", input=items).output_text == REPLIES["hello"]
    client.close()
