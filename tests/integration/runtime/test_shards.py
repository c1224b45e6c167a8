"""`gyre train` with two runtime shards on this machine: each execution runs, and is journaled once, by the shard
that owns its session; its records are that shard's router's calls, token for token; the run's readers (metrics,
report) see every shard's executions. A shard lost (killed, or frozen and thawed) stays lost: what ran there ends
once, dropped by the driver or run again, never scored by the shard; `gyre eval` takes the whole [shards] table."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from frozen_shards import FROZEN_TIMEOUT_S, assert_each_execution_ended_once, freeze_and_thaw
from gyre.cli import main
from gyre.config import GyreConfig, RouterConfig, ShardsConfig, load_config
from gyre.driver.rundir import execution_journals
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from gyre.runtime.shards import owner
from robust import CONTROLLER_TOML, SHARD_TIMEOUT_S, SHARDS_TOML, TRAINER_TOML

CONFIG = f"""
[trajectory]
skip_zero_advantage = false

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
heartbeat_s = 0.25
{TRAINER_TOML}

[controller]
heartbeat_s = 0.25
{CONTROLLER_TOML}

[shards]
count = 2
report_s = 0.25
{SHARDS_TOML}
"""


@pytest.mark.slow(
    reason="a gyre train on two shard processes (41 s); the fast tier runs shards in the lost-shard test"
)
def test_two_shards_run_a_training_run_each_execution_by_its_owner(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    assert (
        main(["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir), "--no-live"]) == 0
    )

    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.steps == 2 and summary.failed_executions == 0
    journals = execution_journals(run_dir / "journal")
    assert [p.relative_to(run_dir / "journal").as_posix() for p in journals] == [
        "executions.jsonl", "shards/shard-0/executions.jsonl", "shards/shard-1/executions.jsonl"]  # fmt: skip
    assert journals[0].read_bytes() == b""  # the driver journals only what a lost shard could not
    ran: dict[str, ExecutionResult] = {}
    for journal in journals[1:]:
        shard = journal.parent.name
        calls = {}
        for line in (journal.parent / "calls.jsonl").read_text().splitlines():
            calls[json.loads(line)["call_id"]] = json.loads(line)
        for e in read_journal(journal, ExecutionResult):
            assert e.execution_id not in ran  # journaled once
            ran[e.execution_id] = e
            assert owner(e.execution_id, ["shard-0", "shard-1"]) == shard
            assert e.records and all(msgspec.to_builtins(r) == calls[r.call_id] for r in e.records)
            assert e.verdict is not None and e.verdict.outcome == "scored"
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert len(ran) == 8 and sorted(x for s in steps for x in s.execution_ids) == sorted(ran)
    assert all(s.trainer.version == s.step + 1 for s in steps)
    joined = [json.loads(line) for line in (run_dir / "journal" / "shards.jsonl").read_text().splitlines()]
    assert sorted((e["shard"], e["event"]) for e in joined) == [("shard-0", "joined"), ("shard-1", "joined")]
    assert "Partial-score distribution per step" in (run_dir / "report.html").read_text()


@pytest.mark.slow(reason="a sharded gyre train killed outright and resumed")
def test_a_killed_sharded_driver_takes_its_shards_along_and_resumes_from_their_journals(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.replace("steps = 2", "steps = 3"))
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "gyre", "train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir),
            "--no-live"]  # fmt: skip
    driver = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text():
        assert driver.poll() is None and time.monotonic() < deadline, "the run ended or stalled before a step"
        time.sleep(0.1)
    shards = [
        json.loads(line)["pid"] for line in (run_dir / "journal" / "shards.jsonl").read_text().splitlines()
    ]
    driver.kill()
    driver.wait()
    for pid in shards:  # they die with the driver (and their sandboxes with them)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"shard process {pid} outlived its driver")
    finished = {
        e.execution_id
        for p in execution_journals(run_dir / "journal")
        for e in read_journal(p, ExecutionResult)
    }

    assert main(["train", "--resume", str(run_dir), "--no-live"]) == 0
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1, 2]
    ran = [e for p in execution_journals(run_dir / "journal") for e in read_journal(p, ExecutionResult)]
    trained = [x for s in steps for x in s.execution_ids]
    assert len(trained) == len(set(trained)) == 12  # each execution trained once, over both attempts
    assert finished <= {e.execution_id for e in ran}  # nothing journaled before the kill was lost


def test_a_lost_shards_execution_is_dropped_or_run_again_and_with_none_left_the_run_stops(
    tiny_model: Path, tmp_path: Path
) -> None:
    import asyncio
    import os
    import signal

    from gyre.config import GyreConfig, RouterConfig, ShardsConfig
    from gyre.runtime.dispatch import CommandAgentSpec, ExecutionSpec
    from gyre.runtime.shard import RuntimeSpec
    from gyre.runtime.shards import NoShardLeft, ShardHub
    from gyre.tasks import resolve_suite

    task = resolve_suite("toy:1")[0]
    sleeper = ExecutionSpec(
        task=task, agent=CommandAgentSpec(argv=["sleep", "60"]), execution_id="e000000.0/t/0"
    )

    async def lose(shards: int, reruns: int, run_dir: Path) -> object:
        # the victim is healthy until its kill (waiting up to 30 s to run), and its loss must be the exit's, seen at
        # once whatever the timeout: silence must not take it first on a loaded machine
        cfg = GyreConfig(router=RouterConfig(model_path=str(tiny_model)),
                         shards=ShardsConfig(count=shards, report_s=0.2, timeout_s=60, reruns=reruns))  # fmt: skip
        async with ShardHub(cfg, run_dir, {"run": RuntimeSpec(journal_dir=str(run_dir / "journal"))}) as hub:
            running = asyncio.create_task(hub.run_one(sleeper))
            for _ in range(600):  # until its shard reports it running (in its sandbox)
                if hub.statistics().totals.running:
                    break
                await asyncio.sleep(0.05)
            assert hub.statistics().totals.running == 1
            victim = next(s.name for s in hub.shards.values() if s.jobs)
            os.kill(hub.procs[victim].pid, signal.SIGKILL)  # type: ignore[attr-defined]
            try:
                async with asyncio.timeout(30):
                    return await running
            except NoShardLeft as stopped:
                return stopped

    dropped = asyncio.run(lose(1, 0, tmp_path / "drop"))
    assert isinstance(dropped, ExecutionResult) and dropped.status == "cancelled"
    assert dropped.verdict is not None and dropped.verdict.outcome == "dropped" and not dropped.trainable
    assert "shard shard-0 was lost (its process exited with code -9)" in dropped.verdict.detail
    journaled = list(read_journal(tmp_path / "drop" / "journal" / "executions.jsonl", ExecutionResult))
    assert [e.execution_id for e in journaled] == [sleeper.execution_id]  # by the driver: the shard could not

    stopped = asyncio.run(lose(1, 1, tmp_path / "none-left"))
    assert isinstance(stopped, NoShardLeft) and "no shard is left to run e000000.0/t/0~rerun1" in str(stopped)


@pytest.mark.timing
@pytest.mark.slow(reason="two shard processes, one frozen past shards.timeout_s and thawed")
@pytest.mark.parametrize("reruns", [1, 0])
def test_a_frozen_shard_that_comes_back_stays_lost(tiny_model: Path, tmp_path: Path, reruns: int) -> None:
    cfg = GyreConfig(router=RouterConfig(model_path=str(tiny_model)),
                     shards=ShardsConfig(count=2, report_s=0.2, timeout_s=FROZEN_TIMEOUT_S, reruns=reruns))  # fmt: skip
    thawed = asyncio.run(freeze_and_thaw(cfg, tmp_path / "run"))
    assert_each_execution_ended_once(tmp_path / "run", thawed, reruns)


@pytest.mark.slow(reason="gyre eval on two shard processes")
def test_gyre_eval_takes_the_whole_shards_table(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "eval.toml"
    config.write_text(f"[shards]\ncount = 2\nreport_s = 0.3\n{SHARDS_TOML}\nreruns = 0\n")
    run_dir = tmp_path / "eval"
    argv = ["eval", "--suite", "toy:2", "--agent", "oracle", "--model-path", str(tiny_model), "--run-dir",
            str(run_dir), "--config", str(config), "--no-progress"]  # fmt: skip
    assert main(argv) == 0

    shards = load_config(run_dir / "shards.toml").shards  # what the shards were given
    assert shards == ShardsConfig(count=2, report_s=0.3, timeout_s=SHARD_TIMEOUT_S, reruns=0)
    ran = [e for p in execution_journals(run_dir / "journal") for e in read_journal(p, ExecutionResult)]
    by_shard = [p.parent.name for p in execution_journals(run_dir / "journal")[1:]]
    assert by_shard == ["shard-0", "shard-1"]
    assert len(ran) == 2 and all(e.verdict is not None and e.verdict.outcome == "scored" for e in ran)
