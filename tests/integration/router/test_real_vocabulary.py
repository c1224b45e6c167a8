"""The router on real BPE vocabularies (`real_vocab`): Qwen3's and DeepSeek's, with their families' real templates.

A byte-level test tokenizer has one tokenization per text; a real vocabulary has many, and a sampling model need
not produce the canonical one. A scripted engine runs a tool loop whose replies hold multi-byte text split across
tokens ("Zürich 🌦️"); once in the canonical ids, once in other ids that decode to the same text (each run of text
between markers cut inside and before its last character, the turn's end among them). Every later call must extend
the exact ids the engine produced, never a re-tokenization of their text; a record must say where the template's
own render of a reply is other ids ("tokenization") or drops its reasoning ("reasoning"); a streamed reply must
parse to what the whole one does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.openai_types import ChatRequest
from gyre.router.render import ChatRenderer
from gyre.router.routing import Router
from model_families import FAMILIES, reply_text
from real_vocab import VOCABULARIES, real_tokenizer

TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
# thinking on; DeepSeek-V3.1 thinks only where its generation prompt opens <think> (after a user turn)
THINKS: dict[str, Any] = {"qwen3": None, "deepseekv31": {"thinking": True}}
STEPS = 3  # calls before the first answer
# the records whose parent reply the template writes without its reasoning: Qwen3 drops it from turns before the
# last user message (the answer before "once more"), V3.1 from every turn (those that thought follow a user turn)
REASONING_DROPPED = {"qwen3": {STEPS + 1}, "deepseekv31": {1, STEPS + 2}}


def _content(step: int) -> str:
    return f"Step {step} in Zürich 🌦️: running it."


def _command(step: int) -> str:
    return f"echo {step} °C ☂️ naïve"


def script(family: str, tokenizer: Any) -> Any:
    """The model's replies: STEPS calls (one per tool result seen), an answer; after "once more", a call and an
    answer. Each reasons where its family thinks: Qwen3 always, V3.1 after a user turn."""

    def reply(ids: list[int]) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        results = text.count("RESULT#")
        thinking: str | None = f"Step {results}: the weather in Zürich is 🌦️, run it."
        if family == "deepseekv31" and not text.endswith("<think>"):
            thinking = None
        again = "once more" in text
        if results < STEPS or (again and results == STEPS):
            return reply_text(family, reasoning=thinking, content=_content(results),
                              calls=[("bash", {"command": _command(results)})])  # fmt: skip
        return reply_text(family, reasoning=thinking, content="Done again ✅." if again else "All done ✅.")

    return reply


class ReplyIds:
    """The tokenizer a scripted engine encodes its replies with: notes each reply's ids, and with ``off_canonical``
    encodes the text in pieces, each run of text between single-token markers cut in its middle and before its last
    character: ids that decode to the text, but not ``encode(text)``'s (as a sampling model's often are)."""

    def __init__(self, tokenizer: Any, off_canonical: bool) -> None:
        self.tokenizer, self.off_canonical = tokenizer, off_canonical
        markers = sorted((t.content for t in tokenizer.added_tokens_decoder.values()), key=len, reverse=True)
        self._markers = re.compile("(" + "|".join(map(re.escape, markers)) + ")")
        self.replies: list[tuple[str, list[int]]] = []  # (text, ids) of each reply, in order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        pieces = [text]
        if self.off_canonical:
            pieces = []
            for i, run in enumerate(self._markers.split(text)):
                middle = len(run) // 2
                pieces += [run] if i % 2 or len(run) < 3 else [run[:middle], run[middle:-1], run[-1]]
        ids = [t for p in pieces for t in self.tokenizer.encode(p, add_special_tokens=add_special_tokens)]
        self.replies.append((text, ids))
        return ids


@dataclass
class Run:
    """One execution's calls: what the client got back and what the router recorded."""

    replies: list[dict[str, Any]]  # the assistant messages, as the client saw them
    records: list[CallRecord]
    sent: list[list[int]]  # the input ids the engine was sent, call by call
    produced: list[tuple[str, list[int]]]  # each reply's text and the ids the engine produced for it


@pytest.fixture(scope="module", params=sorted(VOCABULARIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def runs(family: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[bool, bool], Run]:
    """``runs(stream, off_canonical)``: the family's tool loop run so, once per module."""
    renderer = ChatRenderer(
        real_tokenizer(family)
    )  # shared: the router calls it from one event loop at a time
    done: dict[tuple[bool, bool], Run] = {}

    def run(stream: bool, off_canonical: bool) -> Run:
        if (stream, off_canonical) not in done:
            journal = tmp_path_factory.mktemp("journal")
            done[stream, off_canonical] = _run(family, renderer, journal, stream, off_canonical)
        return done[stream, off_canonical]

    return run


def _run(family: str, renderer: ChatRenderer, journal: Path, stream: bool, off_canonical: bool) -> Run:
    """A tool loop through an in-process router: STEPS calls, an answer, "once more", a call and an answer."""
    tokenizer = real_tokenizer(family)
    ids = ReplyIds(tokenizer, off_canonical)
    with ScriptedEngine(ids, script(family, tokenizer), stops=FAMILIES[family].stops) as engine:
        router = Router(RouterConfig(engines=[engine.url], journal_dir=str(journal)), renderer=renderer)

        async def conversation() -> list[dict[str, Any]]:
            try:
                return await _conversation(router, family, stream)
            finally:
                await router.aclose()

        replies = asyncio.run(conversation())
    [session] = router.sessions._sessions.values()
    return Run(replies, list(session.records), [r["input_ids"] for r in engine.requests], ids.replies)


async def _conversation(router: Router, family: str, stream: bool) -> list[dict[str, Any]]:
    token = router.open_session(f"{family}-{'stream' if stream else 'whole'}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You run commands."},
                                      {"role": "user", "content": "Run the steps."}]  # fmt: skip
    replies: list[dict[str, Any]] = []
    for turn in range(STEPS + 3):
        req = ChatRequest(model="", messages=list(messages), tools=TOOLS, stream=stream,
                          chat_template_kwargs=THINKS[family])  # fmt: skip
        if stream:
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
            reasoning = ""
            async for chunk in router.chat_stream(token, req):
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    message["content"] += delta.get("content") or ""
                    reasoning += delta.get("reasoning_content") or ""
                    message["tool_calls"] += delta.get("tool_calls") or []
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "index"} for c in message["tool_calls"]
            ]
            if reasoning:
                message["reasoning_content"] = reasoning
            if not message["tool_calls"]:
                del message["tool_calls"]
        else:
            message = (await router.chat(token, req))["choices"][0]["message"]
        replies.append(message)
        echoed = dict(message)
        if turn % 2:  # half the turns the client drops the reasoning it got: the call must chain all the same
            echoed.pop("reasoning_content", None)
        messages.append(echoed)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"RESULT#{turn}"})
        if not message.get("tool_calls"):
            if turn > STEPS:
                break
            messages.append({"role": "user", "content": "Now once more."})
    return replies


def _parsed(replies: list[dict[str, Any]]) -> list[tuple[str, str | None, list[tuple[str, Any]]]]:
    """Each reply's content, reasoning and calls (name, arguments), as a client reads them."""
    return [
        (r.get("content") or "", r.get("reasoning_content"),
         [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r.get("tool_calls") or []])
        for r in replies
    ]  # fmt: skip


def _expected(family: str) -> list[tuple[str, str | None, list[tuple[str, Any]]]]:
    """What the client must read from the script's replies."""
    seen = [*range(STEPS + 1), STEPS, STEPS + 1]  # the tool results each reply's call had seen
    thinks = {0, STEPS + 1} if family == "deepseekv31" else set(range(len(seen)))  # V3.1: after a user turn
    contents = [*map(_content, range(STEPS)), "All done ✅.", _content(STEPS), "Done again ✅."]
    calls = [*([("bash", {"command": _command(s)})] for s in range(STEPS)), [],
             [("bash", {"command": _command(STEPS)})], []]  # fmt: skip
    return [
        (content, f"Step {n}: the weather in Zürich is 🌦️, run it." if i in thinks else None, call)
        for i, (n, content, call) in enumerate(zip(seen, contents, calls, strict=True))
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("off_canonical", [False, True], ids=["canonical", "off-canonical"])
def test_a_tool_loop_chains_to_the_ids_the_engine_produced(
    family: str, runs: Callable[[bool, bool], Run], stream: bool, off_canonical: bool
) -> None:
    run = runs(stream, off_canonical)
    tokenizer = real_tokenizer(family)
    for text, ids in run.produced:  # the engine's ids are the reply's text; off canonical, not encode(text)'s
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert (ids == tokenizer.encode(text, add_special_tokens=False)) is not off_canonical
    assert _parsed(run.replies) == _expected(family)
    # every later call extends the one before with the ids the engine produced, not a re-tokenization of their text
    records = run.records
    assert records[0].parent_call_id is None
    expanded = expand_inputs(records)
    for before, after in itertools.pairwise(records):
        assert after.parent_call_id == before.call_id, after.divergence
        assert after.prefix_len == len(expanded[before.call_id]) + len(before.output_ids)
        assert expanded[after.call_id][: after.prefix_len] == expanded[before.call_id] + before.output_ids
    # the records hold what the engine was sent and what it produced, id for id
    assert [expanded[r.call_id] for r in records] == run.sent
    assert [r.output_ids for r in records] == [ids for _, ids in run.produced]


@pytest.mark.parametrize("off_canonical", [False, True], ids=["canonical", "off-canonical"])
def test_a_record_says_how_the_template_writes_the_reply_before_it(
    family: str, runs: Callable[[bool, bool], Run], off_canonical: bool
) -> None:
    """Where the template's own render of the earlier reply is the same text in other ids, "tokenization" at the
    first id the engine split otherwise; where it drops the reasoning, "reasoning"; where it is the engine's ids,
    nothing."""
    run = runs(False, off_canonical)
    same = "tokenization" if off_canonical else None
    dropped = REASONING_DROPPED[family]
    kinds = [r.divergence and r.divergence.kind for r in run.records]
    assert kinds == [None, *("reasoning" if i in dropped else same for i in range(1, len(kinds)))]
    tokenizer = real_tokenizer(family)
    expanded = expand_inputs(run.records)
    for (before, after), (text, ids) in zip(itertools.pairwise(run.records), run.produced, strict=False):
        if after.divergence is not None and after.divergence.kind == "tokenization":
            canonical = tokenizer.encode(text, add_special_tokens=False)
            split = next(i for i, (a, b) in enumerate(zip(ids, canonical, strict=False)) if a != b)
            assert after.divergence.index == len(expanded[before.call_id]) + split


@pytest.mark.parametrize("off_canonical", [False, True], ids=["canonical", "off-canonical"])
def test_a_streamed_reply_parses_as_the_whole_one(
    family: str, runs: Callable[[bool, bool], Run], off_canonical: bool
) -> None:
    """Multi-byte characters split across tokens ("🌦️" is four ids in Qwen3's vocabulary) stream to the same
    content, reasoning and calls as the whole reply."""
    whole, streamed = runs(False, off_canonical), runs(True, off_canonical)
    assert [r.output_ids for r in streamed.records] == [r.output_ids for r in whole.records]
    assert _parsed(streamed.replies) == _parsed(whole.replies) == _expected(family)
