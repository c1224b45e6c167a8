"""Every model family end to end through the router: a tool loop whose every later call chains to the one before.

Each family's real chat template and markers (`model_families`) and a scripted engine that writes each family's exact
replies, ending with its own terminator. An execution runs five tool calls, a final answer, a user turn after the
tools, one more call and an answer; the client echoes the reasoning on some turns and drops it on others. Every call
after the first must extend the call before it (or say, in its record, why its input differs from the template's
own render), and the records' expanded inputs must be, id for id, what the engine was sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig
from gyre.journal.records import expand_inputs
from gyre.router.openai_types import ChatRequest
from gyre.router.render import ChatRenderer
from gyre.router.routing import Router
from model_families import FAMILIES, family_tokenizer, reply_text

TOOLS: Any = [
    {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
]  # fmt: skip
THINKS = {"qwen3": None, "glm45": None, "deepseekv31": {"thinking": True}, "gpt-oss": None}
STEPS = 5


def script(family: str, tokenizer: Any) -> Any:
    """The model's replies: STEPS calls (one per tool result seen), an answer; after "once more", one call and an
    answer. Families that reason reason on every reply."""

    def reply(ids: list[int]) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        results = text.count("RESULT#")
        thinking = f"Step {results}: I should run it." if family in THINKS else None
        if family == "deepseekv31" and not text.endswith("<think>"):
            thinking = None  # V3.1 thinks only where its generation prompt opens <think>: after a user turn
        again = "once more" in text
        if results < STEPS or (again and results == STEPS):
            say = "" if family == "llama3" else f"Running step {results}."
            return reply_text(
                family, reasoning=thinking, content=say, calls=[("bash", {"command": f"echo {results}"})]
            )
        return reply_text(family, reasoning=thinking, content="Done again." if again else "All done.")

    return reply


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engine(family: str) -> Iterator[ScriptedEngine]:
    tokenizer = family_tokenizer(family)
    with ScriptedEngine(tokenizer, script(family, tokenizer), stops=FAMILIES[family].stops) as fake:
        yield fake


async def _conversation(router: Router, family: str, stream: bool) -> list[dict[str, Any]]:
    """One execution's calls through the router; the assistant messages it got back, as the client saw them."""
    token = router.open_session(f"{family}-{'stream' if stream else 'whole'}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You run commands."},
                                      {"role": "user", "content": "Run the steps."}]  # fmt: skip
    replies: list[dict[str, Any]] = []
    for turn in range(STEPS + 3):
        req = ChatRequest(model="", messages=list(messages), tools=TOOLS, stream=stream,
                          chat_template_kwargs=THINKS.get(family))  # fmt: skip
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
            if turn > STEPS + 1:
                break
            messages.append({"role": "user", "content": "Now once more."})
    return replies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_loop_chains_every_call_and_parses_every_reply(
    family: str, engine: ScriptedEngine, stream: bool, tmp_path: Path
) -> None:
    cfg = RouterConfig(engines=[engine.url], journal_dir=str(tmp_path / "journal"))
    router = Router(cfg, renderer=ChatRenderer(family_tokenizer(family)))
    sent_before = len(engine.requests)

    async def run() -> list[dict[str, Any]]:
        try:
            return await _conversation(router, family, stream)
        finally:
            await router.aclose()

    replies = asyncio.run(run())
    # every reply parsed: the calls with their arguments, the content without markers, the reasoning apart
    calls = [r for r in replies if r.get("tool_calls")]
    assert len(calls) == STEPS + 1 and len(replies) == STEPS + 3
    for i, reply in enumerate(calls):
        [call] = reply["tool_calls"]
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": f"echo {min(i, STEPS)}"}
        assert (reply.get("content") or "") == (
            "" if family == "llama3" else f"Running step {min(i, STEPS)}."
        )
    assert [r.get("content") for r in replies if not r.get("tool_calls")] == ["All done.", "Done again."]
    if family in THINKS:
        thought = [r for i, r in enumerate(replies) if family != "deepseekv31" or i in (0, STEPS + 1)]
        assert all(r["reasoning_content"].startswith("Step ") for r in thought)
    # every later call chains to the one before it; the engine was sent exactly what the records hold
    [session] = router.sessions._sessions.values()
    records = session.records
    assert records[0].parent_call_id is None
    for before, after in itertools.pairwise(records):
        assert after.parent_call_id == before.call_id, (family, after.divergence)
        assert after.divergence is None or after.divergence.kind != "unchained"
    expanded = expand_inputs(records)
    sent = [r["input_ids"] for r in engine.requests[sent_before:]]
    assert [expanded[r.call_id] for r in records] == sent
    # the template's own render differs only where the family rewrites history (reasoning, terminators)
    kinds = {r.divergence.kind for r in records if r.divergence is not None}
    assert kinds <= {"reasoning", "terminator", "render"}, kinds
