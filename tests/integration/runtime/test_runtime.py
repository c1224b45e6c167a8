"""The runtime: built-in agents in real sandboxes, talking to a scripted model through the real router."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import ScriptedEngine
from gyre.agents.toolagent import SUMMARY_REQUEST, BuiltinAgentConfig
from gyre.config import RouterConfig, SandboxConfig
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.router.routing import Router
from gyre.runtime import BuiltinAgentSpec, CommandAgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks import Task, TaskLimits


def call(name: str, **arguments: Any) -> str:
    """A Hermes tool call as the model would write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def stepwise(
    tokenizer: Any, steps: list[str], summary: str = "summary: keep going"
) -> Callable[[list[int]], str]:
    """A model that plays ``steps`` in order: step k once the conversation holds k tool results."""

    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        if _is_summary_request(text):
            return summary
        done = text.count("<tool_response>")
        return steps[min(done, len(steps) - 1)]

    return script


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return load_tokenizer(tiny_model)


def run(
    tiny_model: Path,
    engine_url: str,
    specs: list[ExecutionSpec],
    journal: Path,
    cancel_after_s: float | None = None,
) -> tuple[list[ExecutionResult], Router]:
    async def go() -> tuple[list[ExecutionResult], Router]:
        router = Router(
            RouterConfig(model_path=str(tiny_model), engines=[engine_url], journal_dir=str(journal))
        )
        runtime = Runtime(router, SandboxConfig(), journal_dir=str(journal))
        try:
            if cancel_after_s is None:
                return await runtime.run(specs), router
            task = asyncio.ensure_future(runtime.run(specs))
            await asyncio.sleep(cancel_after_s)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return [], router
        finally:
            await runtime.aclose()
            await router.aclose()

    return asyncio.run(go())


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "journal"


def test_builtin_agent_solves_a_scripted_task(tiny_model: Path, tokenizer: Any, journal: Path) -> None:
    steps = [
        call("write_file", path="notes/hello.txt", content="hello from the agent"),
        call("bash", command="cat notes/hello.txt && ls"),
        call("edit", path="notes/hello.txt", old="agent", new="sandbox"),
        call("read_file", path="notes/hello.txt"),
        call("submit", answer="done"),
    ]
    task = Task(id="hello", instruction="write a file", files={"README.md": "# start"})
    with ScriptedEngine(tokenizer, stepwise(tokenizer, steps)) as fake:
        (result,), _ = run(tiny_model, fake.url, [ExecutionSpec(task=task)], journal)
    assert result.status == "done" and result.agent is not None
    assert result.agent.status == "submitted" and result.agent.answer == "done" and result.agent.steps == 5
    assert len(result.records) == 5
    assert [r.parent_call_id for r in result.records[1:]] == [r.call_id for r in result.records[:-1]]
    prompt = tokenizer.decode(result.records[-1].new_input_ids)
    assert "hello from the sandbox" in prompt  # the read_file result the model saw last
    bash_output = tokenizer.decode(result.records[2].new_input_ids)
    assert "hello from the agent" in bash_output and "README.md" in bash_output
    (journaled,) = read_journal(journal / "executions.jsonl", ExecutionResult)
    assert journaled == result


def test_a_tasks_turn_limit_binds_whatever_the_caller_allows(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    """`gyre train` gives the agent ``run.agent_max_calls``; a task that allows fewer turns stops it there (as in
    `gyre eval`), so training and evaluation score the same task alike."""
    task = Task(id="short", instruction="never done", limits=TaskLimits(max_turns=3))
    generous = BuiltinAgentSpec(config=BuiltinAgentConfig(max_steps=16))
    with ScriptedEngine(tokenizer, stepwise(tokenizer, [call("bash", command="echo again")])) as fake:
        (result,), _ = run(tiny_model, fake.url, [ExecutionSpec(task=task, agent=generous)], journal)
    assert result.agent is not None and result.agent.status == "step_limit"
    assert len(result.records) == 3


def test_one_crash_one_timeout_and_the_others_finish(tiny_model: Path, tokenizer: Any, journal: Path) -> None:
    quick = [call("bash", command="echo ok"), call("submit", answer="fine")]
    slow = [call("bash", command="sleep 30"), call("submit", answer="never")]
    good = Task(id="good", instruction="quick")
    broken = Task(id="broken", instruction="bad files", files={"../escape.txt": "x"})  # outside the workspace
    hung = Task(id="hung", instruction="slow", time_budget_s=1.5)

    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        steps = slow if "slow" in text else quick
        return steps[min(text.count("<tool_response>"), 1)]

    specs = [ExecutionSpec(task=good, group_index=i) for i in range(3)]
    specs += [ExecutionSpec(task=broken), ExecutionSpec(task=hung)]
    with ScriptedEngine(tokenizer, script) as fake:
        results, _ = run(tiny_model, fake.url, specs, journal)
    by_task = {r.task_id: r for r in results}
    assert [r.status for r in results[:3]] == ["done"] * 3
    assert by_task["broken"].status == "crashed" and "escape" in (by_task["broken"].error or "")
    # the budget's timeout cut the agent in its `sleep 30` (its seconds are not asserted: a loaded machine is slow)
    assert by_task["hung"].status == "budget_exceeded" and by_task["hung"].agent is None
    assert len(list(read_journal(journal / "executions.jsonl", ExecutionResult))) == 5


def test_cancelling_the_runtime_cancels_every_execution(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    steps = [call("bash", command="sleep 60")]
    specs = [ExecutionSpec(task=Task(id=f"t{i}", instruction="wait")) for i in range(4)]
    with ScriptedEngine(tokenizer, stepwise(tokenizer, steps)) as fake:
        run(tiny_model, fake.url, specs, journal, cancel_after_s=1.5)
    results = list(read_journal(journal / "executions.jsonl", ExecutionResult))
    assert sorted(r.status for r in results) == ["cancelled"] * 4


def _is_summary_request(text: str) -> bool:
    return text.rstrip().endswith(SUMMARY_REQUEST + "<|im_end|>\n<|im_start|>assistant")


def test_compaction_starts_a_new_branch_from_a_summary(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        if _is_summary_request(text):
            return "I listed the files."
        return call("submit", answer="ok") if "Your progress so far" in text else call("bash", command="ls")

    config = BuiltinAgentConfig(context_budget_tokens=10)  # every context is over budget after one step
    task = Task(id="compact", instruction="list the files", files={"a": "1"})
    spec = ExecutionSpec(task=task, agent=BuiltinAgentSpec(config=config))
    with ScriptedEngine(tokenizer, script) as fake:
        (result,), _ = run(tiny_model, fake.url, [spec], journal)
    assert result.status == "done" and result.agent is not None and result.agent.answer == "ok"
    assert result.agent.compactions == 1
    first, summary, fresh = result.records
    assert (first.role, summary.role, fresh.role) == ("main", "main-summary", "main")
    assert summary.parent_call_id == first.call_id  # the summary request extends the context it summarises
    assert fresh.parent_call_id is None  # the fresh context is a new branch
    assert "I listed the files." in tokenizer.decode(fresh.new_input_ids)


def test_delegation_runs_a_sub_agent_with_its_own_context(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        if "count the files" in text.split("<|im_start|>user")[1]:  # the sub-agent's own context
            return (
                call("submit", answer="2 files")
                if "<tool_response>" in text
                else call("bash", command="ls | wc -l")
            )
        return (
            call("submit", answer="ok")
            if "<tool_response>" in text
            else call("delegate", task="count the files")
        )

    task = Task(id="delegate", instruction="find out how many files there are", files={"a": "1", "b": "2"})
    with ScriptedEngine(tokenizer, script) as fake:
        (result,), _ = run(tiny_model, fake.url, [ExecutionSpec(task=task)], journal)
    assert result.status == "done" and result.agent is not None and result.agent.sub_agents == 1
    assert [r.role for r in result.records] == ["main", "sub-agent", "sub-agent", "main"]
    main1, sub1, sub2, main2 = result.records
    assert sub1.parent_call_id is None and sub2.parent_call_id == sub1.call_id
    assert main2.parent_call_id == main1.call_id
    assert "2 files" in tokenizer.decode(
        main2.new_input_ids
    )  # the helper's answer came back as the tool result
    assert "2" in tokenizer.decode(sub2.new_input_ids)  # wc -l ran in the same sandbox


def test_command_agent_reaches_only_its_session_from_inside_the_sandbox(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    script = r"""
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": os.environ["GYRE_TASK"]}]}
req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                             {"content-type": "application/json"})
reply = json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"]
open("answer.txt", "w").write(reply)
routes = open("/proc/net/route").read().splitlines()[1:]  # no route: no traffic can leave (never probed)
interfaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
print("no network" if not routes and interfaces == ["lo"] else f"NETWORK OPEN {routes} {interfaces}")
print(open("answer.txt").read())
"""
    task = Task(id="cmd", instruction="say something", files={"agent.py": script})
    spec = ExecutionSpec(task=task, agent=CommandAgentSpec(argv=["python3", "agent.py"], python_env=False))
    with ScriptedEngine(tokenizer, lambda ids: "hello from the model") as fake:
        (result,), _ = run(tiny_model, fake.url, [spec], journal)
    assert result.status == "done" and result.agent is not None, result.error
    assert result.agent.status == "finished", result.agent.detail
    assert "no network" in result.agent.detail and "hello from the model" in result.agent.detail
    assert len(result.records) == 1 and result.records[0].session == result.execution_id


def test_a_task_description_longer_than_the_context_is_cut_to_fit_not_a_crash(
    tiny_model: Path, tokenizer: Any, journal: Path
) -> None:
    """Issue 32: a 77k-token NL2RepoBench spec crashed the built-in agent (the router's 413 raised through it)."""
    statement = "Write 42 to answer.txt."
    spec = statement + "\n" + "the library's behaviour in detail. " * 40_000 + "\nThe last line of the spec."
    task = Task(id="long-spec", instruction=spec)
    steps = [call("submit", answer="done")]
    with ScriptedEngine(tokenizer, stepwise(tokenizer, steps)) as fake:
        (result,), _ = run(tiny_model, fake.url, [ExecutionSpec(task=task)], journal)
    assert result.status == "done" and result.agent is not None, result.error
    assert result.agent.status == "submitted", result.agent
    (record,) = result.records
    prompt = tokenizer.decode(record.new_input_ids)
    assert statement in prompt and "The last line of the spec." in prompt
    assert "cut here to fit the model's context" in prompt
    assert len(record.new_input_ids) < 32_768
