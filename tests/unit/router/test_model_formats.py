"""Every family's replies parsed from sampled ids, whole and streamed, with its real chat template and markers.

The tokenizers carry each family's single-token markers (`model_families`); the replies are the exact text each
family's model writes. A stream cut anywhere must add up to the whole parse, and never take back what it sent.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.router.modelfamilies import Delta
from gyre.router.modelfamilies.replyparser import MARK_OPEN
from gyre.router.render import ChatRenderer
from model_families import FAMILIES, family_tokenizer, reply_text

TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}},
]  # fmt: skip
# the families whose models reason, and the template kwargs that turn it on
REASONS = {"qwen3": {}, "glm45": {}, "deepseekv31": {"thinking": True}, "gpt-oss": {}}
ONE_CALL = {
    "gpt-oss",
    "llama3",
}  # one call per reply (the format ends the turn there, or the template refuses more)
CALLS = [("get_weather", {"city": "Zürich", "days": 3}), ("bash", {"command": "ls -la | head"})]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def renderer(family: str) -> ChatRenderer:
    return ChatRenderer(family_tokenizer(family))


def _prompt(renderer: ChatRenderer, family: str, reasoning: bool = False) -> list[int]:
    """The prompt of a first call, with the family's thinking on (where it has a switch) when ``reasoning``."""
    kwargs = REASONS.get(family) if reasoning else None
    return renderer.render_full([{"role": "user", "content": "Weather?"}], TOOLS, kwargs)


def _ids(renderer: ChatRenderer, family: str, **reply: Any) -> list[int]:
    return list(renderer._tokenizer.encode(reply_text(family, **reply), add_special_tokens=False))


def _calls(family: str) -> list[tuple[str, dict[str, Any]]]:
    return CALLS[:1] if family in ONE_CALL else CALLS


def _streamed(
    renderer: ChatRenderer, prompt: list[int], ids: list[int], cuts: list[int]
) -> tuple[list[Delta], Any]:
    """The deltas of ``ids`` fed in pieces cut at ``cuts`` (the terminator held back as the router holds it)."""
    decoder, parser = renderer.reply_decoder(), renderer.reply_parser(prompt, TOOLS)
    if ids and ids[-1] in renderer.format.terminator_ids:
        ids = ids[:-1]
    deltas: list[Delta] = []
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(ids)), len(ids)]
    for a, b in itertools.pairwise(bounds):
        deltas += parser.feed(decoder.feed(ids[a:b]))
    deltas += parser.feed(decoder.finish()) + parser.finish()
    return deltas, parser.result()


def test_each_template_is_detected_as_its_family(renderer: ChatRenderer, family: str) -> None:
    expected = {"qwen25": "hermes", "qwen3": "hermes"}.get(family, family)
    assert renderer.format.name == expected
    assert renderer.format.fmt.reasoning_parser is not None or family not in REASONS


def test_whole_reply_gives_content_reasoning_and_calls(renderer: ChatRenderer, family: str) -> None:
    reasoning = "The user wants weather. <b>Zürich</b> first." if family in REASONS else None
    content = "Checking the forecast." if family != "llama3" else ""
    ids = _ids(renderer, family, reasoning=reasoning, content=content, calls=_calls(family))
    parsed = renderer.parse_output(ids, TOOLS, _prompt(renderer, family, reasoning is not None))
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        (n, a) for n, a in _calls(family)
    ]
    assert parsed.content == content and not parsed.malformed
    assert parsed.reasoning == (reasoning or "")
    assert MARK_OPEN not in parsed.content + parsed.reasoning
    assert len({c["id"] for c in parsed.tool_calls}) == len(parsed.tool_calls)
    final = renderer.parse_output(_ids(renderer, family, reasoning=reasoning, content="Sunny, 21 °C."), TOOLS,
                                  _prompt(renderer, family, reasoning is not None))  # fmt: skip
    assert (final.content, final.tool_calls, final.reasoning) == ("Sunny, 21 °C.", [], reasoning or "")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_chunking_of_the_stream_adds_up_to_the_whole_parse(family: str, data: st.DataObject) -> None:
    renderer = ChatRenderer(family_tokenizer(family))  # hypothesis wants no function-scoped fixture
    reasoning = "Think: a <tool_call> here is only text." if family in REASONS else None
    content = "Sure — ünïcode 🌦️ ahead." if family != "llama3" else ""
    ids = _ids(renderer, family, reasoning=reasoning, content=content, calls=_calls(family))
    prompt = _prompt(renderer, family, reasoning is not None)
    whole = renderer.parse_output(ids, TOOLS, prompt)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    deltas, result = _streamed(renderer, prompt, ids, cuts)
    assert "".join(d.content for d in deltas) == whole.content == result.content
    assert "".join(d.reasoning for d in deltas) == whole.reasoning == result.reasoning
    streamed = [d.tool_call for d in deltas if d.tool_call is not None]
    assert [(c.name, json.loads(c.arguments)) for c in streamed] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole.tool_calls
    ]
    assert [c.openai() for c in streamed] == result.tool_calls


def test_a_malformed_call_is_reported_and_kept_in_the_content(renderer: ChatRenderer, family: str) -> None:
    good = reply_text(family, content="", calls=CALLS[:1], end=False)
    name = CALLS[0][0]
    broken = good.replace('"days"', '"days', 1) if '"days"' in good else good.replace(name, "", 1)
    if broken == good or family in (
        "qwen3_coder",
        "glm45",
    ):  # untyped XML values: break the structure instead
        broken = good.replace("</parameter>", "", 1).replace("</arg_value>", "", 1)
    ids = list(renderer._tokenizer.encode(broken, add_special_tokens=False))
    parsed = renderer.parse_output(ids, TOOLS, _prompt(renderer, family))
    assert parsed.tool_calls == [] and len(parsed.malformed) == 1
    assert "Zürich" in parsed.content  # nothing the model wrote is dropped


def test_a_reply_cut_mid_call_is_malformed_and_mid_reasoning_is_reasoning(
    renderer: ChatRenderer, family: str
) -> None:
    ids = _ids(renderer, family, content="", calls=CALLS[:1], end=False)
    cut = renderer.parse_output(ids[: len(ids) - 3], TOOLS, _prompt(renderer, family))
    assert cut.tool_calls == []
    if (
        family != "llama3" and family != "mistral"
    ):  # their blocks need no closing marker: a cut one is malformed JSON
        assert cut.malformed
    if family in REASONS:
        thinking = _ids(renderer, family, reasoning="Step one. Step two is long", content="x")
        at = len(renderer._tokenizer.encode(reply_text(family, reasoning="Step one.", content="", end=False)))
        partial = renderer.parse_output(thinking[: at - 2], TOOLS, _prompt(renderer, family, True))
        assert partial.content == "" and partial.tool_calls == [] and partial.reasoning.startswith("Step")


def test_a_marker_written_as_text_is_not_a_call(renderer: ChatRenderer, family: str) -> None:
    """The model spelling a family's tool marker out of ordinary tokens (say, echoing what a user typed) writes
    text: only the marker's own token opens a call."""
    text = reply_text(family, content="", calls=CALLS[:1], end=False)
    single = [m for m in FAMILIES[family].markers if m in text and len(m) > 1]
    if not single:
        pytest.skip(f"{family} writes its calls without a single-token marker")
    ids = [i for char in text for i in renderer._text_encoder(char)]  # every marker spelt out of byte tokens
    parsed = renderer.parse_output(ids, TOOLS, _prompt(renderer, family))
    assert parsed.tool_calls == []


def test_a_call_inside_reasoning_is_not_a_call(renderer: ChatRenderer, family: str) -> None:
    if family not in REASONS or family == "gpt-oss":
        pytest.skip(f"{family} has no reasoning block to hide a call in")
    call = reply_text(family, content="", calls=CALLS[:1], end=False)
    ids = _ids(renderer, family, reasoning=f"I could write {call} but I won't.", content="No call.")
    parsed = renderer.parse_output(ids, TOOLS, _prompt(renderer, family, True))
    assert parsed.tool_calls == [] and parsed.content == "No call." and "Zürich" in parsed.reasoning


def test_a_call_to_a_function_not_offered_stays_in_the_content(renderer: ChatRenderer, family: str) -> None:
    ids = _ids(renderer, family, content="", calls=[("rm_rf", {"path": "/"})])
    prompt = _prompt(renderer, family)
    parser = renderer.reply_parser(prompt, TOOLS, offered={"get_weather", "bash"})
    parser.feed(renderer.marked_reply(ids))
    parser.finish()
    parsed = parser.result()
    assert parsed.tool_calls == [] and len(parsed.unknown) == 1 and "rm_rf" in parsed.content


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_reply_parses_the_same_however_it_is_chunked(family: str, data: st.DataObject) -> None:
    """Random replies from the family's markers, pieces of its calls and plain text: never an error, and the deltas
    of any chunking add up to the whole parse (content, reasoning, calls, malformed blocks)."""
    renderer = ChatRenderer(family_tokenizer(family))
    call = reply_text(family, content="", calls=CALLS[:1], end=False)
    pieces = [*FAMILIES[family].markers, call, call[: len(call) // 2], call[len(call) // 2 :], '{"a": 1}', " ", "\n",
              "Zürich 🌦️", "<", "think>", "[", "to=functions.bash"]  # fmt: skip
    text = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=12)))
    ids = list(renderer._tokenizer.encode(text, add_special_tokens=False))
    prompt = _prompt(renderer, family, data.draw(st.booleans()))
    parser = renderer.reply_parser(prompt, TOOLS)
    parser.feed(renderer.marked_reply(ids))
    parser.finish()
    whole = parser.result()
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    deltas, result = _streamed(renderer, prompt, ids, cuts)
    assert "".join(d.content for d in deltas) == whole.content == result.content
    assert "".join(d.reasoning for d in deltas) == whole.reasoning == result.reasoning
    assert [c["function"] for c in result.tool_calls] == [c["function"] for c in whole.tool_calls]
    assert result.malformed == whole.malformed and result.unknown == whole.unknown
