"""gyre.router.render: template rendering that never re-tokenizes sampled ids, reply parsing, message digests."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.errors import ConfigError
from gyre.models import build_tokenizer, init_model
from gyre.router.render import ChatRenderer, chain_digest, message_digests, normalize_messages

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {"type": "function", "function": {"name": "ls", "description": "List files.", "parameters": {}}},
]
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is in main.py?"}


def call(call_id: str, name: str = "read_file", arguments: Any = '{"path": "main.py"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory) -> ChatRenderer:
    return ChatRenderer.from_model_dir(init_model(tmp_path_factory.mktemp("render") / "tiny"))


def reply_ids(renderer: ChatRenderer, prefix: list[dict], reply: dict, tools: list | None) -> list[int]:
    """The ids of the assistant turn as the template itself renders it, up to and including the eos marker."""
    tok = renderer._tokenizer
    before = tok.apply_chat_template(
        normalize_messages(prefix), tools=tools, add_generation_prompt=True, tokenize=False
    )
    after = tok.apply_chat_template(
        normalize_messages([*prefix, reply]), tools=tools, add_generation_prompt=False, tokenize=False
    )
    assert after.startswith(before)
    turn = after[len(before) : after.rindex(renderer.eos_text) + len(renderer.eos_text)]
    return tok.encode(turn, add_special_tokens=False)


def assert_tito(
    renderer: ChatRenderer, prefix: list[dict], reply: dict, new: list[dict], tools: list | None
) -> None:
    """Rendering the whole conversation equals earlier input + the reply's ids + the extension."""
    full = renderer.render_full([*prefix, reply, *new], tools)
    assembled = renderer.render_full(prefix, tools) + reply_ids(renderer, prefix, reply, tools)
    assert full == assembled + renderer.render_extension(new, tools, True)


CASES = {
    "user follows": ([SYSTEM, USER], {"role": "assistant", "content": "Nothing."}, [USER], None),
    "no system": (
        [USER],
        {"role": "assistant", "content": "Hi"},
        [{"role": "user", "content": "more"}],
        None,
    ),
    "tools, one result": (
        [SYSTEM, USER],
        {"role": "assistant", "content": "", "tool_calls": [call("call_1")]},
        [tool("call_1", "print('hi')")],
        TOOLS,
    ),
    "tools without system, several results then user": (
        [USER],
        {"role": "assistant", "content": "Looking.", "tool_calls": [call("a"), call("b", "ls", {})]},
        [tool("a", "x = 1"), tool("b", "main.py\nutil.py"), {"role": "user", "content": "and util.py?"}],
        TOOLS,
    ),
    "tool calls with dict arguments, then system and assistant": (
        [SYSTEM, USER],
        {"role": "assistant", "content": None, "tool_calls": [call("c", arguments={"path": "ü.py"})]},
        [tool("c", ""), {"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "ok"}],
        TOOLS,
    ),
    "no new messages": ([SYSTEM, USER], {"role": "assistant", "content": "Hm."}, [], TOOLS),
}


@pytest.mark.parametrize("case", list(CASES))
def test_full_render_is_earlier_input_plus_reply_plus_extension(renderer: ChatRenderer, case: str) -> None:
    prefix, reply, new, tools = CASES[case]
    assert_tito(renderer, prefix, reply, new, tools)


def test_extension_starts_after_the_eos_and_ends_with_the_generation_prompt(renderer: ChatRenderer) -> None:
    tok = renderer._tokenizer
    ids = renderer.render_extension([tool("a", "out")], TOOLS, True)
    assert tok.decode(ids) == "\n<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


def test_extension_after_a_reply_without_eos_prepends_exactly_the_eos_id(renderer: ChatRenderer) -> None:
    new = [tool("a", "out"), USER]
    with_eos = renderer.render_extension(new, TOOLS, previous_ended_with_eos=True)
    assert renderer.render_extension(new, TOOLS, previous_ended_with_eos=False) == [
        renderer.eos_token_id,
        *with_eos,
    ]
    assert renderer.eos_token_id == renderer._tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert renderer.eos_text == "<|im_end|>"


def test_extension_refuses_a_template_that_rewrites_earlier_turns() -> None:
    tokenizer = build_tokenizer()
    # The system prompt counts the messages, so every earlier turn's text changes when a message is added.
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>system\\n' + messages[0].content + (messages | length | string) + '<|im_end|>\\n' }}",
    )
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="differently"):
        renderer.render_extension([USER], None, True)


def test_render_full_applies_normalization(renderer: ChatRenderer) -> None:
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "x?"}],
    }
    assert renderer.render_full([parts]) == renderer.render_full([{"role": "user", "content": "What is x?"}])
    with pytest.raises(ValueError, match=r"messages\[1\]"):
        renderer.render_full([USER, {"role": "robot", "content": "x"}])


# Random continuations: any mix of user, system, tool and assistant messages, any text.
texts = st.text(max_size=20)
call_ids = st.text(alphabet="abcdef0123456789_", min_size=1, max_size=8)
tool_calls = st.lists(
    st.builds(
        call,
        call_ids,
        st.sampled_from(["read_file", "ls"]),
        st.one_of(st.dictionaries(texts, texts, max_size=2), texts.map(json.dumps)),
    ),
    max_size=3,
)
assistants = st.builds(lambda c, tc: {"role": "assistant", "content": c, "tool_calls": tc}, texts, tool_calls)
messages = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, texts),
    st.builds(lambda c: {"role": "system", "content": c}, texts),
    st.builds(tool, call_ids, texts),
    assistants,
)


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.sampled_from(
        [[SYSTEM, USER], [USER], [SYSTEM, USER, {"role": "assistant", "content": "a"}, USER]]
    ),
    reply=assistants,
    new=st.lists(messages, max_size=5),
    tools=st.sampled_from([None, TOOLS]),
)
def test_random_continuations_keep_the_tito_identity(
    renderer: ChatRenderer, prefix: list[dict], reply: dict, new: list[dict], tools: list | None
) -> None:
    assert_tito(renderer, prefix, reply, new, tools)


def encode(renderer: ChatRenderer, text: str, eos: bool) -> list[int]:
    ids = renderer._tokenizer.encode(text, add_special_tokens=False)
    return [*ids, renderer.eos_token_id] if eos else ids


def test_parse_single_tool_call_with_content(renderer: ChatRenderer) -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "main.py"}}\n</tool_call>'
    reply = renderer.parse_output(encode(renderer, text, eos=True))
    assert reply.content == "Let me look."
    assert reply.malformed == []
    [only] = reply.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", only["id"])
    assert only["type"] == "function"
    assert only["function"] == {"name": "read_file", "arguments": '{"path": "main.py"}'}


def test_parse_multiple_tool_calls_with_object_and_string_arguments(renderer: ChatRenderer) -> None:
    text = (
        '<tool_call>{"name":"ls","arguments":{"dir":"/tmp","deep":true}}</tool_call>\n'
        '<tool_call>\n  {"name": "read_file", "arguments": "{\\"path\\":\\"a.py\\"}"}  \n</tool_call>\nDone?'
    )
    reply = renderer.parse_output(encode(renderer, text, eos=False))
    assert [c["function"]["name"] for c in reply.tool_calls] == ["ls", "read_file"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"dir": "/tmp", "deep": True}
    assert reply.tool_calls[1]["function"]["arguments"] == '{"path":"a.py"}'  # a string is kept as given
    assert reply.tool_calls[0]["id"] != reply.tool_calls[1]["id"]
    assert reply.content == "Done?"


def test_parse_keeps_malformed_blocks_in_content(renderer: ChatRenderer) -> None:
    bad = '<tool_call>\n{"name": "ls", "arguments": {"dir": }\n</tool_call>'
    good = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    reply = renderer.parse_output(encode(renderer, f"a {bad} b {good}", eos=True))
    assert reply.malformed == [bad]
    assert reply.content == f"a {bad} b"
    assert [c["function"] for c in reply.tool_calls] == [{"name": "ls", "arguments": "{}"}]


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "ls", "arguments": [1]}</tool_call>',  # arguments neither object nor string
        '<tool_call>["ls"]</tool_call>',
        "<tool_call></tool_call>",
    ],
)
def test_parse_rejects_blocks_that_are_not_calls(renderer: ChatRenderer, block: str) -> None:
    reply = renderer.parse_output(encode(renderer, block, eos=True))
    assert (reply.tool_calls, reply.malformed, reply.content) == ([], [block], block)


def test_parse_unterminated_tool_call(renderer: ChatRenderer) -> None:
    cut = 'Sure.\n<tool_call>\n{"name": "read_file", "argum'  # stopped by length: no eos either
    reply = renderer.parse_output(encode(renderer, cut, eos=False))
    assert reply.tool_calls == []
    assert reply.malformed == ['<tool_call>\n{"name": "read_file", "argum']
    assert reply.content == cut
    # An opening tag without its closing tag before the next opening one does not swallow the next call.
    reopened = '<tool_call>oops <tool_call>{"name": "ls"}</tool_call>'
    reply = renderer.parse_output(encode(renderer, reopened, eos=True))
    assert (reply.content, reply.malformed) == ("<tool_call>oops", ["<tool_call>oops "])
    assert [c["function"] for c in reply.tool_calls] == [{"name": "ls", "arguments": "{}"}]


def test_parse_plain_text_and_non_ascii_round_trip(renderer: ChatRenderer) -> None:
    text = "  Grüße, 世界 🌍 — {not a call}\n"
    reply = renderer.parse_output(encode(renderer, text, eos=True))
    assert (reply.content, reply.tool_calls, reply.malformed) == (text.strip(), [], [])
    assert reply.message() == {"role": "assistant", "content": text.strip()}
    unicode_args = '<tool_call>{"name": "ls", "arguments": {"dir": "Ärger/日本"}}</tool_call>'
    [parsed] = renderer.parse_output(encode(renderer, unicode_args, eos=True)).tool_calls
    assert json.loads(parsed["function"]["arguments"]) == {"dir": "Ärger/日本"}
    assert renderer.parse_output([]).content == ""


def test_parsed_reply_renders_as_the_sampled_text(renderer: ChatRenderer) -> None:
    """A reply parsed and sent back renders, by the template, to the very ids that were sampled."""
    sampled = 'Looking.\n<tool_call>\n{"name": "ls", "arguments": {"dir": "/"}}\n</tool_call><|im_end|>'
    ids = encode(renderer, sampled, eos=False)
    message = renderer.parse_output(ids).message()
    assert reply_ids(renderer, [SYSTEM, USER], message, TOOLS) == ids


def test_normalize_messages_canonical_form() -> None:
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "x": 1,
        },
        {"role": "user", "content": None, "name": "bob"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c1", arguments={"k": "ü"})],
            "refusal": None,
        },
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    assert normalize_messages(messages) == [
        {"role": "system", "content": "ab"},
        {"role": "user", "content": "", "name": "bob"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", arguments='{"k": "ü"}')]},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ]
    assert normalize_messages(normalize_messages(messages)) == normalize_messages(messages)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "robot", "content": "x"}, r"messages\[1\]\.role"),
        ({"role": "user"}, r"messages\[1\]\.content"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
            r"messages\[1\]\.content\[0\]",
        ),
        ({"role": "user", "content": 3}, r"messages\[1\]\.content"),
        ({"role": "tool", "content": "x"}, r"messages\[1\]\.tool_call_id"),
        (
            {"role": "assistant", "tool_calls": [call("a", arguments=[1])]},
            r"tool_calls\[0\]\.function\.arguments",
        ),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, r"tool_calls\[0\]\.id"),
        ({"role": "assistant", "tool_calls": [call("a", name="")]}, r"tool_calls\[0\]\.function\.name"),
        ({"role": "assistant", "tool_calls": {"id": "a"}}, r"messages\[1\]\.tool_calls"),
        ({"role": "user", "content": "x", "name": 5}, r"messages\[1\]\.name"),
        ("hello", r"messages\[1\]"),
    ],
)
def test_normalize_messages_rejects_malformed_messages(message: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        normalize_messages([USER, message])


CONVERSATION = [
    SYSTEM,
    USER,
    {"role": "assistant", "content": "", "tool_calls": [call("a"), call("b", "ls", "{}")]},
    tool("a", "x"),
    tool("b", "y"),
]


def test_message_digests_identify_prefixes() -> None:
    digests = message_digests(CONVERSATION)
    assert len(digests) == len(CONVERSATION) == len(set(digests))
    assert all(len(d) == 16 for d in digests)
    assert message_digests([dict(m) for m in CONVERSATION]) == digests
    for k in range(len(CONVERSATION)):
        assert message_digests(CONVERSATION[: k + 1]) == digests[: k + 1]
    reply = {"role": "assistant", "content": "done"}
    assert chain_digest(digests[-1], reply) == message_digests([*CONVERSATION, reply])[-1]
    # Forms that normalize equally digest equally; key order does not matter.
    same = [dict(reversed(list(m.items()))) for m in CONVERSATION]
    same[0] = {"role": "system", "content": [{"type": "text", "text": SYSTEM["content"]}], "extra": 1}
    same[2] = {**same[2], "content": None}
    assert message_digests(same) == digests


@pytest.mark.parametrize(
    ("index", "change"),
    [
        (0, {"role": "user"}),
        (1, {"content": "What is in util.py?"}),
        (1, {"name": "alice"}),
        (2, {"tool_calls": [call("a"), call("b", "ls", '{"dir": "."}')]}),
        (2, {"tool_calls": [call("a"), call("c", "ls", "{}")]}),
        (2, {"tool_calls": [call("a")]}),
        (3, {"tool_call_id": "b"}),
        (4, {"content": "z"}),
    ],
)
def test_message_digests_change_from_the_changed_message_on(index: int, change: dict) -> None:
    changed = [dict(m) for m in CONVERSATION]
    changed[index].update(change)
    before, after = message_digests(CONVERSATION), message_digests(changed)
    assert after[:index] == before[:index]
    assert all(a != b for a, b in zip(after[index:], before[index:], strict=True))


def test_renderer_needs_a_chat_template() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        ChatRenderer(tokenizer)
