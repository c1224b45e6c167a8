"""A memory hog in one execution's sandbox under a live `gyre train`: the sandbox kills it (and nothing outside it),
that execution ends ``resource_exceeded`` and scores 0 with the reason, trained on like any failure of the agent's
(issue 31: it used to leave training, so a policy learnt that breaking its sandbox is safer than failing), and every
other execution, the cells and the steps go on as if nothing happened."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.protocol import SwitchRecord
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

pytestmark = pytest.mark.slow(reason="a live gyre train with a memory hog killed in its sandbox")
# healthy cells and satellite: 30 s silence timeouts (robust.py), not the shipped 5 s a loaded machine exceeds
CONFIG = f"""
[trajectory]
# the untrained tiny model's groups often score alike (advantage 0, not computed by default): compute them, so
# every step has micro-steps to train
skip_zero_advantage = false

[run]
suite = "toy:8"
steps = 2
tasks_per_step = 2
group_size = 2

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

[sandbox]
memory_mib = 384
"""
# two calls through its router session on the official openai client; then execution 1 (step 0) allocates until killed
SCAFFOLD = """
import os, openai
client, messages = openai.OpenAI(), [{"role": "user", "content": os.environ["GYRE_TASK"]}]
for _ in range(2):
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, max_tokens=12)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                 {"role": "user", "content": "Go on."}]
if os.environ["GYRE_EXECUTION_ID"].startswith("e000001."):
    hog = []
    while True:
        hog.append(b"x" * (32 << 20))
"""


def test_a_memory_hog_is_killed_in_its_own_sandbox_and_only_its_execution_scores_0(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    agent = f"command:{shlex.join([sys.executable, '-c', SCAFFOLD])}"
    argv = ["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir),
            "--set", f"run.agent={json.dumps(agent)}"]  # fmt: skip
    assert main(argv) == 0

    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == len({e.execution_id for e in executions}) == 8  # each once, none lost
    (hog,) = [e for e in executions if e.execution_id.startswith("e000001.")]
    assert hog.status == "resource_exceeded" and hog.error is not None
    assert "passed the sandbox's memory limit" in hog.error, hog.error
    assert (
        hog.verdict is not None
        and (hog.verdict.outcome, hog.verdict.score) == ("scored", 0.0)
        and hog.trainable
    )
    assert len(hog.records) == 2  # its calls are journaled, token-exact, like any other's
    others = [e for e in executions if e is not hog]
    assert all(e.status == "done" and e.error is None and e.trainable for e in others), [
        (e.execution_id, e.status, e.error) for e in others
    ]

    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert [s.dropped for s in steps] == [0, 0]
    trained = [i for s in steps for i in s.execution_ids]
    assert sorted(trained) == sorted(e.execution_id for e in executions)  # the hog too (reward 0), each once
    assert all(s.trainer.micro_steps == sum(s.trainer.by_member.values()) > 0 for s in steps)
    switches = list(read_journal(run_dir / "switches.jsonl", SwitchRecord))
    assert switches and not any(s.error for s in switches)  # the cells never noticed
    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.steps == 2 and summary.failed_executions == 0
