"""`gyre eval`'s results for tasks preflight refused (issue 48): their own heading, the reason in one line with the
path of a log in the run directory that holds the refusal whole; the tools' raw output only in that log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.cli import EXIT_NOT_CLEAN, main

CHECK_42 = 'grep -qx 42 answer.txt || { echo "answer.txt holds $(cat answer.txt), expected 42"; exit 1; }'
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def task(suite: Path, task_id: str, verifier: str, solution: dict[str, str], tests: bool = False) -> None:
    """A Gyre task with a reference solution (and the hidden tests/test_calc.py)."""
    root = suite / task_id
    root.mkdir(parents=True)
    (root / "task.toml").write_text(f'id = "{task_id}"\ntime_budget_s = 60\n\n[verifier]\n{verifier}')
    (root / "instruction.md").write_text("Do it.\n")
    for rel, text in solution.items():
        (root / "solution" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "solution" / rel).write_text(text)
    if tests:
        (root / "tests").mkdir()
        (root / "tests" / "test_calc.py").write_text(TEST_CALC)


def pytest_verifier(command: str) -> str:
    return f'commands = [{json.dumps(command)}]\nresult = "junit"\ntimeout_s = 120'


def test_refusals_get_their_own_heading_a_one_line_reason_and_a_log(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    suite, run = tmp_path / "suite", tmp_path / "run"
    task(suite, "right", f"commands = [{json.dumps(CHECK_42)}]", {"answer.txt": "42\n"})
    # a reference that cannot be collected: pytest's ERRORS section, tens of lines, is the refusal's detail
    broken = "import sys\n\n\ndef f():\n    return sys\n\n\nraise RuntimeError('the reference is broken')\n"
    task(suite, "broken", pytest_verifier("pytest tests"), {"calc.py": broken}, tests=True)
    # its command names a test file the hidden tests do not include
    solved = {"calc.py": "add = int.__add__\n"}
    task(suite, "gone", pytest_verifier("pytest tests/test_gone.py"), solved, tests=True)
    code = main(["eval", "--suite", str(suite), "--agent", "oracle", "--model-path", str(tiny_model),
                 "--run-dir", str(run), "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == EXIT_NOT_CLEAN
    report = (run / "results.md").read_text()
    lines = report.splitlines()
    assert "## Refused at preflight" in lines and "Not run (unsupported" not in report, report
    refused = lines[lines.index("## Refused at preflight") + 2 :]
    assert [line.split(":")[0] for line in refused] == ["- broken", "- gone"], report
    for task_id, line in zip(("broken", "gone"), refused[:2], strict=True):
        log = f"logs/refused/{task_id}.log"
        assert line.endswith(f"(log: [{log}]({log}))") and len(line) < 500, line
        assert (run / log).is_file()
    assert "(reference): the hidden tests cannot be collected over its reference solution" in refused[0]
    assert "(test command): `pytest tests/test_gone.py` names tests/test_gone.py" in refused[1]
    # the raw pytest output: whole in the log, nowhere in results.md
    raw = (run / "logs" / "refused" / "broken.log").read_text()
    assert "RuntimeError: the reference is broken" in raw and "ERROR collecting tests/test_calc.py" in raw
    raw_lines = [line.strip() for line in raw.splitlines()[1:] if len(line.strip()) > 12]
    assert len(raw_lines) >= 10, raw
    leaked = [line for line in raw_lines if line in report]
    assert leaked == [] and "RuntimeError" not in report and "=====" not in report, leaked
    # the problems (results.md and the terminal) name each refusal in one line, with its log
    results = json.loads((run / "results.json").read_text())
    problems = [p for p in results["problems"] if ": refused: " in p]
    assert [p.split(":")[0] for p in problems] == ["broken", "gone"], results["problems"]
    assert all(p.endswith(f"(log: logs/refused/{p.split(':')[0]}.log)") for p in problems), problems
    assert results["refused"]["gone"]["log"] == "logs/refused/gone.log" and results["unsupported"] == {}
    assert "RuntimeError" not in out and "logs/refused/" in out
    assert results["executions"] == 1 and results["mean_score"] == 1.0
