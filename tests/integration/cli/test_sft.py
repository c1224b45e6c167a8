"""`gyre sft` on the scripted expert's real calls: the expert's outputs become likelier, and what it writes is
a Gyre checkpoint (a model directory, and a training state to resume from); bad input is one clear line."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from gyre.cli import main
from gyre.config import TrainerConfig
from gyre.driver.sft import SftStep, SftSummary
from gyre.journal import Journal, read_journal
from gyre.journal.records import CallRecord, CallTiming, expand_inputs
from gyre.train.state import TrainState, load_model

TIMING = CallTiming(submitted_s=0.0, first_token_s=None, finished_s=0.0)


def demonstration_nll(model: Any, sessions: list[list[CallRecord]]) -> float:
    """Mean NLL of the expert's output tokens, each session one plain causal sequence (a chain of calls)."""
    nll: list[float] = []
    with torch.no_grad():
        for records in sessions:
            assert all(r.parent_call_id == p.call_id for p, r in itertools.pairwise(records))
            full = expand_inputs(records)
            ids = torch.tensor([full[records[-1].call_id] + records[-1].output_ids])
            logprobs = model(input_ids=ids).logits[0].log_softmax(-1)
            for r in records:
                nll += [-float(logprobs[p - 1, t]) for p, t in enumerate(r.output_ids, len(full[r.call_id]))]
    return sum(nll) / len(nll)


@pytest.mark.slow(reason="supervised training of the tiny model for tens of steps")
def test_gyre_sft_makes_the_experts_outputs_likelier_and_writes_a_checkpoint(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demos = tmp_path / "demos"
    eval_args = ["--suite", "toy:2", "--agent", "oracle", "--model-path", str(tiny_model), "--no-progress"]
    assert main(["eval", *eval_args, "--run-dir", str(demos)]) == 0
    calls = demos / "journal" / "calls.jsonl"
    records = list(read_journal(calls, CallRecord))
    with open(calls, "ab") as f:  # a crash mid-write leaves a torn last line
        f.write(calls.read_bytes()[:100])
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    config.write_text(
        f"[sft]\nmodel_path = {json.dumps(str(tiny_model))}\njournals = [{json.dumps(str(demos))}]\n"
        f"output_dir = {json.dumps(str(out))}\nepochs = 5\nbatch_sessions = 2\nlearning_rate = 1e-2\n"
    )
    capsys.readouterr()
    assert main(["sft", str(config), "--no-progress"]) == 0
    assert "gyre sft: 2 demonstration sessions" in capsys.readouterr().out

    summary = msgspec.json.decode((out / "sft.json").read_bytes(), type=SftSummary)
    steps = list(read_journal(out / "metrics.jsonl", SftStep))
    assert (summary.sessions, summary.calls, summary.steps, len(steps)) == (2, len(records), 5, 5)
    assert summary.journals == [str(calls)] and summary.skipped == {}
    assert steps[-1].loss < steps[0].loss and summary.loss_first == steps[0].loss
    checkpoint = Path(summary.checkpoint)
    assert checkpoint == out / "checkpoints" / "step-5" and (out / "config.toml").is_file()

    sessions: dict[str, list[CallRecord]] = defaultdict(list)
    for r in records:
        sessions[r.session].append(r)
    base, trained = load_model(tiny_model), load_model(checkpoint)
    before, after = (
        demonstration_nll(base, [*sessions.values()]),
        demonstration_nll(trained, [*sessions.values()]),
    )
    print(f"NLL of the expert's output tokens: {before:.3f} -> {after:.3f} nats")
    assert after < before - 1.0, (before, after)

    state = TrainState(TrainerConfig(model_path=str(tiny_model), resume_from=str(checkpoint)))
    assert (state.step, state.version) == (5, 5) and state.optimizer.state  # AdamW's moments came back
    for (name, p), (_, q) in zip(state.named, trained.named_parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.slow(reason="two SFT stages of the tiny model")
def test_a_window_stage_runs_first_at_its_own_learning_rate_and_the_checkpoint_counts_both_stages(
    tiny_model: Path, tmp_path: Path
) -> None:
    journal = Journal(tmp_path / "demos" / "journal")
    prompt = list(range(40, 100))  # shared by the sessions, longer than a window
    for session in ("s0", "s1"):
        length, parent = 0, None
        for turn in range(3):
            new_input, output = [*prompt, 7] if turn == 0 else [110 + turn, 111], [120 + turn, 121, 122, 123]
            call = f"{session}-{turn}"
            journal.append(CallRecord(call_id=call, session=session, role="main", parent_call_id=parent,
                                      prefix_len=length, new_input_ids=new_input, output_ids=output,
                                      output_logprobs=[0.0] * len(output), finish_reason="stop", weight_version=0,
                                      cell="scripted", timing=TIMING, source="scripted"))  # fmt: skip
            length, parent = length + len(new_input) + len(output), call
    journal.close()
    out = tmp_path / "sft"
    settings = ["window_tokens=16", "window_steps=8", "window_batch=4", "batch_sessions=1", "learning_rate=1e-2",
                "lr_warmup_steps=2"]  # fmt: skip
    args = ["--model", str(tiny_model), "--journal", str(tmp_path / "demos"), "--output-dir", str(out)]
    assert main(["sft", *args, "--epochs", "2", "--no-progress", *(f"--set=sft.{s}" for s in settings)]) == 0

    steps = list(read_journal(out / "metrics.jsonl", SftStep))
    assert [s.stage for s in steps] == ["window"] * 8 + ["full"] * 4
    assert [s.step for s in steps] == list(range(12))
    window, full = steps[:8], steps[8:]
    assert all(s.windows == 4 and s.tokens > 0 and s.computed_tokens <= 4 * 16 for s in window)
    assert [s.epoch for s in window] == [0, 0, 1, 2, 2, 3, 4, 4]  # passes over 6 windows, one per output
    assert [s.lr for s in window] == [5e-3] + [1e-2] * 7  # warm-up, then held
    assert full[0].lr == 1e-2 and full[0].lr > full[1].lr > full[3].lr  # the schedule decays over the epochs
    assert all(s.windows == 0 and s.sessions == 1 for s in full)
    assert window[-1].loss < window[0].loss

    summary = msgspec.json.decode((out / "sft.json").read_bytes(), type=SftSummary)
    assert (summary.steps, summary.window_steps, summary.window_windows) == (4, 8, 6)
    assert (summary.window_loss_first, summary.window_loss_last) == (window[0].loss, window[-1].loss)
    assert summary.loss_first == full[0].loss and summary.checkpoint == str(out / "checkpoints" / "step-12")
    load_model(summary.checkpoint)
    state = TrainState(TrainerConfig(model_path=str(tiny_model), resume_from=summary.checkpoint))
    assert (state.step, state.version) == (12, 12)

    alone = tmp_path / "windows-only"  # --epochs 0: the window stage alone, from the checkpoint just written
    args = ["--model", summary.checkpoint, "--journal", str(tmp_path / "demos"), "--output-dir", str(alone)]
    assert main(["sft", *args, "--epochs", "0", "--no-progress", *(f"--set=sft.{s}" for s in settings)]) == 0
    only = msgspec.json.decode((alone / "sft.json").read_bytes(), type=SftSummary)
    assert (only.steps, only.window_steps, only.epoch_losses) == (8, 8, [])
    assert only.loss_last == only.window_loss_last and (alone / "checkpoints" / "step-8").is_dir()


def test_gyre_sft_on_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def sft(*args: str) -> str:
        assert main(["sft", "--model", str(model), "--output-dir", str(tmp_path / "out"), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gyre sft: error: ") and err.count("\n") == 1 and "Traceback" not in err
        return err

    assert "nowhere does not exist" in sft("--journal", str(tmp_path / "nowhere"))
    journal = Journal(tmp_path / "run" / "journal")
    journal.append(CallRecord(call_id="c", session="s", role="main", new_input_ids=[1], output_ids=[2],
                              output_logprobs=[-0.5], finish_reason="stop", weight_version=0, cell="cell-0",
                              timing=TIMING))  # fmt: skip
    journal.close()
    assert "found: 1 policy" in sft("--journal", str(tmp_path / "run"))
    assert "set both" in sft("--journal", str(tmp_path / "run"), "--set", "sft.window_steps=3")
    assert "nothing to train" in sft("--journal", str(tmp_path / "run"), "--epochs", "0")
    assert not (tmp_path / "out").exists()
