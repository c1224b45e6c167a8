"""The core cell (the optimizer and the weights) SIGKILLed mid-step under a live `gyre train`: the driver notices
within its cell timeout, stops with one clear error that names ``gyre train --resume RUN_DIR`` and exits 2, having
lost no record; ``--resume`` then completes the run with every execution trained exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.driver.rundir import RunDir
from gyre.driver.training import Resume, StepRecord, execution_index
from gyre.journal import read_journal
from gyre.protocol import SwitchRecord
from gyre.runtime.dispatch import ExecutionResult
from robust import TRAINER_TOML

pytestmark = [
    pytest.mark.slow(
        reason="kills the core of a live gyre train, waits out the cell timeout, resumes the run"
    ),
    pytest.mark.timeout(600),  # a run, its death and its resume: 105-110 s in CI
]
STEPS, BATCH = 2, 4
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
capacity_executions = 2
engine_overrides = ["engine.kv_cache_mem_gib=0.2"]
num_threads = 1

[trainer]
learning_rate = 1e-4
heartbeat_s = 0.25
modelled_tokens_per_s = 400
{TRAINER_TOML}

[controller]
heartbeat_s = 0.25
# the victim's timeout is also the healthy cell-1's (training in colocate) and, in the resumed run, every cell's
cell_timeout_s = 20
"""


def core_pid(rd: RunDir) -> int | None:
    """The ``gyre cell ... cell-0`` process of this run."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cell" in words and str(rd.config).encode() in words and b"cell-0" in words:
            return int(pid)
    return None


def core_training_step_1(rd: RunDir) -> bool:
    switches = (
        list(read_journal(rd.root / "switches.jsonl", SwitchRecord))
        if (rd.root / "switches.jsonl").exists()
        else []
    )
    mine = [s.direction for s in switches if s.cell == "cell-0"]
    return rd.checkpoint(1).is_dir() and len(mine) >= 3 and mine[-1] == "serve_to_train"


def test_a_dead_core_stops_the_run_at_once_with_a_resume_hint_and_resume_completes_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    rd = RunDir(tmp_path / "run")
    driver = subprocess.Popen(
        [sys.executable, "-m", "gyre", "train", str(config), "--mode", "colocate", "--model", str(tiny_model),
         "--run-dir", str(rd.root), "--no-live"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not core_training_step_1(rd):
            assert driver.poll() is None, "the run ended before the core trained step 1"
            assert time.monotonic() < deadline, "the core never trained step 1"
            time.sleep(0.05)
        pid = core_pid(rd)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # the cell timeout, then the core's trainer probe (20 s each), then a clean shut-down
        _, err = driver.communicate(timeout=180)
    finally:
        driver.kill()
    said = err.decode(errors="replace")
    assert driver.returncode == 2, said[-3000:]
    # stopped by the watch on the core cell (its message), not by a trainer timeout; no bound on the seconds, which
    # a loaded machine stretches
    assert "the core cell died (cell-0" in said and f"gyre train --resume {rd.root}" in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert [s.step for s in read_journal(rd.metrics, StepRecord)] == [0]  # step 1 never applied
    before = {e.execution_id for e in read_journal(rd.executions, ExecutionResult) if e.status != "cancelled"}

    assert main(["train", "--resume", str(rd.root), "--no-live"]) == 0

    (resumed,) = read_journal(rd.resumes, Resume)
    assert resumed.from_step == 1
    steps = list(read_journal(rd.metrics, StepRecord))
    assert [s.step for s in steps] == list(range(STEPS))
    assert all(s.trainer.micro_steps == sum(s.trainer.by_member.values()) > 0 for s in steps)
    executions = [e for e in read_journal(rd.executions, ExecutionResult) if e.status != "cancelled"]
    indices = Counter(execution_index(e.execution_id) for e in executions)
    assert sorted(indices) == list(range(STEPS * BATCH)) and set(indices.values()) == {1}  # none ran twice
    trained = Counter(i for s in steps for i in s.execution_ids)
    assert set(trained.values()) == {1}  # none trained twice
    assert set(trained) == {e.execution_id for e in executions if e.trainable}  # and none never
    assert before <= set(
        trained
    )  # what finished before the core died trained after the resume, not run again
