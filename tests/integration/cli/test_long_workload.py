"""`gyre train` on one execution of the ``long`` suite with the micro preset: the untrained model calls no tool, yet
the agent makes every call the task allows, the records hold the whole uncompacted context (one path of ~20K
tokens, scaled down from the full size's 150K-230K), and the step trains it, split over the core cell's two ranks.
The untrained model scores 0, so a group of one has advantage 0 and the update is zero: what this shows is the path
computed forward and backward, not learning."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML

STAGES = 16  # the task allows STAGES + 11 calls of ~800 tokens each (a stage's log and the call's own tokens)
# a healthy, busy cell: a 30 s silence timeout (robust.py), not the shipped 5 s a loaded machine exceeds
CONFIG = f"""
[run]
suite = "long:1:0:{STAGES}"
steps = 1
tasks_per_step = 1
group_size = 1
agent_max_calls = 300
agent_max_tokens = 16
agent_profile = "lean"

[trajectory]
skip_zero_advantage = false
micro_step_tokens = 8192

[trainer]
ranks = 2
max_tokens_per_rank = 8192
learning_rate = 1e-4
heartbeat_s = 0.25

[cells]
count = 1
capacity_executions = 1
engine_overrides = ["engine.kv_cache_mem_gib=0.2"]
num_threads = 1

[controller]
heartbeat_s = 0.25
{CONTROLLER_TOML}
"""


@pytest.fixture(scope="module")
def micro_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised micro model (1 layer, 1 head of 16, 1M positions, Qwen's vocabulary)."""
    from gyre.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "micro", preset="micro", seed=0)


@pytest.mark.slow(reason="gyre train on a ~20K-token execution of 27 calls, trained over two ranks")
def test_gyre_train_trains_one_long_execution_whole(
    micro_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "long.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--model", str(micro_model), "--run-dir", str(run_dir)]) == 0
    assert "1 steps" in capsys.readouterr().out

    (execution,) = read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult)
    records = execution.records
    assert len(records) == STAGES + 11  # every call the task allows: no tool call ends nothing
    assert {r.role for r in records} == {"main"}  # never compacted: no summary, no fresh context
    assert all(r.parent_call_id == p.call_id for p, r in itertools.pairwise(records))
    last = records[-1]
    context = last.prefix_len + len(last.new_input_ids) + len(last.output_ids)
    assert context >= 18_000  # each call added a stage's log (the idle command's) to one context
    assert execution.verdict is not None and execution.verdict.outcome == "scored"

    (step,) = read_journal(run_dir / "metrics.jsonl", StepRecord)
    policy_tokens = sum(len(r.output_ids) for r in records)
    # the whole path in one micro-step: every policy token trained, every context token computed
    assert step.trainer.tokens == policy_tokens and step.trainer.micro_steps == 1
    assert step.trainer.computed_tokens >= context - len(last.output_ids)
    assert step.trainer.version == 1 and not step.trainer.untrained
    # longer than trainer.max_tokens_per_rank: the core cell's two ranks computed it together (context parallelism)
    cell_log = (run_dir / "logs" / "cell-0.log").read_text()
    assert re.search(
        rf"\({step.trainer.computed_tokens} tokens\) computed by the cell's 2 ranks together", cell_log
    )
    assert (
        step.reward_mean == execution.reward and 0.0 <= execution.reward <= 1.0
    )  # partial credit, from trail
    result = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert result.steps == 1 and result.reward_last == execution.reward
