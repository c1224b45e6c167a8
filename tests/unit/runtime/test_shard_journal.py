"""A shard journals a result only once the hub took it: a lost shard writes none of what it held or what its
cancelled executions end as; a shard stopped at the run's end writes all of it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from gyre.runtime.shard import HeldJournal, HubMessage, ShardJournal, ShardStop, encoder
from gyre.tasks.verify import Verdict


def result(execution_id: str, status: Literal["done", "cancelled"] = "done") -> ExecutionResult:
    return ExecutionResult(execution_id=execution_id, task_id="t", group_index=0, status=status, agent=None,
                           error=None, records=[], prompt_tokens=0, completion_tokens=0, dispatched_s=0.0,
                           started_s=0.0, finished_s=1.0, verdict=Verdict(outcome="scored", score=1.0))  # fmt: skip


def journaled(path: Path) -> list[str]:
    return [e.execution_id for e in read_journal(path / "executions.jsonl", ExecutionResult)]


def test_a_result_is_journaled_when_the_hub_takes_it_and_a_lost_shard_journals_nothing_more(
    tmp_path: Path,
) -> None:
    lost = HeldJournal(tmp_path / "lost")
    lost.append(result("a"))
    lost.append(result("b"))
    assert journaled(tmp_path / "lost") == []  # held: the hub has not answered
    lost.release("a")
    lost.settle(lost=True)  # the hub cut "b" off and journaled it dropped itself
    lost.append(result("c", "cancelled"))  # an execution cancelled as the shard stops
    lost.release("b")
    assert journaled(tmp_path / "lost") == ["a"]

    ending = HeldJournal(tmp_path / "ending")
    ending.append(result("a"))
    ending.settle(lost=False)  # the run ends: nothing was cut off
    ending.append(result("c", "cancelled"))
    assert journaled(tmp_path / "ending") == ["a", "c"]


def test_the_hubs_answers_cross_the_wire() -> None:
    decoder = msgspec.msgpack.Decoder(HubMessage)
    for message in (ShardJournal(job=7), ShardStop(lost=True), ShardStop()):
        assert decoder.decode(encoder.encode(message)) == message
    assert decoder.decode(msgspec.msgpack.encode({"type": "shard_stop"})) == ShardStop(
        lost=False
    )  # older hubs
