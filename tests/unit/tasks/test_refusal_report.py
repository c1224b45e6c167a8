"""A refusal in `gyre eval`'s results: one line and its log's path; the refusal whole, raw output included, in the log
(issue 48)."""

from __future__ import annotations

from pathlib import Path

from gyre.driver.evaluation import EvalOptions, _log_refusals, markdown, summarize
from gyre.driver.rundir import RunDir


def test_a_long_multiline_refusal_is_one_line_in_the_results_and_whole_in_its_log(tmp_path: Path) -> None:
    raw = "\n".join(f"E   pytest line {i}: " + "x" * 80 for i in range(50))
    reason = (
        "task suite/t (reference): the hidden tests cannot be collected over its reference solution: "
        + "y" * 400
    )
    refusals = _log_refusals(RunDir(tmp_path), {"suite/t": f"{reason}\n{raw}"})
    refusal = refusals["suite/t"]
    assert refusal.log == "logs/refused/suite_t.log"  # a task id is never a path
    assert (tmp_path / refusal.log).read_text() == f"{reason}\n{raw}\n"
    assert refusal.reason.startswith("task suite/t (reference): ") and len(refusal.reason) == 300
    report = markdown(summarize(EvalOptions(suite="s", run_dir="r"), [], [], {}, 1.0, "m", refusals))
    lines = report.splitlines()
    assert lines[lines.index("## Refused at preflight") + 2 :] == [
        f"- suite/t: {refusal.reason} (log: [logs/refused/suite_t.log](logs/refused/suite_t.log))"
    ]
    assert "pytest line" not in report and "Not run (unsupported" not in report
    assert f"- suite/t: refused: {refusal.reason} (log: logs/refused/suite_t.log)" in lines  # Not a clean run
