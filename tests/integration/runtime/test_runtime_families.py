"""The built-in agent works unchanged on every model family: each writes its calls its own way, the router reads
them, the agent runs them in a real sandbox, and every call of the execution chains to the one before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig, SandboxConfig
from gyre.router.render import ChatRenderer
from gyre.router.routing import Router
from gyre.runtime import ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import Task
from model_families import FAMILIES, family_tokenizer, reply_text

STEPS = [
    ("write_file", {"path": "notes/hello.txt", "content": "hello from the agent"}),
    ("bash", {"command": "cat notes/hello.txt"}),
    ("submit", {"answer": "done"}),
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_builtin_agent_solves_a_scripted_task_on_every_family(family: str, tmp_path: Path) -> None:
    tokenizer = family_tokenizer(family)
    made = iter(range(len(STEPS)))

    def script(ids: list[int]) -> str:  # one step per call, in order
        thinking = "I know what to do." if family in ("qwen3", "glm45", "gpt-oss") else None
        return reply_text(family, reasoning=thinking, calls=[STEPS[next(made)]])

    async def go(url: str) -> ExecutionResult:
        router = Router(RouterConfig(engines=[url], journal_dir=str(tmp_path / "journal")),
                        renderer=ChatRenderer(tokenizer))  # fmt: skip
        runtime = Runtime(router, SandboxConfig(), journal_dir=str(tmp_path / "journal"))
        try:
            task = Task(id="hello", instruction="write a file", files={"README.md": "# start"})
            (result,) = await runtime.run([ExecutionSpec(task=task)])
            return result
        finally:
            await runtime.aclose()
            await router.aclose()

    with ScriptedEngine(tokenizer, script, stops=FAMILIES[family].stops) as fake:
        result = asyncio.run(go(fake.url))
    assert result.status == "done" and result.agent is not None, result
    assert (result.agent.status, result.agent.answer, result.agent.steps) == ("submitted", "done", len(STEPS))
    assert [r.parent_call_id for r in result.records[1:]] == [r.call_id for r in result.records[:-1]]
    assert "hello from the agent" in tokenizer.decode(
        result.records[-1].new_input_ids
    )  # the bash output it saw
