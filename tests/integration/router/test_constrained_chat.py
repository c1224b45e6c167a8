"""Structured outputs and forced tool calls from a real model: the tiny model's random weights, the embedded engine's
grammar masks, the router's grammars, the official ``openai`` client and openai-agents' ``output_type``.

An untrained model writes noise; under a grammar its noise is valid JSON of the schema, or a tool call of an offered
function with arguments of its schema, every time, and the records keep the log-probabilities of the masked
distribution each token was drawn from.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec
import openai
import pydantic
import pytest

from gyre.engine.launcher import launch_embedded
from gyre.journal.records import CallRecord
from gyre.router.spawn import launch_router

SEEDS = range(4)
REPORT = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail", "skip"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "retry": {"type": "boolean"},
    },
    "required": ["verdict", "score", "retry"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "run_tests", "parameters": {
        "type": "object", "properties": {"suite": {"enum": ["unit", "integration"]}, "verbose": {"type": "boolean"}},
        "required": ["suite", "verbose"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "submit", "parameters": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def admin(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("logs")
    with launch_embedded(
        tiny_model, overrides=["engine.kv_cache_mem_gib=0.25"], log_path=logs / "engine.log"
    ) as eng:
        proc, url = launch_router(tiny_model, [eng.url], log_path=logs / "router.log")
        with proc:
            yield url


@pytest.fixture
def session(admin: str) -> Iterator[tuple[openai.OpenAI, str]]:
    s = httpx.post(admin + "/admin/sessions", json={}).json()
    with openai.OpenAI(base_url=s["base_url"], api_key="unused", max_retries=0) as client:
        yield client, s["base_url"]


def _records(base_url: str) -> list[CallRecord]:
    raw = httpx.get(base_url + "/gyre/records").content
    return msgspec.json.decode(raw, type=dict[str, list[CallRecord]])["records"]


def _matches_report(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"verdict", "score", "retry"}
        and value["verdict"] in ("pass", "fail", "skip")
        and type(value["score"]) is int
        and 0 <= value["score"] <= 100
        and type(value["retry"]) is bool
    )


def _ask(client: openai.OpenAI, seed: int, **kwargs: Any) -> Any:
    messages: Any = [{"role": "user", "content": "Did the build pass?"}]
    return client.chat.completions.create(
        model="tiny", messages=messages, temperature=1.0, seed=seed, max_tokens=200, **kwargs
    ).choices[0]


def test_an_untrained_model_answers_in_the_schema_every_time(session: tuple[openai.OpenAI, str]) -> None:
    client, base_url = session
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    for seed in SEEDS:
        choice = _ask(client, seed, response_format=fmt)
        assert choice.finish_reason == "stop" and _matches_report(json.loads(choice.message.content)), choice
    unconstrained = _ask(client, 0)
    with pytest.raises(ValueError):  # the same model without the grammar writes noise
        json.loads(unconstrained.message.content or "")
    # any object: the random model's keys and strings rarely end (a closing quote is one token of thousands), so an
    # answer cut at max_tokens is an object's beginning; one that ends is an object
    for seed in SEEDS:
        choice = _ask(client, seed, response_format={"type": "json_object"})
        content = choice.message.content.lstrip()
        assert content.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(content), dict)
    # the records keep the masked distribution's log-probabilities: where the grammar leaves one token, it is certain
    constrained = _records(base_url)[0]
    assert all(math.isfinite(lp) and lp <= 1e-6 for lp in constrained.output_logprobs)
    assert max(constrained.output_logprobs) > -1e-4  # forced tokens (the keys, the quotes)
    assert (
        max(_records(base_url)[len(SEEDS)].output_logprobs) < -1.0
    )  # unconstrained: the random model is unsure


def test_required_and_named_tool_choice_force_a_call_of_an_offered_function(
    session: tuple[openai.OpenAI, str],
) -> None:
    client, _ = session
    for seed in SEEDS:
        choice = _ask(client, seed, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0].function
        args = json.loads(call.arguments)
        assert (call.name, set(args)) in (("run_tests", {"suite", "verbose"}), ("submit", {"ok"}))
        named = _ask(
            client, seed, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "submit"}}
        )
        first = named.message.tool_calls[0].function
        assert (first.name, type(json.loads(first.arguments)["ok"])) == ("submit", bool)


class Report(pydantic.BaseModel):
    verdict: Literal["pass", "fail", "skip"]
    retry: bool


def test_openai_agents_output_type_gets_its_pydantic_object(session: tuple[openai.OpenAI, str]) -> None:
    """openai-agents with its chat-completions model: ``output_type`` becomes a strict json_schema response format."""
    import agents

    _, base_url = session
    agents.set_tracing_disabled(True)

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            agent = agents.Agent(
                name="reporter",
                instructions="Report on the build.",
                model=agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client),
                output_type=Report,
                model_settings=agents.ModelSettings(temperature=1.0, max_tokens=100),
            )
            return await agents.Runner.run(agent, "Did the build pass?")

    result = asyncio.run(run())
    assert isinstance(result.final_output, Report)
    [record] = _records(base_url)
    assert record.output_ids  # one call, recorded
