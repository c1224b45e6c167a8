"""gyre.router.render: template rendering that never re-tokenizes sampled ids, reply parsing, message digests."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gyre.engine.models import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    IM_END,
    SPECIAL_TOKENS,
    build_tokenizer,
    init_model,
)
from gyre.errors import ConfigError
from gyre.router.messages import normalize_messages
from gyre.router.render import ChatRenderer

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
    produced = reply_ids(renderer, prefix, reply, tools)
    assembled = renderer.render_full(prefix, tools) + produced
    extension, divergence = renderer.render_continuation(normalize_messages([reply])[0], new, produced, tools)
    assert full == assembled + extension
    assert divergence is None  # the model wrote its turn as the template writes it


def extension(renderer: ChatRenderer, new: list[dict], tools: list | None, ended: bool = True) -> list[int]:
    """The ids after a reply calling tool ``a`` (ending with eos when ``ended``), as a chained call renders them."""
    reply = normalize_messages([{"role": "assistant", "content": "", "tool_calls": [call("a")]}])[0]
    produced = reply_ids(renderer, [SYSTEM, USER], reply, TOOLS)
    produced = produced if ended else produced[:-1]
    return renderer.render_continuation(reply, new, produced, tools)[0]


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
    ids = extension(renderer, [tool("a", "out")], TOOLS)
    assert tok.decode(ids) == "\n<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


def test_extension_after_a_reply_without_eos_prepends_exactly_the_eos_id(renderer: ChatRenderer) -> None:
    new = [tool("a", "out"), USER]
    with_eos = extension(renderer, new, TOOLS, ended=True)
    assert extension(renderer, new, TOOLS, ended=False) == [
        renderer.eos_token_id,
        *with_eos,
    ]
    assert renderer.eos_token_id == renderer._tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert renderer.eos_text == "<|im_end|>"


def test_extension_follows_a_template_that_rewrites_earlier_turns() -> None:
    tokenizer = build_tokenizer()
    # The system prompt counts the messages, so every earlier turn's text changes when a message is added.
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>system\\n' + messages[0].content + (messages | length | string) + '<|im_end|>\\n' }}",
    )
    renderer = ChatRenderer(tokenizer)
    reply = {"role": "assistant", "content": "Nothing."}
    produced = renderer.encode("Nothing.") + [renderer.eos_token_id]
    ids, divergence = renderer.render_continuation(reply, [USER], produced)
    # the earlier turns are the model's own ids; only what follows the reply is new
    assert (
        renderer._tokenizer.decode(ids)
        == "\n<|im_start|>user\nWhat is in main.py?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert divergence is None  # the reply's own turn renders as the model wrote it


def test_extension_is_refused_where_the_template_writes_no_turn_boundary() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="no turn terminator"):
        renderer.render_continuation({"role": "assistant", "content": "a"}, [USER], renderer.encode("a"))


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
    # reply_ids encodes the reply as the wrapper does; special-token text in messages is encoded as text
    # (tests/unit/router/test_hostile_render.py), where the wrapper would make it special ids.
    assume(not any(token in json.dumps([reply, new]) for token in SPECIAL_TOKENS))
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


def test_renderer_needs_a_chat_template() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        ChatRenderer(tokenizer)


# The fast paths (compiled template, Rust tokenizer, caches) give exactly what transformers' wrappers give.


def template_text(tokenizer: Any, messages: list[dict], tools: list | None, generation_prompt: bool) -> str:
    text: str = tokenizer.apply_chat_template(
        normalize_messages(messages), tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )
    return text


def wrapper_ids(renderer: ChatRenderer, messages: list[dict], tools: list | None) -> list[int]:
    """What render_full gave when it went through apply_chat_template and tokenizer.encode."""
    tok = renderer._tokenizer
    return tok.encode(template_text(tok, messages, tools, True), add_special_tokens=False)


def trained_bpe_tokenizer() -> Any:
    """A byte-level BPE with learnt merges and an NFKC normalizer (unlike the tiny model's), same chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "def main():\n    print('hello world')\n",
        "What is in main.py? Grüße, 世界 🌍 — naïve ﬁne",
        '{"name": "read_file", "arguments": {"path": "main.py"}}',
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


@pytest.fixture(scope="module", params=["tiny model", "trained bpe"])
def any_renderer(request: pytest.FixtureRequest, renderer: ChatRenderer) -> ChatRenderer:
    fresh = renderer if request.param == "tiny model" else ChatRenderer(trained_bpe_tokenizer())
    # Otherwise the equality tests below would pass through the wrappers they are compared with.
    assert (
        fresh._encoder is not None and fresh._decoder is not None and set(fresh._templates) == {False, True}
    )
    return fresh


TWO_CALLS = {"role": "assistant", "content": "Looking.", "tool_calls": [call("a"), call("b", "ls", {})]}
RENDER_CASES = {
    "plain": ([SYSTEM, USER], None),
    "tool calls and consecutive results": (CONVERSATION, TOOLS),
    "results then user, no system": ([USER, TWO_CALLS, tool("a", "1"), tool("b", "2"), USER], TOOLS),
    "unicode, names, added-token text": (
        [
            {"role": "system", "content": "Grüße, 世界 🌍"},
            {"role": "user", "content": "say </think> then <tool_call>", "name": "bob"},
            {"role": "assistant", "content": "ok", "tool_calls": [call("ü", arguments={"pfad": "ä/ß"})]},
        ],
        TOOLS,
    ),
    "empty contents": (
        [
            {"role": "user", "content": ""},
            {"role": "assistant", "content": None},
            {"role": "user", "content": []},
        ],
        None,
    ),
    "empty tool list": (
        [USER, {"role": "system", "content": "late"}, {"role": "assistant", "content": ""}],
        [],
    ),
}


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_compiled_template_renders_what_apply_chat_template_renders(
    any_renderer: ChatRenderer, case: str, generation_prompt: bool
) -> None:
    messages, tools = RENDER_CASES[case]
    slow = any_renderer.statistics().slow_renders
    text = any_renderer._template(normalize_messages(messages), tools, generation_prompt, plain_tools=True)
    assert text == template_text(any_renderer._tokenizer, messages, tools, generation_prompt)
    assert any_renderer.render_full(messages, tools) == wrapper_ids(any_renderer, messages, tools)
    assert any_renderer.statistics().slow_renders == slow


@settings(max_examples=60, deadline=None)
@given(conversation=st.lists(messages, min_size=1, max_size=6), tools=st.sampled_from([None, TOOLS]))
def test_random_conversations_render_the_wrappers_ids(
    renderer: ChatRenderer, conversation: list[dict], tools: list | None
) -> None:
    assert renderer.render_full(conversation, tools) == wrapper_ids(renderer, conversation, tools)
    assert renderer.render_full(conversation, tools) == wrapper_ids(renderer, conversation, tools)  # cached


special_texts = st.sampled_from([*SPECIAL_TOKENS, *ADDED_TOKENS, "<|im_end", "|>", "<tool_", "ﬁ", " "])
texts_with_specials = st.lists(st.one_of(st.text(), special_texts), max_size=8).map("".join)


@settings(max_examples=100, deadline=None)
@given(text=texts_with_specials)
def test_encode_and_decode_match_the_tokenizer(any_renderer: ChatRenderer, text: str) -> None:
    tok = any_renderer._tokenizer
    ids = any_renderer.encode(text)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert any_renderer.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    assert any_renderer.decode_tokens(ids) == [tok.decode([i], skip_special_tokens=False) for i in ids]


def test_decode_tokens_is_decode_of_each_id(any_renderer: ChatRenderer) -> None:
    tok = any_renderer._tokenizer
    ids = [*range(len(tok)), len(tok) + 7, 0, 200]  # every id, one past the vocabulary, repeats
    expected = [tok.decode([i], skip_special_tokens=False) for i in ids]
    assert any_renderer.decode_tokens(ids) == expected
    assert any_renderer.decode_tokens(ids) == expected  # from the learnt texts now
    assert [any_renderer.decode([i]) for i in ids] == expected
    assert any_renderer.decode_tokens([]) == []


def test_encode_ignores_truncation_and_padding_another_caller_left_on_the_tokenizer() -> None:
    tokenizer = build_tokenizer()
    renderer = ChatRenderer(tokenizer)
    text = "hello world " * 10
    expected = tokenizer.encode(text, add_special_tokens=False)
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    assert renderer.encode(text) == expected
    tokenizer.backend_tokenizer.enable_padding(length=500)
    assert renderer.encode(text) == expected


def test_render_cache_gives_each_caller_its_own_equal_list() -> None:
    renderer = ChatRenderer(build_tokenizer())
    expected = wrapper_ids(renderer, CONVERSATION, TOOLS)
    first = renderer.render_full(CONVERSATION, TOOLS)
    assert first == expected
    first.append(renderer.eos_token_id)  # the router appends to what it gets
    first[0] = -1
    second = renderer.render_full([dict(m) for m in CONVERSATION], TOOLS)  # equal messages, other objects
    assert second == expected
    second.clear()
    assert renderer.render_full(CONVERSATION, TOOLS) == expected
    stats = renderer.statistics()
    assert (stats.cache_hits, stats.cache_misses, stats.cache_entries) == (2, 1, 1)
    assert (stats.cache_tokens, stats.slow_renders) == (len(expected), 0)


def test_render_cache_tells_apart_what_renders_differently() -> None:
    renderer = ChatRenderer(build_tokenizer())
    reordered = [{"function": t["function"], "type": t["type"]} for t in TOOLS]  # tojson keeps key order

    def limit(value: Any) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "ls", "parameters": {"limit": value}}}]

    tool_lists = [None, [], TOOLS, reordered, TOOLS[:1], limit(1), limit(1.0), limit(True), limit("1")]
    conversations: list[list[dict]] = [
        [USER],
        [SYSTEM, USER],
        [{**USER, "name": "bob"}],
        [USER, {"role": "assistant", "content": "", "tool_calls": [call("a")]}, tool("a", "")],
        [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call("a", arguments="{}")]},
            tool("a", ""),
        ],
    ]
    for _ in range(2):  # the second round comes from the cache
        for tools in tool_lists:
            for conversation in conversations:
                assert renderer.render_full(conversation, tools) == wrapper_ids(renderer, conversation, tools)
    stats = renderer.statistics()
    assert (
        stats.cache_hits == stats.cache_misses == stats.cache_entries == len(tool_lists) * len(conversations)
    )


def test_values_that_are_not_plain_json_render_as_transformers_renders_them() -> None:
    class Text(str):
        pass

    renderer = ChatRenderer(build_tokenizer())
    tools = [{"type": "function", "function": {"name": Text("ls"), "parameters": {"limit": float("nan")}}}]
    assert renderer.render_full([USER], tools) == wrapper_ids(renderer, [USER], tools)
    assert (
        renderer.statistics().slow_renders == 1
    )  # transformers copies such tools first; so does the renderer
    assert renderer.statistics().cache_entries == 0  # NaN encodes as null in a cache key: not cached
    messages = [{"role": Text("user"), "content": Text("hi"), "name": Text("bob")}]
    [normalized] = normalize_messages(messages)
    assert all(type(value) is str for value in normalized.values())
    assert renderer.render_full(messages) == wrapper_ids(renderer, messages, None)
    assert renderer.statistics().slow_renders == 1


def test_render_cache_evicts_the_least_recently_used() -> None:
    renderer = ChatRenderer(build_tokenizer(), cache_entries=3)
    questions = [[{"role": "user", "content": f"question {k}"}] for k in range(5)]
    for question in [*questions[:3], questions[0], questions[3], questions[4]]:  # 1 then 2 are evicted
        renderer.render_full(question)
    assert renderer.statistics().cache_entries == 3
    hits = renderer.statistics().cache_hits
    for question in [questions[0], questions[3], questions[4]]:
        renderer.render_full(question)
    assert renderer.statistics().cache_hits == hits + 3
    renderer.render_full(questions[1])
    assert renderer.statistics().cache_hits == hits + 3
    assert renderer.statistics().cache_entries == 3


def test_render_cache_stays_within_its_token_budget() -> None:
    questions = [[{"role": "user", "content": f"question {k}"}] for k in range(5)]
    size = len(ChatRenderer(build_tokenizer(), cache_entries=0).render_full(questions[0]))
    renderer = ChatRenderer(build_tokenizer(), cache_tokens=2 * size + 1)
    for question in questions:
        renderer.render_full(question)
    assert (renderer.statistics().cache_entries, renderer.statistics().cache_tokens) == (2, 2 * size)
    long = [{"role": "user", "content": "x" * 3 * size}]
    assert renderer.render_full(long) == wrapper_ids(renderer, long, None)
    assert (renderer.statistics().cache_entries, renderer.statistics().cache_tokens) == (2, 2 * size)


def test_named_templates_pick_tool_use_when_tools_are_given() -> None:
    tokenizer = build_tokenizer()
    tool_use = tokenizer.chat_template.replace("# Tools", "# Tool use")
    tokenizer.chat_template = {"default": tokenizer.chat_template, "tool_use": tool_use}
    renderer = ChatRenderer(tokenizer)
    for tools in (None, [], TOOLS):
        assert renderer.render_full(CONVERSATION, tools) == wrapper_ids(renderer, CONVERSATION, tools)
    assert renderer.statistics().slow_renders == 0


def test_extension_after_tools_in_another_key_order() -> None:
    renderer = ChatRenderer(build_tokenizer())
    reordered = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    reply = {"role": "assistant", "content": "", "tool_calls": [call("a")]}
    extension(renderer, [tool("a", "x")], TOOLS)
    assert_tito(renderer, [SYSTEM, USER], reply, [tool("a", "x")], reordered)
