"""`gyre report`: a run directory's journals become one self-contained page, also for a run that was killed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.journal import Journal
from gyre.protocol import StepMetrics, SwitchRecord
from gyre.training import StepRecord


def metrics(step: int) -> StepMetrics:
    return StepMetrics(step=step, version=step + 1, loss=0.1, tokens=100, computed_tokens=400, micro_steps=2,
                       clip_fraction=0.0, truncated_fraction=0.0, ratio_mean=1.0, ratio_std=0.0, ratio_min=1.0,
                       ratio_max=1.0, entropy=2.0, kl=0.0, grad_norm=0.5, lr=1e-4, staleness_mean=0.5,
                       staleness_max=1, seconds=1.5, by_member={"core": 2}, discarded=0, reclaimed=0)  # fmt: skip


def test_a_killed_runs_journals_make_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    steps = Journal(tmp_path, "metrics.jsonl")
    for k in range(3):
        steps.append(StepRecord(step=k, wall_s=10.0 * k, reward_mean=0.1 * k, reward_std=0.05, pass_rate=0.0,
                                executions=4, dropped=0, trainer=metrics(k), at_s=now + 10 * k))  # fmt: skip
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
    assert page.count("<tr>") == 1 + 3  # the header and the three whole steps; the torn line is skipped
    assert page.count("data:image/png;base64,") == 4 and "<script" not in page


def test_a_directory_that_is_not_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a gyre train run directory" in capsys.readouterr().err
