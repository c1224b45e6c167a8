"""`gyre train --ray` on a local multi-node Ray cluster (Ray's own cluster utilities: a head and four nodes on this
machine, two for shards, two for cells, told apart by custom resources): two shards and two cells placed by Ray train
like the same run on one machine; killing a shard's node drops (never scores) what ran there and runs it again; killing
a cell's node is today's cell death; a shard frozen and thawed stays lost."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from frozen_shards import FROZEN_TIMEOUT_S, assert_each_execution_ended_once, freeze_and_thaw
from gyre.config import GyreConfig, RayConfig, RouterConfig, ShardsConfig
from gyre.driver.rundir import execution_journals
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from robust import SHARDS_TOML

pytestmark = [
    pytest.mark.slow(reason="a local Ray cluster of five nodes and gyre train runs on it"),
    pytest.mark.timeout(600),  # two gyre train runs in one test: 175 s in CI
]
# A killed node's cell or shard is judged by the timeouts its healthy peers share: 20 s for cells and members, the
# robust 30 s for shards (CI once lost both healthy shards at 8.2 s, see the cell test).
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
learning_rate = 1e-4
heartbeat_s = 0.25
member_timeout_s = 20

[controller]
heartbeat_s = 0.25
cell_timeout_s = 20

[shards]
count = 2
report_s = 0.25
{SHARDS_TOML}

[ray]
cell_gpus = 0
cell_cpus = 1
cell_resources = {{ cell_node = 1 }}
shard_resources = {{ shard_node = 1 }}
cell_strategy = "STRICT_SPREAD"
shard_strategy = "STRICT_SPREAD"
"""
# A scaffold slow enough to be caught mid-execution: two calls through its router session, a pause before each.
SLOW_SCAFFOLD = """
import os, time, openai
client, messages = openai.OpenAI(), [{"role": "user", "content": os.environ["GYRE_TASK"]}]
for _ in range(2):
    time.sleep(1.5)
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}]
open("answer.txt", "w").write(messages[-1]["content"])
"""


NODES = ("shard_node", "shard_node", "cell_node", "cell_node")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[tuple[Any, dict[Any, str]]]:
    """One Ray cluster for the module (a start costs seconds): its head, and its worker nodes with their kinds."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        yield nodes, {}
    finally:
        nodes.shutdown()


@pytest.fixture
def cluster(ray_cluster: tuple[Any, dict[Any, str]]) -> Any:
    """The module's cluster with its four worker nodes: a node an earlier test removed is added again first."""
    nodes, kinds = ray_cluster
    for node in [n for n in kinds if n not in nodes.worker_nodes]:
        del kinds[node]
    missing = list(NODES)
    for kind in kinds.values():
        missing.remove(kind)
    for kind in missing:
        kinds[nodes.add_node(num_cpus=1, resources={kind: 1})] = kind
    nodes.wait_for_nodes()
    return nodes


def train(
    model: Path, tmp_path: Path, run: str, *extra: str, ray: str | None = None
) -> subprocess.Popen[bytes]:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    argv = [sys.executable, "-m", "gyre", "train", str(config), "--model", str(model),
            "--run-dir", str(tmp_path / run), "--no-live", *extra, *(["--ray", ray] if ray else [])]  # fmt: skip
    with open(tmp_path / f"{run}.out", "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen[bytes], tmp_path: Path, run: str, timeout_s: float = 400) -> Path:
    code = proc.wait(timeout_s)
    assert code == 0, (tmp_path / f"{run}.out").read_text()[-3000:]
    return tmp_path / run


def executions(run_dir: Path) -> list[ExecutionResult]:
    return [e for p in execution_journals(run_dir / "journal") for e in read_journal(p, ExecutionResult)]


def steps(run_dir: Path) -> list[StepRecord]:
    return list(read_journal(run_dir / "metrics.jsonl", StepRecord))


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(
    what: str, condition: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float = 240
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:  # its output (train() writes RUN.out beside the run directory)
            args = [str(a) for a in proc.args]  # type: ignore[union-attr]
            run_dir = Path(args[args.index("--run-dir") + 1])
            out = run_dir.parent / f"{run_dir.name}.out"
            raise AssertionError(f"the run ended before {what}:\n" + out.read_text()[-3000:])
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.05)


def node_of(placed: list[dict[str, Any]], process: str) -> str:
    return next(p["node"] for p in placed if p["process"] == process)


def remove(cluster: Any, node_id: str) -> None:
    node = next(n for n in cluster.list_all_nodes() if n.node_id == node_id)
    cluster.remove_node(node)


def test_two_shards_and_two_cells_placed_by_ray_train_like_one_machine(
    cluster: Any, tiny_model: Path, tmp_path: Path
) -> None:
    placed_run = finish(train(tiny_model, tmp_path, "ray", ray=cluster.address), tmp_path, "ray")
    local_run = finish(train(tiny_model, tmp_path, "local", "--set", "shards.count=0"), tmp_path, "local")

    placed = jsonl(placed_run / "journal" / "placement.jsonl")
    assert sorted(p["process"] for p in placed) == ["cell-0", "cell-1", "shard-0", "shard-1"]
    nodes = {p["process"]: p["node"] for p in placed}
    assert len(set(nodes.values())) == 4  # STRICT_SPREAD: each on a node of its own kind
    joined = [e for e in jsonl(placed_run / "journal" / "shards.jsonl") if e["event"] == "joined"]
    assert {e["shard"]: e["node"] for e in joined} == {
        "shard-0": nodes["shard-0"],
        "shard-1": nodes["shard-1"],
    }
    assert not [e for e in jsonl(placed_run / "journal" / "shards.jsonl") if e["event"] == "lost"]

    ran = executions(placed_run)
    ids = [e.execution_id for e in ran]
    assert len(ids) == len(set(ids)) == 8  # each execution journaled once, by the shard that ran it
    by_shard = {p.parent.name: {e.execution_id for e in read_journal(p, ExecutionResult)}
                for p in (placed_run / "journal" / "shards").glob("*/executions.jsonl")}  # fmt: skip
    assert set(by_shard) == {"shard-0", "shard-1"} and all(by_shard.values())
    for (
        shard,
        owned,
    ) in by_shard.items():  # token-exact: the records are the shard router's calls, as journaled
        calls = {c["call_id"]: c for c in jsonl(placed_run / "journal" / "shards" / shard / "calls.jsonl")}
        for e in ran:
            if e.execution_id in owned:
                assert e.records
                for r in e.records:
                    assert msgspec.to_builtins(r) == calls[r.call_id]

    # the same run on one machine, on the same seeds: the same executions, steps, counts and versions
    alone = executions(local_run)
    assert sorted(e.execution_id for e in alone) == sorted(ids)
    assert [(s.step, s.executions, s.dropped, s.trainer.version, sorted(s.execution_ids)) for s in steps(placed_run)] \
        == [(s.step, s.executions, s.dropped, s.trainer.version, sorted(s.execution_ids)) for s in steps(local_run)]  # fmt: skip
    assert [len(e.records) for e in sorted(ran, key=lambda e: e.execution_id)] == [
        len(e.records) for e in sorted(alone, key=lambda e: e.execution_id)
    ]
    summary = msgspec.json.decode((placed_run / "train.json").read_bytes(), type=TrainSummary)
    assert summary.steps == 2 and summary.failed_executions == 0


def test_a_shard_node_killed_mid_step_drops_and_reruns_what_ran_there(
    cluster: Any, tiny_model: Path, tmp_path: Path
) -> None:
    agent = f"command:{shlex.join([sys.executable, '-c', SLOW_SCAFFOLD])}"
    proc = train(tiny_model, tmp_path, "run", "--set", f"run.agent={json.dumps(agent)}", ray=cluster.address)
    run_dir = tmp_path / "run"
    victim = run_dir / "journal" / "shards" / "shard-0"

    def running_there() -> bool:  # an execution of shard-0 made a call and has not finished
        finished = {r.session for e in (read_journal(victim / "executions.jsonl", ExecutionResult)
                                        if (victim / "executions.jsonl").exists() else []) for r in e.records}  # fmt: skip
        return any(c["session"] not in finished for c in jsonl(victim / "calls.jsonl"))

    wait_for("a call of an execution on shard-0", running_there, proc)
    before = {e.execution_id for e in read_journal(victim / "executions.jsonl", ExecutionResult)} \
        if (victim / "executions.jsonl").exists() else set()  # fmt: skip
    remove(cluster, node_of(jsonl(run_dir / "journal" / "placement.jsonl"), "shard-0"))
    finish(proc, tmp_path, "run")

    lost = [e for e in jsonl(run_dir / "journal" / "shards.jsonl") if e["event"] == "lost"]
    assert [e["shard"] for e in lost] == ["shard-0"] and lost[0]["running"] >= 1
    ran = executions(run_dir)
    ids = [e.execution_id for e in ran]
    assert len(ids) == len(
        set(ids)
    )  # journaled once each: the cut-off attempt by the driver, its rerun by shard-1
    cut = [e for e in read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult)]
    assert len(cut) == lost[0]["running"]
    for e in cut:  # dropped, never scored: not a 0 in any group
        assert e.status == "cancelled" and e.verdict is not None and e.verdict.outcome == "dropped"
        assert "shard shard-0 was lost" in e.verdict.detail and not e.records
        again = next(r for r in ran if r.execution_id == f"{e.execution_id}~rerun1")
        assert again.status == "done" and again.verdict is not None and again.verdict.outcome == "scored"
    trained = [x for s in steps(run_dir) for x in s.execution_ids]
    assert [s.step for s in steps(run_dir)] == [0, 1] and all(s.executions == 4 for s in steps(run_dir))
    assert len(trained) == 8 and not {e.execution_id for e in cut} & set(trained)
    assert {f"{e.execution_id}~rerun1" for e in cut} <= set(trained)
    assert before <= set(trained)  # what finished on shard-0 before its node died is trained, not run again


def test_a_cell_node_killed_is_a_dead_cell_as_on_one_machine(
    cluster: Any, tiny_model: Path, tmp_path: Path
) -> None:
    agent = f"command:{shlex.join([sys.executable, '-c', SLOW_SCAFFOLD])}"
    # shards judged silent after 60 s, twice the config's: this test is about the cell. CI twice saw both shards
    # called silent for 8.2 s at once during their first executions beside a full suite, and the run end before its
    # first call (exit 2, no shard left); the cause, something in the shards' loop that starves under load, is not
    # yet found
    proc = train(tiny_model, tmp_path, "run", "--set", f"run.agent={json.dumps(agent)}", "--set",
                 "shards.timeout_s=60", ray=cluster.address)  # fmt: skip
    run_dir = tmp_path / "run"
    wait_for("the first call", lambda: any(p.stat().st_size for p in (run_dir / "journal").glob("shards/*/calls.jsonl")),
             proc)  # fmt: skip
    remove(cluster, node_of(jsonl(run_dir / "journal" / "placement.jsonl"), "cell-1"))
    finish(proc, tmp_path, "run")

    assert "cell cell-1 is gone" in (tmp_path / "run.out").read_text()
    ran = executions(run_dir)
    assert len(ran) == 8 and all(
        e.status == "done" and e.verdict and e.verdict.outcome == "scored" for e in ran
    )
    assert [s.step for s in steps(run_dir)] == [0, 1] and all(
        len(s.execution_ids) == 4 for s in steps(run_dir)
    )


def test_gyre_eval_places_its_shards_with_ray(cluster: Any, tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "eval.toml"
    # both shards are healthy: the robust silence timeout, not the shipped 10 s
    config.write_text(
        '[ray]\nshard_resources = { shard_node = 1 }\nshard_strategy = "STRICT_SPREAD"\n\n'
        f"[shards]\n{SHARDS_TOML}\n"
    )
    run_dir = tmp_path / "eval"
    argv = [sys.executable, "-m", "gyre", "eval", "--suite", "toy:4", "--model-path", str(tiny_model), "--run-dir",
            str(run_dir), "--config", str(config), "--shards", "2", "--ray", cluster.address, "--max-steps", "2",
            "--max-tokens-per-call", "8", "--no-progress"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    placed = {p["process"]: p for p in jsonl(run_dir / "journal" / "placement.jsonl")}
    assert sorted(placed) == ["shard-0", "shard-1"] and placed["shard-0"]["node"] != placed["shard-1"]["node"]
    assert all(p["bundle"] == {"CPU": 1.0, "shard_node": 1.0} for p in placed.values())
    ran = executions(run_dir)
    assert len(ran) == 4 and all(e.verdict is not None and e.verdict.outcome == "scored" for e in ran)
    assert all(e.records for e in ran)  # every execution called the engine the driver serves, from its node
    assert all(list((run_dir / "journal" / "shards" / s).glob("executions.jsonl")) for s in placed)


@pytest.mark.parametrize("reruns", [1, 0])
def test_a_shard_frozen_under_ray_and_thawed_stays_lost(
    cluster: Any, tiny_model: Path, tmp_path: Path, reruns: int
) -> None:
    from gyre.control.placement import RayLauncher, ray_config

    placement = RayConfig(shard_resources={"shard_node": 1}, shard_strategy="STRICT_SPREAD")
    cfg = ray_config(GyreConfig(router=RouterConfig(model_path=str(tiny_model)), ray=placement,
                                shards=ShardsConfig(count=2, report_s=0.2, timeout_s=FROZEN_TIMEOUT_S, reruns=reruns)))  # fmt: skip
    run_dir = tmp_path / "run"
    launcher = RayLauncher(cfg, cluster.address, run_dir / "journal", cells=0)
    try:
        thawed = asyncio.run(freeze_and_thaw(cfg, run_dir, launcher))
    finally:
        launcher.close()
        launcher.ray.shutdown()  # this process joined the cluster: leave it before the cluster goes
    placed = {p["process"]: p["node"] for p in jsonl(run_dir / "journal" / "placement.jsonl")}
    assert len(set(placed.values())) == 2  # each shard on a node of its own
    assert_each_execution_ended_once(run_dir, thawed, reruns)
