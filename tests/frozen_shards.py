"""A shard frozen past ``shards.timeout_s`` and thawed (SIGSTOP, SIGCONT), on this machine or placed by Ray: what it
must leave behind (`tests/integration/runtime/test_shards.py`, `tests/integration/cluster/test_ray.py`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gyre.config import GyreConfig
from gyre.control.placement import Launcher
from gyre.control.silence import ManualClock
from gyre.driver.rundir import execution_journals
from gyre.journal import read_journal
from gyre.runtime.dispatch import CommandAgentSpec, ExecutionResult, ExecutionSpec
from gyre.runtime.shard import RuntimeSpec
from gyre.runtime.shards import ShardHub, ShardStatistics, owner
from gyre.tasks import resolve_suite

# First attempts outlast the freeze's start, so they are cut off; their reruns finish at once.
SLOW_FIRST = ["sh", "-c", 'case "$GYRE_EXECUTION_ID" in *~rerun*) exit 0;; esac; sleep 3']
# shards.timeout_s of these tests, on the hub's ManualClock: the clock moves on only once the healthy shard-0 was
# heard again, so shard-0 is never silent for a moment of it, however loaded the machine (at a real 2 s, CI once lost
# shard-0 instead, its reports late under load); the frozen shard-1 is lost after a few steps, holding its four
FROZEN_TIMEOUT_S = 2.0
VICTIM = "shard-1"  # owns four of the six executions (rendezvous hash), shard-0 two


class Thawed(NamedTuple):
    """What a shard frozen past ``shards.timeout_s`` and thawed left behind."""

    results: list[ExecutionResult]  # what each run_one returned
    at_loss: ShardStatistics  # the hub's statistics as it lost the frozen shard
    after: ShardStatistics  # ... once everything ended
    code: int  # the thawed shard's exit code


async def freeze_and_thaw(cfg: GyreConfig, run_dir: Path, launcher: Launcher | None = None) -> Thawed:
    """Run six executions on two shards; SIGSTOP `VICTIM` once its four run, past ``shards.timeout_s`` of the hub's
    clock (stepped on each time the other shard reports); SIGCONT it once the hub has lost it; wait for its process
    to end and everything to finish."""
    task = resolve_suite("toy:1")[0]
    specs = [ExecutionSpec(task=task, agent=CommandAgentSpec(argv=SLOW_FIRST), execution_id=f"e000000.0/toy/{i}")
             for i in range(6)]  # fmt: skip
    assert [owner(s.execution_id, ["shard-0", "shard-1"]) for s in specs].count(VICTIM) == 4

    async def until(condition: Callable[[], object], timeout_s: float = 120) -> None:
        """Until ``condition`` (read from the hub's counters or /proc) holds."""
        async with asyncio.timeout(timeout_s):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.02)

    runtimes = {"run": RuntimeSpec(journal_dir=str(run_dir / "journal"))}
    clock = ManualClock()
    async with ShardHub(cfg, run_dir, runtimes, launcher, clock=clock) as hub:
        shard = hub.shards[VICTIM]
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(hub.run_one(s)) for s in specs]
            await until(lambda: shard.report and shard.report.running == len(shard.jobs) == 4)
            assert shard.hello is not None
            pid = shard.hello.pid
            os.kill(pid, signal.SIGSTOP)
            healthy = hub.shards["shard-0"]
            while VICTIM not in hub.statistics().lost:
                heard = healthy.report
                await until(
                    lambda heard=heard: healthy.report is not heard
                )  # shard-0 was heard since the last step
                clock.advance(cfg.shards.report_s)
                await asyncio.sleep(0.01)  # the hub's sweep runs
            at_loss = hub.statistics()
            os.kill(pid, signal.SIGCONT)
            await until(lambda: not _alive(pid))  # told to stop, it stops (or, STOP_S later, is killed)
        totals = lambda: hub.statistics().totals  # noqa: E731  (as shard-0 last reported)
        await until(lambda: totals().dispatched and totals().finished == totals().dispatched)
        after = hub.statistics()
        code = await asyncio.to_thread(hub.procs[VICTIM].wait, 30)  # its actor's answer, under Ray
    return Thawed([r.result() for r in running], at_loss, after, code)


def _alive(pid: int) -> bool:
    """The process runs (neither gone nor a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_each_execution_ended_once(run_dir: Path, thawed: Thawed, reruns: int) -> None:
    """Every execution id ends once across the driver's and both shards' journals; what the hub cut off on the
    frozen shard it journaled dropped, and that shard journaled none of it, nor anything the hub did not take."""
    journals = {p.relative_to(run_dir / "journal").as_posix(): list(read_journal(p, ExecutionResult))
                for p in execution_journals(run_dir / "journal")}  # fmt: skip
    ended = [e.execution_id for lines in journals.values() for e in lines]
    assert len(ended) == len(set(ended)), ended
    cut = {e.execution_id: e for e in journals["executions.jsonl"]}  # the driver's: what it cut off
    assert cut and all(e.verdict is not None and e.verdict.outcome == "dropped" for e in cut.values())
    assert all(f"shard {VICTIM} was lost (silent for" in e.verdict.detail for e in cut.values() if e.verdict)
    frozen = {e.execution_id for e in journals[f"shards/{VICTIM}/executions.jsonl"]}
    taken = {r.execution_id for r in thawed.results}
    assert not frozen & set(cut) and frozen <= taken  # only what the hub took, none of what it cut off
    assert set(ended) == taken | set(cut)
    if reruns:  # each cut-off execution ran again on shard-0 and was scored there
        assert all(r.verdict is not None and r.verdict.outcome == "scored" for r in thawed.results)
        assert {f"{x}~rerun1" for x in cut} <= taken and thawed.after.reruns == len(cut)
    else:  # each ended dropped, as the driver journaled it
        assert [r for r in thawed.results if r.execution_id in cut] == list(cut.values())
        assert thawed.after.reruns == 0
    assert thawed.code == 0  # it came back, was told to stop, and stopped (not killed)
    assert thawed.at_loss.lost == [VICTIM] and thawed.at_loss.live == 1
    assert thawed.at_loss.totals.running <= 2  # shard-0's two at most: the lost shard's last report left out
    assert thawed.after.lost == [VICTIM] and thawed.after.totals.running == 0
    events = [json.loads(line) for line in (run_dir / "journal" / "shards.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["shard"] == VICTIM] == ["joined", "lost"]  # never joined again
