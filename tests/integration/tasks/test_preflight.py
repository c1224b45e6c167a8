"""Preflight refuses a task whose test command cannot find its tests, with or without a reference solution, and says
which path is missing (issue 48): otherwise every workspace, a perfect one included, scores 0 and is trained on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gyre.errors import TaskError
from gyre.tasks import Task, Verdict, Verifier, load_task

TESTS = {
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_negative():\n    assert add(-1, -1) == -2\n"
}
SOLVED = {"calc.py": "def add(a, b):\n    return a + b\n"}


def nl2repo(root: Path, commands: list[str], tests: dict[str, str] = TESTS, solved: bool = False) -> Task:
    """An NL2RepoBench task directory (no environment section: the driver's Python grades it)."""
    root.mkdir(parents=True)
    (root / "start.md").write_text("Write calc.add.\n")
    (root / "test_commands.json").write_text(json.dumps(commands))
    (root / "test_files.json").write_text(json.dumps(sorted(tests)))
    (root / "test_case_count.txt").write_text("2")
    _write(root, tests)
    if solved:
        _write(root / "solution", SOLVED)
    return load_task(root)


def gyre(root: Path, command: str, solved: bool = False) -> Task:
    """A Gyre task directory graded by the pytest ``command``."""
    root.mkdir(parents=True)
    verifier = f'[verifier]\ncommands = [{json.dumps(command)}]\nresult = "junit"\ntimeout_s = 120\n'
    (root / "task.toml").write_text(f'id = "{root.name}"\n\n{verifier}')
    (root / "instruction.md").write_text("Write calc.add.\n")
    (root / "workspace").mkdir()
    _write(root, TESTS)
    if solved:
        _write(root / "solution", SOLVED)
    return load_task(root)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def preflight(task: Task, verifier: Verifier | None = None) -> str | None:
    """Why preflight refused ``task`` (None: it passed)."""
    try:
        asyncio.run((verifier or Verifier(retries=0)).preflight(task))
    except TaskError as exc:
        return str(exc)
    return None


def verify_solved(task: Task, tmp_path: Path, verifier: Verifier) -> Verdict:
    """The verdict on a perfect workspace."""
    workspace = tmp_path / "perfect"
    _write(workspace, SOLVED)
    return asyncio.run(verifier.verify(task, workspace))


def test_an_nl2repo_command_naming_a_missing_test_file_is_refused_without_a_reference(tmp_path: Path) -> None:
    task = nl2repo(tmp_path / "t", ["pytest --continue-on-collection-errors tests/test_calcs.py"])
    assert not task.solution_files
    verifier = Verifier(retries=0)
    why = preflight(task, verifier)
    assert why is not None, "preflight passed a task whose tests pytest cannot find"
    first = why.splitlines()[0]
    assert first.startswith("task t (test command): ") and "names tests/test_calcs.py" in first, why
    assert "file or directory not found" in first and len(why.splitlines()) == 1, why
    # a perfect workspace is not scored 0 and trained on: what preflight refuses is never scored
    verdict = verify_solved(task, tmp_path, verifier)
    assert verdict.outcome == "dropped" and not verdict.trainable and "tests/test_calcs.py" in verdict.detail


@pytest.mark.parametrize("solved", [False, True], ids=["no-reference", "reference"])
def test_a_gyre_command_naming_a_missing_test_file_is_refused(tmp_path: Path, solved: bool) -> None:
    task = gyre(tmp_path / "g", "python -m pytest -q tests/test_calc.py tests/test_gone.py::test_x", solved)
    why = preflight(task)
    assert why is not None and why.startswith("task g (test command): "), why
    assert "names tests/test_gone.py::test_x" in why.splitlines()[0], why


def test_well_formed_tasks_without_a_reference_still_pass_and_score(tmp_path: Path) -> None:
    """Neither format's command is refused when it finds its tests, nor one that also names the agent's own module
    (doctests): only the agent's work provides it, so its absence over the starting files says nothing."""
    verifier = Verifier(retries=0)
    tasks = [
        nl2repo(tmp_path / "n", ["pytest --continue-on-collection-errors tests"]),
        gyre(tmp_path / "g", "pytest tests/test_calc.py"),
        gyre(tmp_path / "d", "pytest --doctest-modules calc.py tests"),
    ]
    for task in tasks:
        assert not task.solution_files
        assert preflight(task, verifier) is None, task.id
        verdict = verify_solved(task, tmp_path / task.id, verifier)
        assert (verdict.outcome, verdict.score) == ("scored", 1.0), (task.id, verdict.detail)


def test_a_command_that_collects_nothing_is_refused(tmp_path: Path) -> None:
    """Hidden tests pytest never collects (not named test_*.py): every workspace would score 0 (pytest exit 5)."""
    tests = {"tests/check_calc.py": TESTS["tests/test_calc.py"]}
    task = nl2repo(tmp_path / "t", ["pytest tests"], tests)
    why = preflight(task)
    assert why is not None and "`pytest tests` collects no tests (pytest exit 5)" in why, why
