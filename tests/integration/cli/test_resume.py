"""`gyre train --resume` after the driver is SIGKILLed mid-burst, mid-step and mid-weight-push: every execution in the
journal trains exactly once, none is run twice, the step in progress keeps the executions that had finished, and the
torn last lines a kill leaves in the journals (every one of them) are cut, never a crash.

The driver runs as its own process (``python -m gyre train``) and is killed at a moment read from what it writes:
the executions journal (mid-burst: some of step 0's executions finished, not all), the checkpoints (mid-step: all of
step 0's executions finished, its checkpoint not written) and the core cell's log (mid-push: version 1 is being
pushed to a serving cell). A modelled device for each (slow engine steps, a slow trainer, a slow weight transfer)
makes its moment seconds long on this machine; the resumed run keeps it (it is in the run's config.toml).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.driver.rundir import RunDir
from gyre.driver.training import Resume, StepRecord, Trainer, execution_index
from gyre.journal import read_journal
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

pytestmark = pytest.mark.slow(reason="kills a live gyre train at three moments and resumes each run")
STEPS, BATCH = 2, 4
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
agent_max_calls = 2
agent_max_tokens = 12

[cells]
count = 2
capacity_executions = 1
engine_overrides = ["engine.kv_cache_mem_gib=0.2"]
num_threads = 1

[trainer]
learning_rate = 1e-4
heartbeat_s = 0.25
{TRAINER_TOML}

[controller]
heartbeat_s = 0.25
{CONTROLLER_TOML}
"""
TORN = b'{"execution_id":"e000003.0/toy-'  # a line cut off mid-write


def finished(rd: RunDir) -> list[ExecutionResult]:
    return list(read_journal(rd.executions, ExecutionResult)) if rd.executions.exists() else []


def mid_burst(rd: RunDir) -> bool:
    return 1 <= len(finished(rd)) < BATCH - 1


def mid_step(rd: RunDir) -> bool:
    done = {execution_index(e.execution_id) for e in finished(rd)}
    return set(range(BATCH)) <= done and not rd.checkpoint(1).exists()


def mid_push(rd: RunDir) -> bool:
    log = rd.logs / "cell-0.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return "pushing version 1 " in text and "pushed version 1 " not in text


@pytest.mark.parametrize(
    ("moment", "mode", "modelled", "from_step"),
    [
        (
            mid_burst,
            "elastic",
            'cells.engine_overrides=["engine.kv_cache_mem_gib=0.2","engine.modelled_step_s=0.05"]',
            0,
        ),
        (mid_step, "elastic", "trainer.modelled_tokens_per_s=400", 0),
        (mid_push, "async", "trainer.modelled_push_s=4", 1),
    ],
    ids=["mid-burst", "mid-step", "mid-push"],
)
def test_a_killed_driver_resumes_and_trains_every_execution_once(
    moment: Callable[[RunDir], bool],
    mode: str,
    modelled: str,
    from_step: int,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    rd = RunDir(tmp_path / "run")
    driver = subprocess.Popen(
        [sys.executable, "-m", "gyre", "train", str(config), "--mode", mode, "--model", str(tiny_model),
         "--run-dir", str(rd.root), "--no-live", "--set", modelled],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not moment(rd):
            assert driver.poll() is None, "the run ended before the moment to kill it came"
            assert time.monotonic() < deadline, f"{moment.__name__} never came"
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        driver.kill()
    before = {e.execution_id for e in finished(rd)}
    assert moment(rd) or moment is mid_burst  # (a burst may finish an execution while we kill)
    assert not (rd.root / "train.json").exists()
    wait_gone(rd)  # the cells (and their engines) died with the driver
    torn = {}
    for journal in rd.journals():  # every journal's last line torn, as a kill mid-write leaves it
        lines = journal.read_bytes().splitlines(keepends=True)
        fragment = lines[-1][: max(1, len(lines[-1]) // 2)] if lines else TORN
        with open(journal, "ab") as f:
            f.write(fragment)
        torn[str(journal.relative_to(rd.root))] = len(fragment)
    assert {"journal/executions.jsonl", "journal/calls.jsonl", "switches.jsonl", "timeline.jsonl"} <= set(
        torn
    )

    if moment is mid_push:  # from Python
        assert Trainer.resume(rd.root).steps == STEPS
    else:
        assert main(["train", "--resume", str(rd.root), "--no-live"]) == 0

    (resumed,) = read_journal(rd.resumes, Resume)
    assert resumed.from_step == from_step
    assert resumed.cut == torn  # each torn line cut, whole, and nothing else
    steps = list(read_journal(rd.metrics, StepRecord))
    assert [s.step for s in steps] == list(range(STEPS))  # each step's line once, in order
    trained = Counter(i for s in steps for i in s.execution_ids)
    executions = finished(rd)
    indices = Counter(execution_index(e.execution_id) for e in executions)
    assert sorted(indices) == list(range(STEPS * BATCH)) and set(indices.values()) == {1}  # none ran twice
    assert set(trained.values()) == {1}  # none trained twice
    assert set(trained) == {e.execution_id for e in executions if e.trainable}  # every finished one trained
    assert before <= set(trained)  # the executions finished before the kill trained, not run again
    for s in steps:  # each in the step its index names
        assert {execution_index(i) // BATCH for i in s.execution_ids} <= {s.step}
    assert rd.checkpoint(STEPS).is_dir() and (rd.root / "report.html").exists()


def wait_gone(rd: RunDir, timeout_s: float = 30.0) -> None:
    """Until no process runs with the run's config (a cell) or model log directory (an engine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(rd.root) in cmdline(pid)]
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes outlived the killed driver: {alive}"
        time.sleep(0.1)


def cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
