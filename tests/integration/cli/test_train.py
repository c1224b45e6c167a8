"""`gyre train` on the tiny model, CI-sized, in each mode: every step applied and the run directory complete."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.driver.training import StepRecord, TrainSummary
from gyre.journal import read_journal
from gyre.protocol import SwitchRecord
from gyre.runtime.dispatch import ExecutionResult
from robust import CONTROLLER_TOML, TRAINER_TOML

OTHER_MODES = pytest.mark.slow(reason="gyre train in a further mode; the fast tier runs elastic")
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
agent_max_tokens = 16

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
"""


@pytest.mark.parametrize(
    "variant",
    [
        "elastic",
        *(pytest.param(m, marks=OTHER_MODES) for m in ("colocate", "async", "elastic+carry")),
    ],
)
def test_gyre_train_runs_its_steps_in_each_mode(
    variant: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    mode, _, carry = variant.partition("+")
    argv = ["train", str(config), "--mode", mode, "--model", str(tiny_model), "--run-dir", str(run_dir)]
    assert main([*argv, *(["--set", "controller.carry_over=true"] if carry else [])]) == 0
    assert f"2 steps ({mode})" in capsys.readouterr().out

    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.steps == 2 and summary.failed_executions == 0 and summary.mode == mode
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1] and all(s.executions == 4 for s in steps)
    assert all(s.trainer.micro_steps > 0 and s.trainer.version == s.step + 1 for s in steps)
    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len({e.execution_id for e in executions}) == 4 * 2  # every execution once, each with its calls
    trained = [x for s in steps for x in s.execution_ids]  # with carry-over too: each in exactly one step
    assert len(trained) == len(set(trained)) and set(trained) <= {e.execution_id for e in executions}
    assert all(e.records and e.verdict is not None for e in executions)
    assert (run_dir / "journal" / "calls.jsonl").stat().st_size > 0
    for step in (1, 2):  # a Hugging Face checkpoint after every step
        assert (
            json.loads((run_dir / "checkpoints" / f"step-{step}" / "trainer_state.json").read_text())["step"]
            == step
        )
    switches = list(read_journal(run_dir / "switches.jsonl", SwitchRecord))
    assert not any(s.error for s in switches)
    if mode in ("async", "onestep"):  # the core trains from the start, the other cell serves throughout
        assert [(s.cell, s.direction) for s in switches] == [("cell-0", "serve_to_train")]
    elif mode == "colocate":  # all sample, then all train, every step
        assert {s.direction for s in switches} == {"serve_to_train", "train_to_serve"}
    else:  # the core first; whether cells come back between steps depends on the water level
        assert switches[0].cell == "cell-0" and switches[0].direction == "serve_to_train"
    assert "[run]" in (run_dir / "config.toml").read_text()
    assert {"reward/mean", "train/loss", "train/staleness_mean"} <= scalar_tags(run_dir / "tensorboard")
    page = (run_dir / "report.html").read_text()
    assert (
        page.count("data:image/png;base64,") >= 3 and "<script" not in page
    )  # self-contained, opens offline
    assert "Reward per step" in page and "Cell roles over time" in page


def scalar_tags(directory: Path) -> set[str]:
    """The scalar tags in a directory's TensorBoard event files (TFRecord framing, Event protos)."""
    from tensorboardX.proto.event_pb2 import Event

    tags: set[str] = set()
    for path in directory.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            length = struct.unpack("<Q", data[at : at + 8])[0]
            event = Event.FromString(data[at + 12 : at + 12 + length])
            tags |= {v.tag for v in event.summary.value}
            at += 12 + length + 4
    return tags


# A scaffold of its own: the official openai client, two turns through its router session, an answer file.
SCAFFOLD = """
import os, openai
client, messages = openai.OpenAI(), [{"role": "user", "content": os.environ["GYRE_TASK"]}]
for _ in range(2):
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, max_tokens=12)
    text = reply.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
    open("answer.txt", "w").write(text)
"""


@pytest.mark.slow(reason="gyre train of a command scaffold in sandboxes, with a held-out evaluation")
def test_a_command_scaffold_trains_and_a_held_out_suite_is_evaluated_with_intervals(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex
    import sys

    from gyre.driver.training import EvalPoint

    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    agent = f"command:{shlex.join([sys.executable, '-c', SCAFFOLD])}"
    argv = ["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir),
            "--set", f"run.agent={json.dumps(agent)}", "--set", 'run.eval_suite="toy:4:9"',
            "--set", "run.eval_every=1", "--set", "run.eval_tasks=2", "--set", "run.eval_samples=2"]  # fmt: skip
    assert main(argv) == 0
    assert "held-out" in capsys.readouterr().out

    executions = list(read_journal(run_dir / "journal" / "executions.jsonl", ExecutionResult))
    assert len(executions) == 8 and all(e.status == "done" and len(e.records) == 2 for e in executions)
    assert all(e.records[1].parent_call_id == e.records[0].call_id for e in executions)  # one growing session
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert all(
        s.trainer.micro_steps > 0 and s.trainer.tokens > 0 and len(s.execution_ids) == 4 for s in steps
    )

    evals = list(read_journal(run_dir / "eval.jsonl", EvalPoint))
    assert [e.step for e in evals] == [0, 1, 2]  # before training, after each step
    assert all(e.executions == 4 and e.ci_low <= e.mean <= e.ci_high for e in evals)
    held_out = list(read_journal(run_dir / "eval" / "executions.jsonl", ExecutionResult))
    assert len(held_out) == 12 and all(e.execution_id.startswith("eval-") for e in held_out)
    assert all(len(e.records) == 2 for e in held_out) and not any(
        e.failed for e in evals
    )  # served every time
    summary = msgspec.json.decode((run_dir / "train.json").read_bytes(), type=TrainSummary)
    assert summary.eval_first == evals[0].mean and summary.eval_last == evals[-1].mean
    assert "Held-out eval (95% interval)" in (run_dir / "report.html").read_text()


@pytest.mark.slow(reason="gyre train with Megatron cells of two tensor-parallel ranks each")
def test_gyre_train_with_megatron_cells_of_two_tensor_parallel_ranks(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Each cell's trainer is a two-process Megatron member; the elastic steps apply and engines get the weights."""
    pytest.importorskip("megatron.core")
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.replace("[trainer]\n", '[trainer]\nbackend = "megatron"\ntensor_parallel = 2\n'))
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir)]) == 0
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert all(s.trainer.micro_steps > 0 and s.trainer.version == s.step + 1 for s in steps)
    members = {m for s in steps for m in s.trainer.by_member}
    assert members, "no member computed"
    switches = list(read_journal(run_dir / "switches.jsonl", SwitchRecord))
    assert not any(s.error for s in switches)
    back = [s for s in switches if s.direction == "train_to_serve"]
    assert all(s.version >= 1 for s in back)  # a cell that trained serves the new weights


@pytest.mark.slow(reason="gyre train with a core cell of two ranks (trainer.ranks = 2)")
def test_gyre_train_with_a_core_cell_of_two_ranks(tiny_model: Path, tmp_path: Path) -> None:
    """The core cell's optimizer state is split over two ranks; the elastic steps apply, every rank holds its half of
    the checkpoint's optimizer state, and the trained cell serves the new weights."""
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.replace("[trainer]\n", "[trainer]\nranks = 2\n"))
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--model", str(tiny_model), "--run-dir", str(run_dir)]) == 0
    steps = list(read_journal(run_dir / "metrics.jsonl", StepRecord))
    assert [s.step for s in steps] == [0, 1]
    assert all(s.trainer.micro_steps > 0 and s.trainer.version == s.step + 1 for s in steps)
    assert len(list((run_dir / "checkpoints" / "step-2" / "optimizer").glob("*.distcp"))) == 2  # one per rank
    switches = list(read_journal(run_dir / "switches.jsonl", SwitchRecord))
    assert not any(s.error for s in switches)
    assert all(s.version >= 1 for s in switches if s.direction == "train_to_serve")
