"""A real external scaffold, mini-swe-agent from PyPI, solving a task through the router as a ``command`` agent.

mini-swe-agent runs inside the execution's sandbox with its own local environment (its commands run there too) and
talks to its router session through litellm's OpenAI provider. A scripted model at the engine edge stands in for a
capable one; every call it answers must appear in the journal token for token.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.routing import Router
from gyre.runtime import CommandAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import Task

pytestmark = [
    pytest.mark.slow(reason="mini-swe-agent, an outside scaffold, solves a task through the router"),
    pytest.mark.skipif(  # found, not imported: importing it makes ~/.config/mini-swe-agent
        importlib.util.find_spec("minisweagent") is None,
        reason="mini-swe-agent is in the dev extra: pip install -e '.[dev]'",
    ),
]

# `mini` (mini.yaml: tool calls) without a terminal: no first-run setup, no confirmations, no prompt at the end.
MINI = '"$0" -m minisweagent -y --exit-immediately -c mini.yaml -m "openai/$OPENAI_MODEL" -t "$GYRE_TASK" -o traj.json'
MINI_ENV = {
    "MSWEA_CONFIGURED": "true",  # skip the interactive first-run setup
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",  # litellm has no price for the served model
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",  # a failed call fails the run, not minutes of back-off
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price map at import (there is no network)
}
# How mini-swe-agent itself says the run ended, read from the trajectory it saved.
EXIT_STATUS = (
    """"$0" -c 'import json; print("exit status:", json.load(open("traj.json"))["info"]["exit_status"])'"""
)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's completion command (mini.yaml)


def bash(thought: str, command: str) -> str:
    """A reply with reasoning text and one Hermes call of mini-swe-agent's ``bash`` tool."""
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"{thought}\n<tool_call>\n{call}\n</tool_call>"


STEPS = [
    bash("I will write the script.", "printf 'print(\"the answer is\", 6 * 7)\\n' > hello.py"),
    bash("Now I run it.", "python3 hello.py"),
    bash("It works, so I submit.", SUBMIT),
]


def run(tiny_model: Path, engine_url: str, spec: ExecutionSpec, journal: Path) -> ExecutionResult:
    async def go() -> ExecutionResult:
        router = Router(
            RouterConfig(model_path=str(tiny_model), engines=[engine_url], journal_dir=str(journal))
        )
        runtime = Runtime(router, SandboxConfig(), journal_dir=str(journal))
        try:
            (result,) = await runtime.run([spec])
            return result
        finally:
            await runtime.aclose()
            await router.aclose()

    return asyncio.run(go())


def test_mini_swe_agent_solves_a_task_through_the_router(tiny_model: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies: list[str] = []

    def script(ids: list[int]) -> str:  # step k once the conversation holds k tool results
        reply = STEPS[min(tokenizer.decode(ids).count("<tool_response>"), len(STEPS) - 1)]
        replies.append(reply)
        return reply

    task = Task(id="mini", instruction="Write hello.py printing the answer to 6 * 7, and run it.")
    agent = CommandAgentSpec(argv=["bash", "-c", f"{MINI} && {EXIT_STATUS}", sys.executable], env=MINI_ENV)
    journal = tmp_path / "journal"
    with ScriptedEngine(tokenizer, script) as fake:
        result = run(tiny_model, fake.url, ExecutionSpec(task=task, agent=agent), journal)

    assert result.status == "done" and result.agent is not None, result.error
    assert result.agent.status == "finished", result.agent.detail
    assert "exit status: Submitted" in result.agent.detail  # it ran the completion command, not out of steps
    records = result.records
    assert len(records) == len(fake.requests) == len(STEPS)  # one call per step, the last one submits
    first_prompt = tokenizer.decode(fake.requests[0]["input_ids"])
    assert task.instruction in first_prompt and "Execute a bash command" in first_prompt  # and its bash tool
    assert "the answer is 42" in tokenizer.decode(records[2].new_input_ids)  # what running hello.py printed

    # Token-exact: the inputs rebuilt from the deltas are what the engine received, the outputs what it sampled.
    inputs = expand_inputs(records)
    assert [inputs[r.call_id] for r in records] == [req["input_ids"] for req in fake.requests]
    assert [r.output_ids for r in records] == [
        tokenizer.encode(reply, add_special_tokens=False) + [eos] for reply in replies
    ]
    # mini-swe-agent sends the whole conversation each time; each call extends the one before.
    assert [r.parent_call_id for r in records] == [None] + [r.call_id for r in records[:-1]]
    assert list(read_journal(journal / "calls.jsonl", CallRecord)) == records
    assert list(read_journal(journal / "executions.jsonl", ExecutionResult)) == [result]
