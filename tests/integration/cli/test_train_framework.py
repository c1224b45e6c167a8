"""`gyre train` with a langgraph agent as the suite's agent: ``run.agent = "python:FILE.py:ATTR"``, no glue code.

The agent is a user's langgraph graph (two model nodes: a draft, then a revision) on langchain-openai's ChatOpenAI,
pointed at its execution's router session. Its calls are recorded, the second extending the first token-exactly
(one growing conversation: a tree), and the steps train on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

# healthy cells and satellite: 30 s silence timeouts (robust.py), not the shipped 5 s a loaded machine exceeds
CONFIG = f"""
[trajectory]
skip_zero_advantage = false  # the untrained tiny model's groups often score alike: train them anyway

[run]
suite = "toy:8"
steps = 2
tasks_per_step = 2
group_size = 2
agent_max_calls = 2
agent_max_tokens = 16

[cells]
count = 2
capacity_executions = 2
engine_overrides = ["engine.kv_cache_mem_gib=0.2"]
num_threads = 1

[trainer]
learning_rate = 1e-4
heartbeat_s = 0.25
{TRAINER_TOML}

[controller]
heartbeat_s = 0.25
{CONTROLLER_TOML}
"""

# A user's own langgraph agent: a draft, then a revision of it, each a call of the served model.
AGENT = """
import httpx
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph


async def agent(ctx):
    async with httpx.AsyncClient() as http:
        model = ChatOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, model=ctx.model, max_retries=0,
                           temperature=ctx.temperature, max_tokens=ctx.max_tokens, http_async_client=http)

        async def draft(state):
            return {"messages": [await model.ainvoke(state["messages"])]}

        async def revise(state):
            messages = [*state["messages"], HumanMessage("Go on.")]
            return {"messages": [HumanMessage("Go on."), await model.ainvoke(messages)]}

        graph = StateGraph(MessagesState)
        graph.add_node("draft", draft)
        graph.add_node("revise", revise)
        graph.add_edge(START, "draft")
        graph.add_edge("draft", "revise")
        state = await graph.compile().ainvoke({"messages": [HumanMessage(ctx.task)]})
    await ctx.write_file("answer.txt", state["messages"][-1].content)
    return state["messages"][-1].content
"""


@pytest.mark.slow(reason="gyre train with a langgraph agent in sandboxes: two cells, two steps")
def test_a_langgraph_agent_is_the_agent_of_a_gyre_train_run(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, agent, run_dir = tmp_path / "run.toml", tmp_path / "draft_agent.py", tmp_path / "run"
    config.write_text(CONFIG)
    agent.write_text(AGENT)
    argv = ["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir),
            "--set", f"run.agent={json.dumps(f'python:{agent}:agent')}"]  # fmt: skip
    assert main(argv) == 0
    assert "2 steps" in capsys.readouterr().out

    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == 8 and all(e.status == "done" for e in executions), [e.error for e in executions]
    assert all(e.agent is not None and e.agent.status == "finished" for e in executions)
    assert all(len(e.records) == 2 for e in executions)
    assert all(e.records[1].parent_call_id == e.records[0].call_id for e in executions)  # one growing session
    assert all(r.source == "policy" and r.output_logprobs for e in executions for r in e.records)
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert all(
        s.trainer.micro_steps > 0 and s.trainer.tokens > 0 and len(s.execution_ids) == 4 for s in steps
    )
    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.steps == 2 and summary.failed_executions == 0
    # the run's limits reached the agent: its calls asked for run.agent_max_tokens at most
    assert all(len(r.output_ids) <= 16 for e in executions for r in e.records)
