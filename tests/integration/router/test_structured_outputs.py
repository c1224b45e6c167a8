"""``response_format`` and ``tool_choice`` as an engine sees them, through the official ``openai`` client.

The engine here is the canned one (``ScriptedEngine``, standing where an SGLang server stands): it records each
``/generate`` body, so these tests show what the router asks an engine's sampler to obey (SGLang's ``json_schema`` /
``ebnf`` sampling parameters) and what it refuses before any engine sees it. The embedded engine's enforcement of the
same parameters is tested in ``test_constrained_chat.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import xgrammar

from fakes import ScriptedEngine
from gyre.engine.models import load_tokenizer
from gyre.router.spawn import launch_router

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
BASH: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
REPLY = '{"answer": 42}'


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[ScriptedEngine]:
    with ScriptedEngine(load_tokenizer(tiny_model), lambda ids: REPLY) as fake:
        yield fake


@pytest.fixture(scope="module")
def router(tiny_model: Path, engine: ScriptedEngine) -> Iterator[str]:
    proc, admin = launch_router(tiny_model, [engine.url])
    with proc:
        yield admin


@pytest.fixture
def client(router: str) -> Iterator[openai.OpenAI]:
    s = httpx.post(router + "/admin/sessions", json={}).json()
    with openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0) as c:
        yield c


def _sent(client: openai.OpenAI, engine: ScriptedEngine, **kwargs: Any) -> dict[str, Any]:
    """The ``sampling_params`` the engine received for one call."""
    before = len(engine.requests)
    messages: Any = [{"role": "user", "content": "What is six times seven?"}]
    client.chat.completions.create(model="tiny", messages=messages, **kwargs)
    assert len(engine.requests) == before + 1
    params: dict[str, Any] = engine.requests[-1]["sampling_params"]
    return params


def _accepts(ebnf: str, text: str) -> bool:
    """Whether the grammar ``ebnf`` accepts ``text`` whole (xgrammar's own matcher, byte by byte)."""
    info = xgrammar.TokenizerInfo([chr(c) for c in range(32, 127)] + ["\n", "<eos>"], stop_token_ids=[96])
    compiled = xgrammar.GrammarCompiler(info).compile_grammar(ebnf)
    matcher = xgrammar.GrammarMatcher(compiled)
    ok = all(matcher.accept_string(ch) for ch in text)
    return ok and matcher.is_terminated() is False and matcher.accept_token(96)


def test_a_json_schema_response_format_reaches_the_engine_as_its_schema(
    client: openai.OpenAI, engine: ScriptedEngine
) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    params = _sent(client, engine, response_format=fmt)
    assert json.loads(params["json_schema"]) == ANSWER and params.get("ebnf") is None
    params = _sent(client, engine, response_format={"type": "json_object"})
    assert json.loads(params["json_schema"]) == {"type": "object"}
    for plain in ({"response_format": {"type": "text"}}, {}):
        params = _sent(client, engine, **plain)
        assert not any(params.get(k) for k in ("json_schema", "ebnf", "regex"))


def test_required_and_named_tool_choice_send_a_grammar_of_tool_call_blocks(
    client: openai.OpenAI, engine: ScriptedEngine
) -> None:
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n</tool_call>'
    bash = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    required = _sent(client, engine, tools=[WEATHER, BASH], tool_choice="required")["ebnf"]
    assert _accepts(required, weather) and _accepts(required, bash)
    assert _accepts(required, f"{weather}\n{bash}")  # parallel calls
    assert not _accepts(required, REPLY)  # a call is required
    assert not _accepts(required, weather.replace('"C"', '"K"'))  # the parameters' schema binds
    named = _sent(
        client, engine, tools=[WEATHER, BASH], tool_choice={"type": "function", "function": {"name": "bash"}}
    )
    assert _accepts(named["ebnf"], bash) and not _accepts(named["ebnf"], weather)
    single = _sent(client, engine, tools=[WEATHER, BASH], tool_choice="required", parallel_tool_calls=False)
    assert _accepts(single["ebnf"], bash) and not _accepts(single["ebnf"], f"{weather}\n{bash}")


def test_tools_with_a_json_response_format_allow_a_call_or_the_answer(
    client: openai.OpenAI, engine: ScriptedEngine
) -> None:
    """openai-agents' ``output_type`` with tools: the model may still call its tools, or answer in the schema."""
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    ebnf = _sent(client, engine, tools=[WEATHER], response_format=fmt)["ebnf"]
    assert _accepts(ebnf, REPLY)
    assert _accepts(
        ebnf, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "F"}}\n</tool_call>'
    )
    assert not _accepts(ebnf, '{"answer": "forty-two"}')
    nothing = _sent(client, engine, tools=[WEATHER], tool_choice="none")
    assert nothing.get("json_schema") is None and nothing.get("ebnf") is None
    none = _sent(client, engine, tools=[WEATHER], tool_choice="none", response_format=fmt)
    assert json.loads(none["json_schema"]) == ANSWER


def test_tool_choice_none_renders_no_tools(client: openai.OpenAI, engine: ScriptedEngine) -> None:
    messages: Any = [{"role": "user", "content": "What is six times seven?"}]
    client.chat.completions.create(model="tiny", messages=messages)
    plain = engine.requests[-1]["input_ids"]
    client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER])
    offered = engine.requests[-1]["input_ids"]
    client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="none")
    assert engine.requests[-1]["input_ids"] == plain != offered


@pytest.mark.parametrize(
    ("kwargs", "param", "says"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "rm_rf"}}}, "tool_choice",
         "which tools does not offer"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "tool_choice must be"),
        ({"response_format": {"type": "xml"}}, "response_format", "must be text, json_object or json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs a json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
         "response_format.json_schema.schema", 'Unsupported type "bogus"'),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "pattern": "(unclosed"}}}}, "response_format.json_schema.schema", "parenthesis"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nowhere"}}}],
          "tool_choice": "required"}, "tools", "cannot be enforced"),
    ],
)  # fmt: skip
def test_what_cannot_be_enforced_is_a_400_that_says_why(
    client: openai.OpenAI, engine: ScriptedEngine, kwargs: dict[str, Any], param: str, says: str
) -> None:
    before = len(engine.requests)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=messages, **kwargs)
    body: Any = err.value.body
    assert body["param"] == param and says in body["message"], body
    assert "/project/cpp" not in body["message"]  # the library's source location is not the client's business
    assert len(engine.requests) == before  # refused before any engine saw it
