"""A forced tool call (``tool_choice`` required or named) is written in the model family's own syntax: the grammar
accepts what each family's model writes for a call to an offered function, and nothing else; families whose markers
are special tokens (which a grammar cannot write) get a 400 that says so."""

from __future__ import annotations

from typing import Any

import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string

from gyre.router.constraints import constraint
from gyre.router.openai_types import ChatRequest, RouterError
from gyre.router.render import ChatRenderer
from model_families import FAMILIES, family_tokenizer, reply_text

TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "bash", "description": "Run.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
FORCED = sorted(set(FAMILIES) - {"gpt-oss", "mistral"})


def _request(choice: Any) -> ChatRequest:
    return ChatRequest(
        model="", messages=[{"role": "user", "content": "go"}], tools=TOOLS, tool_choice=choice
    )


@pytest.mark.parametrize("family", FORCED)
def test_the_grammar_accepts_the_familys_own_call_and_the_router_reads_it(family: str) -> None:
    renderer = ChatRenderer(family_tokenizer(family))
    grammar = xgrammar.Grammar.from_ebnf(constraint(_request("required"), renderer.format.name)["ebnf"],
                                         root_rule_name="root")  # fmt: skip
    call = reply_text(family, calls=[("get_weather", {"city": "Zürich", "days": 3})], end=False).strip()
    assert _is_grammar_accept_string(grammar, call)
    unoffered = reply_text(family, calls=[("rm_rf", {"path": "/"})], end=False).strip()
    assert not _is_grammar_accept_string(grammar, unoffered)
    assert not _is_grammar_accept_string(grammar, "I would rather not.")
    named = xgrammar.Grammar.from_ebnf(
        constraint(_request({"type": "function", "function": {"name": "bash"}}), renderer.format.name)[
            "ebnf"
        ],
        root_rule_name="root",
    )
    assert not _is_grammar_accept_string(named, call)
    # what the grammar wrote is read back as the call, its markers spelt in any tokens
    ids = [i for char in call for i in renderer._text_encoder(char)]
    parser = renderer.reply_parser([], TOOLS, loose=True)
    parser.feed(renderer.marked_reply(ids))
    parser.finish()
    [parsed] = parser.result().tool_calls
    assert parsed["function"]["name"] == "get_weather"


@pytest.mark.parametrize("family", ["gpt-oss", "mistral"])
def test_a_family_whose_markers_are_special_tokens_gets_a_clear_400(family: str) -> None:
    with pytest.raises(RouterError, match="special tokens") as error:
        constraint(_request("required"), ChatRenderer(family_tokenizer(family)).format.name)
    assert error.value.status == 400
