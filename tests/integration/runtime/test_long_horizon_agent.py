"""The built-in agent on a long-horizon task (``gyre.tasks.long``) with a model that never calls a tool: it makes
every call it may, each answered with the environment's output, in one context the task keeps from compaction; the
same agent on a task that asks nothing still nudges with one line and compacts at its budget."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import msgspec

from fakes import ScriptedEngine
from gyre.agents.toolagent import NUDGE, BuiltinAgentConfig
from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.models import load_tokenizer
from gyre.router.routing import Router
from gyre.runtime import BuiltinAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import long


def run(model: Path, url: str, specs: list[ExecutionSpec]) -> list[ExecutionResult]:
    async def go() -> list[ExecutionResult]:
        router = Router(RouterConfig(model_path=str(model), engines=[url]))
        runtime = Runtime(router, SandboxConfig())
        try:
            return await runtime.run(specs)
        finally:
            await runtime.aclose()
            await router.aclose()

    return asyncio.run(go())


def test_a_model_that_calls_no_tool_still_grows_one_long_context(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    task = long.make_task(0, stages=3)
    plain = msgspec.structs.replace(task, id="plain", metadata={})
    config = BuiltinAgentConfig(max_steps=6, context_budget_tokens=10)  # over budget after every call
    specs = [ExecutionSpec(task=t, agent=BuiltinAgentSpec(config=config)) for t in (task, plain)]
    with ScriptedEngine(tokenizer, lambda ids: "hmm, let me think") as fake:
        long_run, plain_run = run(tiny_model, fake.url, specs)

    records = long_run.records
    assert long_run.agent is not None and long_run.agent.status == "step_limit"
    assert len(records) == 6 and long_run.agent.compactions == 0 and {r.role for r in records} == {"main"}
    assert all(r.parent_call_id == p.call_id for p, r in itertools.pairwise(records))  # one path
    start_log = str(task.files["logs/start"])
    for record in records[1:]:  # each call after the first sees the last stage's log (none run: start's) anew
        shown = tokenizer.decode(record.new_input_ids)
        assert NUDGE in shown and start_log.strip() in shown and len(record.new_input_ids) > 600
    assert long_run.verdict is not None and long_run.verdict.outcome == "scored" and long_run.reward == 0.0

    assert (
        plain_run.agent is not None and plain_run.agent.compactions > 0
    )  # the default: compacts at its budget
    nudged = [tokenizer.decode(r.new_input_ids) for r in plain_run.records if r.parent_call_id is not None]
    assert nudged and all("printed:" not in text for text in nudged)


def test_an_agent_capped_at_two_idle_calls_gives_up_at_the_second_and_is_scored(tiny_model: Path) -> None:
    """``max_idle_calls``: the first tool-less call is nudged, the second ends the execution (`gyre quickstart`'s
    untrained starting model stops there instead of spending every call on prose); it is graded as it stands."""
    tokenizer = load_tokenizer(tiny_model)
    task = msgspec.structs.replace(long.make_task(0, stages=3), id="plain", metadata={})
    capped = BuiltinAgentConfig(max_steps=6, max_idle_calls=2)
    specs = [ExecutionSpec(task=task, agent=BuiltinAgentSpec(config=capped))]
    with ScriptedEngine(tokenizer, lambda ids: "hmm, let me think") as fake:
        (result,) = run(tiny_model, fake.url, specs)
    assert result.agent is not None and result.agent.status == "gave_up", result.agent
    assert "2 calls in a row called no tool" in (result.agent.detail or "")
    assert len(result.records) == 2 and NUDGE in tokenizer.decode(result.records[1].new_input_ids)
    assert result.verdict is not None and result.verdict.outcome == "scored" and result.reward == 0.0
