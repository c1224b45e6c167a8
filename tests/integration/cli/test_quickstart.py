"""`gyre quickstart --short` (the README's main command, CI-sized) learns: the fixed held-out set scores higher after
SFT and RL than the untrained model did, the run directory holds every phase, and the report shows the curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.cli import main

pytestmark = pytest.mark.slow(
    reason="the whole quickstart recipe: demonstrations, SFT, RL and three held-out evaluations"
)


def test_the_short_quickstart_beats_the_untrained_model_on_the_held_out_set(
    tmp_path: Path, tiny_model: Path
) -> None:
    run = tmp_path / "quickstart"
    assert (
        main(["quickstart", "--short", "--run-dir", str(run), "--model", str(tiny_model), "--no-progress"])
        == 0
    )
    summary = json.loads((run / "quickstart.json").read_text())
    points = {p["phase"]: p for p in summary["points"]}
    assert list(points) == ["base", "sft", "rl"]
    base, rl = points["base"], points["rl"]
    assert base["mean"] < 0.05  # the untrained model does not even make the first call
    assert rl["mean"] > base["ci_high"] and rl["ci_low"] > base["mean"]  # learned, beyond the intervals
    for part in ("demos/results.json", "eval-base/results.json", "sft/sft.json", "train/eval.jsonl",
                 "train/report.html", "train/metrics.jsonl"):  # fmt: skip
        assert (run / part).is_file(), part
    report = (run / "train/report.html").read_text()
    assert "held-out" in report.lower()
