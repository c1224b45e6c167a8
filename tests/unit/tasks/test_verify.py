"""The verifier: scores from artifacts in a fresh bubblewrap sandbox, never fooled by the agent, retries, drops."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gyre.config import SandboxConfig
from gyre.errors import SandboxError, TaskError
from gyre.sandbox import Sandbox, make_sandbox
from gyre.tasks import Task, Verdict, Verifier, VerifierSpec, load_task
from gyre.tasks.verify import count_junit

DATA = Path(__file__).parent / "data"

TWO_OF_THREE = """\
from calc import add


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-1, -1) == -2


def test_add_strings():
    assert add("a", 1) == "a1"
"""


def verify(task: Task, workspace: Path | None, verifier: Verifier | None = None) -> Verdict:
    return asyncio.run((verifier or Verifier(retry_delay_s=0.01)).verify(task, workspace))


def workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "ws"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def nl2repo(tmp_path: Path, commands: list[str], declared: int, tests: dict[str, str]) -> Task:
    root = tmp_path / "task"
    (root / "tests").mkdir(parents=True)
    (root / "start.md").write_text("Write calc.add.")
    (root / "test_commands.json").write_text(json.dumps(commands))
    (root / "test_files.json").write_text(json.dumps(sorted(tests)))
    (root / "test_case_count.txt").write_text(str(declared))
    for rel, text in tests.items():
        (root / rel).write_text(text)
    return load_task(root)


SOLVED = {"calc.py": "def add(a, b):\n    return a + b\n"}


def test_junit_counts_passed_failed_errors_and_skipped() -> None:
    report = b"""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="ok"/>
      <testcase classname="tests.test_a" name="bad"><failure message="x"/></testcase>
      <testcase classname="tests.test_a.TestX" name="err"><error message="y"/></testcase>
      <testcase classname="tests.test_a" name="skip"><skipped/></testcase>
      <testcase classname="tests.test_mine" name="agent_added"/>
    </testsuite></testsuites>"""
    assert count_junit(report) == {"passed": 2, "failed": 2, "skipped": 1}
    assert count_junit(report, frozenset({"test_a"})) == {"passed": 1, "failed": 2, "skipped": 1}


def test_gyre_task_scores_what_the_workspace_holds(tmp_path: Path) -> None:
    task = load_task(DATA / "gyre-add")
    stub = verify(task, workspace(tmp_path / "a", task.files))
    assert (stub.outcome, stub.score, stub.passed, stub.failed) == ("scored", 0.0, 0, 1)
    assert "NotImplementedError" in stub.detail  # the verifier's output says why
    solved = verify(task, workspace(tmp_path / "b", SOLVED))
    assert (solved.outcome, solved.score, solved.passed, solved.attempts) == ("scored", 1.0, 1, 1)


def test_nl2repo_partial_score_from_junit_in_a_shell(tmp_path: Path) -> None:
    # `&&` and `>` need a shell (the published grader's command splitting breaks them)
    task = nl2repo(
        tmp_path,
        ["echo graded > marker.txt && python -m pytest tests"],
        4,
        {"tests/test_calc.py": TWO_OF_THREE},
    )
    verdict = verify(task, workspace(tmp_path, SOLVED))
    assert (verdict.passed, verdict.failed, verdict.declared) == (2, 1, 4)
    assert verdict.score == pytest.approx(0.5)  # min(passed / declared, 1)
    capped = nl2repo(tmp_path / "c", ["python -m pytest tests"], 1, {"tests/test_calc.py": TWO_OF_THREE})
    assert verify(capped, workspace(tmp_path / "c", SOLVED)).score == 1.0


def test_agent_cannot_inflate_its_score(tmp_path: Path) -> None:
    task = nl2repo(tmp_path, ["python -m pytest tests"], 3, {"tests/test_calc.py": TWO_OF_THREE})
    forged = '<testsuite><testcase classname="tests.test_calc" name="x"/></testsuite>'
    cheat = {
        **{"calc.py": "def add(a, b):\n    raise NotImplementedError\n"},
        # extra tests of its own in the hidden tests' directory and beside it: not counted
        "tests/test_calc.py": "def test_a():\n    pass\n",
        "tests/test_more.py": "".join(f"def test_{i}():\n    pass\n" for i in range(10)),
        "test_extra.py": "def test_x():\n    pass\n",
        # a conftest that turns every failure into a pass: removed before grading
        "conftest.py": (
            "import pytest\n@pytest.hookimpl(wrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    rep = yield\n    rep.outcome = 'passed'\n    return rep\n"
        ),
        # a report written in advance: removed, pytest writes its own
        ".gyre-verifier/junit-0.xml": forged,
    }
    verdict = verify(task, workspace(tmp_path, cheat))
    assert (verdict.score, verdict.passed) == (0.0, 0)


def test_packaging_the_grader_ships_replaces_the_agents(tmp_path: Path) -> None:
    check = (
        "from pathlib import Path\n\n"
        "def test_packaging_is_the_graders():\n"
        "    assert not Path('setup.py').exists() and not Path('setup.cfg').exists()\n"
        "    assert 'grader' in Path('pyproject.toml').read_text()\n"
    )
    task = nl2repo(
        tmp_path,
        ["pytest tests"],
        1,
        {"tests/test_pack.py": check, "pyproject.toml": "# grader\n[tool.pytest.ini_options]\n"},
    )
    agent = {"setup.py": "raise SystemExit(1)\n", "setup.cfg": "[x]\n", "pyproject.toml": "# agent\n"}
    assert verify(task, workspace(tmp_path, agent)).score == 1.0


def test_harbor_reward_file_under_logs(tmp_path: Path) -> None:
    task = load_task(DATA / "harbor-hello")
    assert verify(task, workspace(tmp_path / "a", {"hello.txt": "hello world\n"})).score == 1.0
    verdict = verify(task, workspace(tmp_path / "b", {"hello.txt": "bye\n"}))
    assert (verdict.outcome, verdict.score) == ("scored", 0.0)


def test_a_hung_verifier_is_a_legitimate_zero(tmp_path: Path) -> None:
    spec = VerifierSpec(commands=("sleep 30",), result="exit_code", timeout_s=1.0)
    verdict = verify(Task(id="t", instruction="x", verifier=spec), workspace(tmp_path, {"a": "1"}))
    assert (verdict.outcome, verdict.score, verdict.timed_out) == ("scored", 0.0, True)


def test_nothing_to_evaluate_is_a_placeholder_and_no_verifier_is_unscored(tmp_path: Path) -> None:
    task = load_task(DATA / "gyre-add")
    verifier = Verifier()
    placeholder = verify(task, None, verifier)
    assert (placeholder.outcome, placeholder.score, placeholder.trainable) == ("placeholder", 0.0, True)
    unscored = verify(Task(id="free", instruction="x"), workspace(tmp_path, {"a": "1"}), verifier)
    assert (unscored.outcome, unscored.trainable) == ("unscored", False)
    assert verifier.statistics().by_outcome == {"placeholder": 1, "unscored": 1}


def test_unsupported_task_is_refused(tmp_path: Path) -> None:
    task = load_task(DATA / "harbor-image")
    with pytest.raises(TaskError, match="container image"):
        verify(task, workspace(tmp_path, {}))


class FlakySandboxes:
    """A sandbox factory whose first ``failures`` sandboxes fail to start (an injected infrastructure failure)."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(
        self, cfg: SandboxConfig, ws: Path, binds: Sequence[tuple[str, str, bool]], **kwargs: Any
    ) -> Sandbox:
        self.calls += 1
        if self.calls <= self.failures:
            raise SandboxError("injected: cannot create the sandbox's namespaces")
        return make_sandbox(cfg, ws, binds, **kwargs)


def test_infrastructure_failure_is_retried_then_scored(tmp_path: Path) -> None:
    flaky = FlakySandboxes(failures=2)
    verifier = Verifier(retries=2, retry_delay_s=0.01, sandbox_factory=flaky)
    verdict = verify(load_task(DATA / "gyre-add"), workspace(tmp_path, SOLVED), verifier)
    assert (verdict.outcome, verdict.score, verdict.attempts) == ("scored", 1.0, 3)
    assert verifier.statistics().retries == 2


def test_infrastructure_failure_past_the_budget_is_dropped_and_counted(tmp_path: Path) -> None:
    verifier = Verifier(retries=1, retry_delay_s=0.01, sandbox_factory=FlakySandboxes(failures=99))
    task = load_task(DATA / "gyre-add")
    verdict = verify(task, workspace(tmp_path, SOLVED), verifier)
    assert (verdict.outcome, verdict.score, verdict.attempts, verdict.trainable) == ("dropped", 0.0, 2, False)
    assert "injected" in verdict.detail and "attempt 2" in verdict.detail
    # a grader tool that does not exist is infrastructure too, and so is a junit verifier that wrote no report
    missing_tool = Task(
        id="t", instruction="x", verifier=VerifierSpec(commands=("no-such-grader",), result="junit")
    )
    assert verify(missing_tool, workspace(tmp_path / "m", {"a": "1"}), verifier).outcome == "dropped"
    no_report = Task(id="t", instruction="x", verifier=VerifierSpec(commands=("true",), result="junit"))
    assert verify(no_report, workspace(tmp_path / "n", {"a": "1"}), verifier).outcome == "dropped"
    assert verifier.statistics().by_outcome == {"dropped": 3}


def test_the_agents_workspace_is_left_as_it_was(tmp_path: Path) -> None:
    ws = workspace(tmp_path, SOLVED)
    verify(load_task(DATA / "gyre-add"), ws)
    assert sorted(p.name for p in ws.iterdir()) == ["calc.py"]


def test_anything_the_verifier_raises_is_that_executions_dropped_verdict(tmp_path: Path) -> None:
    def deep(cfg: SandboxConfig, ws: Path, binds: Sequence[tuple[str, str, bool]], **kwargs: Any) -> Sandbox:
        raise RecursionError("maximum recursion depth exceeded")  # as a walk of a 1,200-deep workspace did

    verifier = Verifier(retries=0, sandbox_factory=deep)
    verdict = verify(load_task(DATA / "gyre-add"), workspace(tmp_path, SOLVED), verifier)
    assert (verdict.outcome, verdict.trainable) == ("dropped", False)
    assert "RecursionError" in verdict.detail and verifier.statistics().by_outcome == {"dropped": 1}


def test_a_workspace_past_its_quota_is_not_copied_for_grading(tmp_path: Path) -> None:
    """The verifier's copy out is bounded by the workspace quotas: past them it is refused before copying (no
    retries: the workspace's doing), scored 0 with the quota named and trained on (issue 31: it was dropped, an
    escape from a 0)."""
    ws = workspace(tmp_path, {**SOLVED, **{f"junk/{i}": "x" for i in range(40)}})
    verifier = Verifier(retries=2, retry_delay_s=0.01, sandbox=SandboxConfig(max_inodes=20))
    verdict = verify(load_task(DATA / "gyre-add"), ws, verifier)
    assert (verdict.outcome, verdict.score, verdict.attempts, verdict.trainable) == ("scored", 0.0, 1, True)
    assert "max_inodes" in verdict.detail, verdict.detail
    roomy = Verifier(retry_delay_s=0.01, sandbox=SandboxConfig(max_inodes=100))
    assert verify(load_task(DATA / "gyre-add"), ws, roomy).score == 1.0


def test_only_the_pytest_plugins_a_task_declares_are_loaded(tmp_path: Path) -> None:
    inner = (
        "def test_inner(pytester):\n"
        "    pytester.makepyfile('def test_ok():\\n    assert True\\n')\n"
        "    pytester.runpytest().assert_outcomes(passed=1)\n"
    )
    spec = VerifierSpec(commands=("pytest tests",), result="junit", declared_test_count=1)
    task = Task(id="p", instruction="x", hidden_files={"tests/test_p.py": inner}, verifier=spec)
    undeclared = verify(task, workspace(tmp_path / "a", {"a": "1"}))
    assert (undeclared.outcome, undeclared.score) == ("scored", 0.0)
    assert "fixture 'pytester' not found" in undeclared.detail
    declared = msgspec.structs.replace(
        task, verifier=msgspec.structs.replace(spec, pytest_plugins=("pytester",))
    )
    verdict = verify(declared, workspace(tmp_path / "b", {"a": "1"}))
    assert (verdict.outcome, verdict.score) == ("scored", 1.0), verdict.detail


def test_library_decorated_tests_and_fixtures_are_not_mistaken_for_tampering(tmp_path: Path) -> None:
    # hypothesis, functools.wraps and lru_cache wrap a test's or a helper's code: what they wrap is checked instead
    tests = textwrap.dedent(
        """
        import functools
        from unittest import mock

        import pytest
        from hypothesis import given, settings, strategies as st

        from calc import add


        @functools.lru_cache
        def expected(a, b):
            return a + b


        @pytest.fixture
        def two():
            return 2


        @settings(max_examples=5, database=None)
        @given(st.integers(), st.integers())
        def test_commutes(a, b):
            assert add(a, b) == add(b, a)


        @mock.patch("os.getcwd", lambda: "/")
        def test_with_two(two):
            assert add(two, 3) == expected(two, 3)


        class TestAdd:
            def test_zero(self):
                assert add(0, 0) == 0
        """
    )
    spec = VerifierSpec(commands=("pytest tests",), result="junit", declared_test_count=3)
    task = Task(id="d", instruction="x", hidden_files={"tests/test_calc.py": tests}, verifier=spec)
    verdict = verify(task, workspace(tmp_path, SOLVED))
    assert (verdict.outcome, verdict.score) == ("scored", 1.0), verdict.detail


@pytest.mark.slow(reason="grades the shapes of every shipped real suite (10 s)")
def test_the_shapes_of_real_suites_are_not_mistaken_for_tampering(tmp_path: Path) -> None:
    """What real NL2RepoBench suites do (freezegun, tenacity, pyquery, boto, funcy, six, more-itertools): a class
    decorated by the implementation, which wraps every method; a helper method decorated by it; tests inherited from
    a mixin in another hidden file; a test imported from another hidden file; the builtins module's metadata rebound;
    unittest subtests (pytest's own report type); a test running a pytest session of its own in the process
    (ipytest's: its session ended the grader's report); a dataclass's and a NamedTuple's generated methods (deepdiff,
    fastapi-users); the pytest a test starts in a subprocess gets the task's pytest variables, not the grader's
    (pytest-cov's suite: its subprocesses could not load the plugin under test); a test that monkeypatches
    sys.modules to {} (structlog's: the grader's check imported through it, crashed, and ended the session). Each graded as written: 1.0 solved, a failing subtest fails
    its test."""
    implementation = {
        "calc.py": textwrap.dedent(
            """
            import functools

            def add(a, b):
                return a + b

            def traced(thing):
                if isinstance(thing, type):
                    for name, value in list(vars(thing).items()):
                        if callable(value) and name.startswith(("test", "_")) and not name.startswith("__"):
                            setattr(thing, name, traced(value))
                    return thing

                @functools.wraps(thing)
                def wrapper(*args, **kwargs):
                    return thing(*args, **kwargs)
                return wrapper
            """
        )
    }
    tests = {
        "tests/__init__.py": "",
        "tests/base.py": textwrap.dedent(
            """
            from calc import add

            class AddMixin:
                def test_inherited(self):
                    assert add(1, 1) == 2

            def test_from_helper():
                assert add(2, 2) == 4
            """
        ),
        "tests/test_shapes.py": textwrap.dedent(
            """
            import builtins
            import dataclasses
            import importlib.machinery
            import os
            import sys
            import typing
            import unittest

            import pytest

            from calc import add, traced
            from .base import AddMixin


            @traced
            class TestWholeClass:
                def test_wrapped(self):
                    assert add(1, 2) == 3


            class TestHelper:
                @traced
                def _helper(self):
                    return add(3, 4)

                def test_helper(self):
                    assert self._helper() == 7


            class TestInherits(unittest.TestCase, AddMixin):
                pass


            @dataclasses.dataclass(frozen=True)
            class Pair:
                a: int
                b: int

                def total(self):
                    return add(self.a, self.b)


            class Point(typing.NamedTuple):
                x: int = 0


            def test_generated_methods():
                assert Pair(1, 2).total() == 3 and Point(4).x == 4


            def test_from_helper():
                pass


            from .base import test_from_helper  # noqa: E402,F811


            def test_module_metadata():
                builtins.__spec__ = importlib.machinery.ModuleSpec("builtins", None)
                assert add(0, 0) == 0


            class TestSubtests(unittest.TestCase):
                def test_cases(self):
                    for a in range(3):
                        with self.subTest(a=a):
                            self.assertEqual(add(a, 0), a)


            def test_an_empty_module_registry(monkeypatch):
                monkeypatch.setattr(sys, "modules", {})


            def test_its_subprocesses_run_pytest_ungraded():
                assert "gyre_grader" not in os.environ.get("PYTEST_ADDOPTS", "")
                assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ


            def test_a_session_of_its_own(tmp_path):
                (tmp_path / "test_inner.py").write_text("def test_x():\\n    assert True\\n")
                assert pytest.main([str(tmp_path / "test_inner.py"), "-q", "-p", "no:cacheprovider"]) == 0
            """
        ),
    }
    spec = VerifierSpec(commands=("pytest tests",), result="junit", declared_test_count=10)
    task = Task(id="shapes", instruction="x", hidden_files=tests, verifier=spec)
    verdict = verify(task, workspace(tmp_path / "solved", implementation))
    assert (verdict.outcome, verdict.score) == ("scored", 1.0), verdict.detail
    wrong = {
        "calc.py": implementation["calc.py"].replace(
            "return a + b", "return a + b if (a, b) != (2, 0) else 0"
        )
    }
    verdict = verify(task, workspace(tmp_path / "wrong", wrong))  # only the subtest a=2 fails
    assert verdict.outcome == "scored" and verdict.score == pytest.approx(9 / 10), verdict.detail


def test_a_pytest_that_refuses_its_command_line_is_dropped_at_once_not_retried(tmp_path: Path) -> None:
    """A usage error (an option of a plugin the environment lacks: pytest exits 4 before any session) is the same on
    every attempt: dropped after one, with pytest's own words."""
    task = Task(
        id="usage",
        instruction="x",
        hidden_files={"tests/test_a.py": "def test_a():\n    assert True\n"},
        verifier=VerifierSpec(commands=("pytest --cov=calc tests",), result="junit", declared_test_count=1),
    )
    verifier = Verifier(retries=2, retry_delay_s=0.01)
    verdict = verify(task, workspace(tmp_path, {"calc.py": "x = 1\n"}), verifier)
    assert (verdict.outcome, verdict.attempts, verdict.trainable) == ("dropped", 1, False)
    assert "exit 4" in verdict.detail and "--cov" in verdict.detail, verdict.detail
    assert verifier.statistics().retries == 0
