"""``[chaos] verifier_start_fail`` under a live `gyre train`: the verifier's sandbox fails to start on some attempts;
the verifier retries, an execution whose every attempt failed is journaled dropped with the reason (never scored 0)
and left out of training, and every other execution is scored and trained once."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.config import ChaosConfig
from gyre.control.chaos import FaultyStarts
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

pytestmark = pytest.mark.slow(reason="a live gyre train whose verifiers fail to start and are retried")
# healthy cells and satellite: 30 s silence timeouts (robust.py), not the shipped 5 s a loaded machine exceeds
CONFIG = f"""
[run]
suite = "toy:8"
steps = 2
tasks_per_step = 2
group_size = 2
agent_max_calls = 2
agent_max_tokens = 12

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

[chaos]
verifier_start_fail = 0.5
seed = 1
"""
ATTEMPTS = 3  # the verifier's first attempt and its 2 retries


def test_a_verifier_that_cannot_start_drops_its_execution_unverified_and_the_rest_train(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir)]) == 0

    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == len({e.execution_id for e in executions}) == 8  # each once, none lost
    starts = FaultyStarts(ChaosConfig(verifier_start_fail=0.5, seed=1))
    doomed = {e.execution_id for e in executions if all(starts.fails(e.execution_id, a) for a in range(1, 4))}
    assert 0 < len(doomed) < 8  # (the seed's: some executions lose their verifier, not all)
    for e in executions:
        assert e.status == "done" and e.error is None and e.verdict is not None
        if e.execution_id in doomed:
            assert e.verdict.outcome == "dropped" and e.verdict.attempts == ATTEMPTS and not e.trainable
            assert "the verifier failed on every attempt (3)" in e.verdict.detail
            assert "the verifier's sandbox failed to start" in e.verdict.detail
        else:  # scored, on the first attempt that started
            assert e.verdict.outcome == "scored" and e.trainable, (e.execution_id, e.verdict)

    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    trained = [i for s in steps for i in s.execution_ids]
    assert sorted(trained) == sorted({e.execution_id for e in executions} - doomed)  # the others, each once
    assert sum(s.dropped for s in steps) == len(doomed)
    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.unverified_executions == len(doomed)
    faults = summary.injected_faults
    assert faults["verifier_starts_failed"] >= ATTEMPTS * len(doomed)
    assert faults["verifier_starts"] > faults["verifier_starts_failed"]
