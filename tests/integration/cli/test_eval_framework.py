"""`gyre eval --agent python:gyre.agents.frameworks:NAME`: each framework's ready-made agent over a suite, no glue.

A scripted model that never submits (it runs ``ls`` every turn) shows the run's ``--max-steps`` reaching each
framework's own step limit: every execution makes exactly that many calls and ends ``step_limit``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from gyre.cli import main
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult

LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.mark.parametrize("framework", ["openai_agents", "langgraph", "smolagents"])
def test_gyre_eval_runs_a_framework_agent_within_the_runs_step_limit(
    framework: str, tiny_model: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with ScriptedEngine(load_tokenizer(tiny_model), lambda ids: LS) as fake:
        code = main(["eval", "--suite", "toy:2", "--agent", f"python:gyre.agents.frameworks:{framework}",
                     "--engine-url", fake.url, "--model-path", str(tiny_model), "--run-dir", str(run_dir),
                     "--max-steps", "3", "--no-progress"])  # fmt: skip
    assert code in (0, 1)  # 1: the scores are not clean (the scripted model solves nothing); it ran
    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == 2 and all(e.status == "done" for e in executions), [e.error for e in executions]
    assert all(e.agent is not None and e.agent.status == "step_limit" for e in executions), [
        e.agent for e in executions
    ]
    assert all(len(e.records) == 3 for e in executions)  # --max-steps, as the framework counts its own
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["agent"] == f"python:gyre.agents.frameworks:{framework}" and summary["executions"] == 2
