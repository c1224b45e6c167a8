"""`gyre report`: a run directory's journals become one self-contained page, also for a run that was killed."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec
import pytest

from gyre.cli import main
from gyre.driver.runreport import scores_by_step, write_report
from gyre.driver.training import StepRecord
from gyre.journal import Journal
from gyre.protocol import SwitchRecord
from unit.driver.runs import EVAL_AFTER, PLOTS, metrics, write_run


def plots(page: str) -> list[str]:
    """The headings of the plots the page shows, each with its inlined PNG."""
    return re.findall(r"<h2>([^<]*)</h2><img alt='[^']*' src='data:image/png;base64,[A-Za-z0-9+/=]+'>", page)


def rows(page: str, table: str) -> int:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', page, re.S)
    return body[1].count("<tr>") if body else 0


def test_a_whole_runs_journals_draw_every_plot(tmp_path: Path) -> None:
    page = write_report(write_run(tmp_path, steps=6)).read_text()
    assert plots(page) == PLOTS
    assert "Not drawn" not in page and "<script" not in page
    assert rows(page, "steps") == 6 and rows(page, "evals") == len(EVAL_AFTER)
    assert "cells idle 20% of the time" in page  # one cell of three idle 12 s of every 20 (timeline.jsonl)
    assert "<td>960</td>" in page  # a step's sampled tokens: 8 executions x 120 completion tokens


def test_a_killed_runs_journals_make_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    steps = Journal(tmp_path, "metrics.jsonl")
    for k in range(3):  # lines from before execution_ids and sampled_tokens; no executions, evals or timeline
        line = msgspec.to_builtins(StepRecord(step=k, wall_s=10.0 * k, reward_mean=0.1 * k, reward_std=0.05,
                                              pass_rate=0.0, executions=4, dropped=0, trainer=metrics(k),
                                              at_s=now + 10 * k))  # fmt: skip
        steps.append({key: v for key, v in line.items() if key not in ("execution_ids", "sampled_tokens")})
    steps.close()
    switches = Journal(tmp_path, "switches.jsonl")
    for n, (cell, direction) in enumerate([("cell-0", "serve_to_train"), ("cell-1", "serve_to_train"),
                                           ("cell-1", "train_to_serve")]):  # fmt: skip
        switches.append(SwitchRecord(switch=n + 1, cell=cell, direction=direction, started=now + n,  # type: ignore[arg-type]
                                     phases={"drain": 0.1, "release": 0.05}, total_s=0.15))  # fmt: skip
    switches.close()
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "wall_s"')  # the driver was killed mid-line
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert str(tmp_path / "report.html") in capsys.readouterr().out
    assert rows(page, "steps") == 3  # the torn line is skipped
    assert plots(page) == [PLOTS[0], PLOTS[3], PLOTS[6], PLOTS[7], PLOTS[8]]
    for absent in (PLOTS[1], PLOTS[2], PLOTS[4], PLOTS[5]):  # named as not drawn, not silently gone
        assert absent in page.split("Not drawn")[1]
    assert "<script" not in page and "Held-out evaluations" not in page


def test_partial_scores_are_the_rewards_of_the_executions_a_step_trained_on() -> None:
    trained = {0: ["a", "b"], 1: ["c", "not-journaled"], 2: []}  # step 2: a line from before execution_ids
    rewards = {"a": 0.25, "b": 1.0, "c": 0.5, "crashed": 0.0}
    assert scores_by_step(trained, rewards) == {0: [0.25, 1.0], 1: [0.5]}


def test_the_finished_runs_idle_fraction_is_the_one_shown(tmp_path: Path) -> None:
    write_run(tmp_path, steps=2)
    (tmp_path / "train.json").write_text('{"run_dir": "x", "steps": 2, "idle_fraction": 0.4}')
    assert "cells idle 40% of the time" in write_report(tmp_path).read_text()


def test_a_directory_that_is_not_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a gyre train run directory" in capsys.readouterr().err


def test_the_report_counts_chained_calls_branches_and_divergences(tmp_path: Path) -> None:
    from gyre.journal.records import CallRecord, CallTiming, Divergence

    calls = Journal(tmp_path / "journal", "calls.jsonl")
    timing = CallTiming(submitted_s=1.0, first_token_s=1.5, finished_s=2.0)
    for n, (parent, divergence) in enumerate([(None, None), ("c0", None), ("c1", Divergence(kind="reasoning", index=9)),
                                              (None, Divergence(kind="unchained", index=0))]):  # fmt: skip
        calls.append(CallRecord(call_id=f"c{n}", session="s", role="main", parent_call_id=parent,
                                prefix_len=5 if parent else 0, new_input_ids=[1, 2], output_ids=[3],
                                output_logprobs=[-0.5], finish_reason="stop", weight_version=0, cell="cell-0",
                                timing=timing, divergence=divergence))  # fmt: skip
    calls.close()
    page = write_report(tmp_path).read_text()
    assert "Model calls: 4, of which 2 extend an earlier call and 2 start a branch" in page
    assert "reasoning 1, unchained 1" in page
