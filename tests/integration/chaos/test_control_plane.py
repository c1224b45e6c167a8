"""Chaos on the control plane under a live `gyre train`: the controller's and the cells' messages are dropped,
duplicated and delayed (so reordered too), and the run still trains every step with every execution once."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.protocol import SwitchRecord
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

pytestmark = pytest.mark.slow(
    reason="a live gyre train with its control messages dropped, duplicated and delayed"
)
RUN_TIMEOUT_S = 600  # it takes 30-60 s alone, a few minutes beside a full suite
CONFIG = f"""
[trajectory]
# the untrained tiny model's groups often score alike (advantage 0, not computed by default): compute them, so
# every step has micro-steps to train
skip_zero_advantage = false

[run]
suite = "toy:8"
steps = 3
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
# no cell is faulted, only messages: every cell is healthy, and a dropped or delayed beat must not lose one
{CONTROLLER_TOML}

[chaos]
control_drop = 0.2
control_duplicate = 0.2
control_delay_s = 0.3
seed = 7
"""


def test_lost_repeated_and_reordered_control_messages_change_nothing_a_run_promises(
    tiny_model: Path, tmp_path: Path, fresh_processes: None
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    argv = ["train", str(config), "--mode", "colocate", "--model", str(tiny_model), "--run-dir", str(run_dir)]
    # the user's command line as a user runs it (fresh interpreters, not the suite's fork server), in its own process
    # group, so a run that stops making progress fails the test with its logs instead of holding CI
    # (a full suite saw one wait forever, 2026-12-07: an execution of the next step crashed after 60 s with no engine
    # serving while both cells trained, and the step waited for its group)
    proc = subprocess.Popen([sys.executable, "-m", "gyre", *argv], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        logs = "".join(
            f"\n== {log.name}\n" + log.read_text()[-2000:] for log in (run_dir / "logs").glob("*.log")
        )
        pytest.fail(f"gyre train made no end in {RUN_TIMEOUT_S} s\n{output.decode()[-4000:]}{logs}")
    assert proc.returncode == 0, output.decode()[-4000:]

    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    faults = summary.injected_faults
    assert faults["dropped"] > 0 and faults["duplicated"] > 0 and faults["delayed"] > 0, faults
    for log in (run_dir / "logs").glob("cell-?.log"):  # the cells' side was faulty too
        line = re.search(r"chaos on its control messages: (\{.*\})", log.read_text())
        assert line is not None, log
        counts = ast.literal_eval(line.group(1))
        assert counts["dropped"] > 0 and counts["delayed"] > 0, (log, counts)

    # every step applied once, every execution run once and scored, nothing failed
    assert summary.steps == 3 and summary.failed_executions == 0
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1, 2] and all(s.executions == 4 for s in steps)
    assert all(s.trainer.version == s.step + 1 for s in steps)
    assert all(s.trainer.micro_steps == sum(s.trainer.by_member.values()) > 0 for s in steps)
    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == len({e.execution_id for e in executions}) == 12
    assert all(e.status == "done" and e.verdict is not None for e in executions), [
        (e.execution_id, e.status, e.error) for e in executions if e.status != "done" or e.verdict is None
    ]  # a full run saw one fail once (2026-12-04): say which and why next time
    # colocate: both cells train every step and come back between steps, each switch once and without error
    switches = list(read_journal(run_dir / "switches.jsonl", SwitchRecord))
    assert not any(s.error for s in switches), [s.error for s in switches if s.error]
    seen = [(s.switch, s.cell, s.direction) for s in switches]
    assert len(switches) == len({s.switch for s in switches}) == 3 * 2 + 2 * 2, (seen, summary)
    for cell in ("cell-0", "cell-1"):
        directions = [s.direction for s in switches if s.cell == cell]
        assert directions == ["serve_to_train", "train_to_serve"] * 2 + ["serve_to_train"], (cell, directions)
