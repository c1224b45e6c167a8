"""What `gyre train --resume` makes of a killed run's directory (`training.pick_up`), torn journal lines, execution ids
and the held-out interval: pure, on journals written here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from gyre.config import load_config
from gyre.driver.evaluation import bootstrap_ci
from gyre.driver.rundir import RunDir
from gyre.driver.training import (
    Resume,
    StepRecord,
    execution_id,
    execution_index,
    pick_up,
    step_record,
    train,
)
from gyre.errors import ConfigError
from gyre.journal import Journal, read_journal, repair_journal
from gyre.tasks import Task
from gyre.train.step import Rollout
from unit.driver.runs import execution, metrics

BATCH = 4


def killed_run(root: Path, checkpoints: int, metric_lines: int, finished: int) -> RunDir:
    """A run killed after ``finished`` executions, ``checkpoints`` checkpoints, ``metric_lines`` metrics lines."""
    rd = RunDir(root)
    rd.root.mkdir(parents=True)
    rd.config.write_text("[run]\n")
    executions = Journal(rd.journal, "executions.jsonl")
    for i in range(finished):
        executions.append(execution(f"e{i:06d}.0/task/{i % 2}", i // BATCH, reward=0.25 * (i % 4)))
    executions.close()
    lines = Journal(rd.root, "metrics.jsonl")
    for step in range(metric_lines):
        ids = [f"e{i:06d}.0/task/{i % 2}" for i in range(step * BATCH, (step + 1) * BATCH)]
        lines.append(StepRecord(step=step, wall_s=1.0, reward_mean=0.0, reward_std=0.0, pass_rate=0.0,
                                executions=BATCH, dropped=0, trainer=metrics(step), execution_ids=ids))  # fmt: skip
    lines.close()
    for n in range(1, checkpoints + 1):
        ids = [f"e{i:06d}.0/task/{i % 2}" for i in range((n - 1) * BATCH, n * BATCH)]
        (rd.checkpoint(n)).mkdir(parents=True)
        state = {
            "step": n,
            "version": n,
            "data_cursor": {"step": n - 1, "execution_ids": ids},
            "metrics": msgspec.to_builtins(metrics(n - 1)),
        }  # as the core writes it
        (rd.checkpoint(n) / "trainer_state.json").write_text(json.dumps(state))
    return rd


def test_finished_executions_past_the_checkpoint_are_reused_and_later_metrics_dropped(tmp_path: Path) -> None:
    rd = killed_run(tmp_path / "run", checkpoints=1, metric_lines=2, finished=2 * BATCH + 1)
    (rd.root / "checkpoints" / "step-2.partial").mkdir()  # a checkpoint the kill interrupted: not complete
    picked = pick_up(rd, BATCH)
    assert picked.start == 1 and picked.attempt == 1
    assert sorted(picked.reused) == list(range(BATCH, 2 * BATCH + 1))  # step 1's and one of step 2's
    assert [r.step for r in read_journal(rd.metrics, StepRecord)] == [0]  # step 1 trains again: its line goes
    (resume,) = read_journal(rd.resumes, Resume)
    assert resume.from_step == 1 and resume.reused == BATCH + 1 and resume.dropped_steps == 1


def test_a_checkpointed_step_without_its_metrics_line_gets_it_back_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    rd = killed_run(tmp_path / "run", checkpoints=2, metric_lines=1, finished=2 * BATCH)
    picked = pick_up(rd, BATCH)
    assert picked.start == 2 and not picked.reused
    steps = list(read_journal(rd.metrics, StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert steps[1].execution_ids == [f"e{i:06d}.0/task/{i % 2}" for i in range(BATCH, 2 * BATCH)]
    assert steps[1].trainer.step == 1 and steps[1].reward_mean == pytest.approx(0.375)


def test_torn_lines_are_cut_before_anything_appends_and_attempts_count(tmp_path: Path) -> None:
    rd = killed_run(tmp_path / "run", checkpoints=0, metric_lines=0, finished=3)
    whole = rd.executions.stat().st_size
    with open(rd.executions, "ab") as f:
        f.write(b'{"execution_id": "e0000')
    first = pick_up(rd, BATCH)
    assert rd.executions.stat().st_size == whole and sorted(first.reused) == [0, 1, 2]
    assert pick_up(rd, BATCH).attempt == 2  # a second resume is attempt 2: its executions get new ids


def test_a_directory_that_is_no_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.toml"):
        pick_up(RunDir(tmp_path), BATCH)


def test_a_carry_over_run_is_not_resumed_by_dispatch_order(tmp_path: Path) -> None:
    rd = killed_run(tmp_path / "run", checkpoints=1, metric_lines=1, finished=6)
    cfg = load_config(None, [f'run.run_dir="{rd.root}"', "controller.carry_over=true"])
    with pytest.raises(ConfigError, match="carry_over cannot be resumed yet"):
        asyncio.run(train(cfg, resume=True))
    assert not rd.resumes.exists()  # refused before anything was touched


def test_repair_cuts_only_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":2}\n')
    assert repair_journal(path) == 0 and path.read_bytes() == b'{"a":1}\n{"a":2}\n'
    path.write_bytes(b'{"a":1}\n{"a"')
    assert repair_journal(path) == 4 and path.read_bytes() == b'{"a":1}\n'
    path.write_bytes(b'{"a"')
    assert repair_journal(path) == 4 and path.read_bytes() == b""
    assert repair_journal(tmp_path / "missing.jsonl") == 0


def test_execution_ids_name_their_index_and_nothing_else_parses() -> None:
    task = Task(id="toy-0-0003", instruction="x")
    made = execution_id(37, 2, task, 1)
    assert made == "e000037.2/toy-0-0003/1" and execution_index(made) == 37
    assert execution_index("eval-3/toy-0-0003/1") is None and execution_index("toy/0/abc") is None


def test_a_step_record_keeps_the_trained_executions_and_sampled_tokens() -> None:
    rollouts = [Rollout(execution_id="a", group="g", reward=1.0, records=[]),
                Rollout(execution_id="b", group="g", reward=0.0, records=[], dropped=True)]  # fmt: skip
    record = step_record(3, rollouts, metrics(3), 1.0)
    assert record.execution_ids == ["a"] and record.dropped == 1 and record.pass_rate == 1.0


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_more_executions() -> None:
    few = [0.0, 1.0] * 4
    many = few * 16
    low, high = bootstrap_ci(few)
    assert low < 0.5 < high
    wide, narrow = high - low, bootstrap_ci(many)[1] - bootstrap_ci(many)[0]
    assert narrow < wide / 2  # ~1/sqrt(16) as wide
    assert bootstrap_ci([0.7]) == (0.7, 0.7) and bootstrap_ci([]) == (0.0, 0.0)
