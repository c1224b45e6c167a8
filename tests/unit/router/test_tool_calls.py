"""Which ``<tool_call>`` blocks become tool calls (SGLang's rules), and that no other block loses a character."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.router.messages import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, offered_functions, parse_tool_calls

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "submit"}},
    {"type": "function"},  # no function: offers nothing
    "not a tool",
]


def block(body: object) -> str:
    return f"{TOOL_CALL_OPEN}\n{body if isinstance(body, str) else json.dumps(body)}\n{TOOL_CALL_CLOSE}"


def test_offered_functions_are_the_named_functions_of_tools() -> None:
    assert offered_functions(TOOLS) == {"bash", "submit"}
    assert offered_functions(None) == offered_functions([]) == frozenset()


def test_a_call_to_a_function_not_offered_stays_in_the_content_as_written() -> None:
    known, unknown = (
        block({"name": "bash", "arguments": {"cmd": "ls"}}),
        block({"name": "rm", "arguments": {}}),
    )
    reply = parse_tool_calls(f"First. {unknown} then {known} end", offered_functions(TOOLS))
    assert [c["function"]["name"] for c in reply.tool_calls] == ["bash"]
    assert reply.unknown == [unknown] and reply.malformed == []
    assert reply.content == f"First. {unknown} then  end"
    forwarded = parse_tool_calls(f"First. {unknown} then {known} end", None)  # forward_unknown_tools
    assert [c["function"]["name"] for c in forwarded.tool_calls] == ["rm", "bash"]


def test_parameters_is_read_as_arguments() -> None:
    [call] = parse_tool_calls(block({"name": "bash", "parameters": {"cmd": "ls -la"}}), {"bash"}).tool_calls
    assert json.loads(call["function"]["arguments"]) == {"cmd": "ls -la"}
    same = block({"name": "bash", "arguments": {"cmd": "ls"}, "parameters": {"cmd": "ls"}})
    assert len(parse_tool_calls(same).tool_calls) == 1


@pytest.mark.parametrize(
    "call",
    [
        {"name": "bash", "arguments": "ls -la"},  # a string that is not an object's JSON
        {"name": "bash", "arguments": '"ls"'},
        {"name": "bash", "arguments": "[1, 2]"},
        {"name": "bash", "arguments": ["ls"]},
        {"name": "bash", "arguments": 3},
        {"name": "bash", "arguments": True},
        {"name": "bash", "parameters": "ls"},
        {"name": "bash", "arguments": {"cmd": "ls"}, "parameters": {"cmd": "rm"}},  # which one was meant?
    ],
)
def test_arguments_that_are_not_an_object_stay_in_the_content(call: dict[str, object]) -> None:
    text = "Running it. " + block(call)
    reply = parse_tool_calls(text, {"bash"})
    assert reply.tool_calls == [] and reply.content == text and reply.malformed == [block(call)]


def test_arguments_written_as_an_object_s_json_text_are_kept_as_written() -> None:
    written = '{"cmd":  "ls"}'
    [call] = parse_tool_calls(block({"name": "bash", "arguments": written}), {"bash"}).tool_calls
    assert call["function"]["arguments"] == written
    for absent in ({"name": "bash"}, {"name": "bash", "arguments": None}):  # no arguments at all
        [call] = parse_tool_calls(block(absent), {"bash"}).tool_calls
        assert call["function"]["arguments"] == "{}"


def test_json_nested_past_the_interpreter_s_limit_is_malformed_not_an_error() -> None:
    deep = block("[" * 5000 + "]" * 5000)
    assert parse_tool_calls(deep).malformed == [deep]
    nested_string = block({"name": "bash", "arguments": "[" * 5000 + "]" * 5000})
    assert parse_tool_calls(nested_string).content == nested_string


TEXT = st.lists(
    st.sampled_from(["a", " ", "\n", "{", "}", '"', ":", TOOL_CALL_OPEN, TOOL_CALL_CLOSE]), max_size=8
).map("".join)
CALLS = st.fixed_dictionaries(
    {"name": st.sampled_from(["bash", "rm", ""])},
    optional={
        "arguments": st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=5),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        ),
        "parameters": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(TEXT, CALLS.map(block)), max_size=5), st.sampled_from([None, {"bash"}]))
def test_every_block_is_a_call_or_left_in_the_content(pieces: list[str], offered: set[str] | None) -> None:
    text = "".join(pieces)
    reply = parse_tool_calls(text, offered)
    # nothing offered: every character the model wrote comes back as content
    assert parse_tool_calls(text, set()).content == text.strip()
    assert parse_tool_calls(text, set()).tool_calls == []
    for call in reply.tool_calls:
        assert offered is None or call["function"]["name"] in offered
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    for kept in reply.malformed + reply.unknown:
        assert kept.strip() in reply.content
