"""What crosses to a shard: executions (their tasks' text and bytes files intact), ownership of sessions by hash, and
`--ray` without Ray installed."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.runtime.dispatch import BuiltinAgentSpec, CommandAgentSpec, ExecutionSpec
from gyre.runtime.shard import HubMessage, ShardRun
from gyre.runtime.shards import owner
from gyre.tasks import resolve_suite
from gyre.tasks.task import Task


def test_an_execution_reaches_its_shard_as_the_driver_sent_it() -> None:
    decoder = msgspec.msgpack.Decoder(HubMessage)
    binary = Task(id="bin", instruction="x", files={"a.txt": "text", "b.bin": b"\x00\xff"},
                  hidden_files={"t.py": "def test(): pass"})  # fmt: skip
    for task in [binary, *resolve_suite("toy:3"), *resolve_suite("nl2repo-mini")[:3]]:
        for agent in (
            BuiltinAgentSpec(),
            CommandAgentSpec(argv=["python", "-c", "print(1)"], env={"A": "1"}),
        ):
            spec = ExecutionSpec(task=task, group_index=1, agent=agent, execution_id=f"e1/{task.id}/1")
            message = decoder.decode(msgspec.msgpack.encode(ShardRun.of(7, "run", spec)))
            assert isinstance(message, ShardRun) and message.execution() == spec
    assert isinstance(binary.files["b.bin"], bytes)


def test_a_malformed_task_is_refused_by_name() -> None:
    spec = ExecutionSpec(task=Task(id="t", instruction="x"))
    wire = ShardRun.of(1, "run", spec)
    for field, value in (("files", {"a": 3}), ("time_budget_s", -1), ("limits", "none")):
        bad = msgspec.structs.replace(wire, task={**wire.task, field: value})
        with pytest.raises(msgspec.ValidationError):
            bad.execution()


def test_sessions_are_owned_by_hash_and_a_lost_shard_moves_only_its_own() -> None:
    ids = [f"e{i:06d}.0/toy-{i % 7}/{i % 2}" for i in range(4000)]
    shards = [f"shard-{i}" for i in range(4)]
    placed = {i: owner(i, shards) for i in ids}
    assert placed == {i: owner(i, list(reversed(shards))) for i in ids}  # stable, whatever the order
    counts = Counter(placed.values())
    assert set(counts) == set(shards) and min(counts.values()) > 0.2 * len(ids)  # about a quarter each
    survivors = shards[1:]
    moved = {i for i in ids if owner(i, survivors) != placed[i]}
    assert moved == {i for i in ids if placed[i] == "shard-0"}


def test_ray_without_ray_installed_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    config = tmp_path / "run.toml"
    config.write_text("[run]\nsteps = 1\n")
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs Ray, which is not installed" in err and "pip install 'gyre[ray]'" in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_an_outside_model_cannot_be_evaluated_on_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "--suite", "toy:2", "--base-url", "http://model.invalid/v1", "--shards", "2", "--run-dir",
            str(tmp_path / "eval")]  # fmt: skip
    assert main(argv) == 2
    assert (
        "--base-url (an outside model, no token-exact records) runs in this process"
        in capsys.readouterr().err
    )
