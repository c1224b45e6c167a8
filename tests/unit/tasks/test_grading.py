"""The pytest grader's host side: what its events mean, the task's own configuration, the channel, and the count of
tampered executions in eval and training statistics."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from pathlib import Path

import msgspec

from gyre.driver.evaluation import EvalOptions, summarize
from gyre.driver.training import is_tampered, step_record
from gyre.protocol import StepMetrics
from gyre.runtime import ExecutionResult
from gyre.tasks import Task, Verdict
from gyre.tasks.grader_launch import _pytest_args
from gyre.tasks.grading import (
    Channel,
    judge_unfinished,
    missing,
    pytest_commands,
    read_events,
    task_config,
    unexpected,
)
from gyre.tasks.verify import Outcome
from gyre.train.step import Rollout

KEY = b"k" * 32
PASSING = [
    {"e": "start"},
    {"e": "test", "id": "tests/test_a.py::test_x", "outcome": "passed"},
    {"e": "test", "id": "tests/test_a.py::test_y[1]", "outcome": "skipped"},
    {"e": "finish", "exitstatus": 0},
]


def stream(events: list[dict[str, object]], key: bytes = KEY, first: int = 0) -> bytes:
    lines = []
    for n, event in enumerate(events, start=first):
        text = json.dumps({"n": n, **event}).encode()
        lines.append(hmac.new(key, text, hashlib.sha256).hexdigest().encode() + b" " + text + b"\n")
    return b"".join(lines)


def test_the_grader_plugins_own_report_is_believed() -> None:
    run = read_events(stream(PASSING), KEY)
    assert (run.started, run.finished, run.exitstatus, run.tampering) == (True, True, 0, [])
    assert run.tests == {"tests/test_a.py::test_x": "passed", "tests/test_a.py::test_y[1]": "skipped"}


def test_lines_it_did_not_write_or_did_not_pass_on_are_tampering() -> None:
    genuine = stream(PASSING)
    cases = {
        "fails authentication": stream(PASSING, key=b"x" * 32),  # forged without the key
        "lines were removed": stream(PASSING[:1])
        + stream(PASSING[2:], first=2),  # a line stolen from the pipe
        "goes on after": genuine + stream(PASSING[1:2], first=4),  # written at exit, after the session
        "partial line": genuine + b"0" * 64 + b' {"n": 4',
        "begin with the session's start": stream(PASSING[1:]),
        "tripwire: x was replaced": stream(
            [PASSING[0], {"e": "tampered", "why": "x was replaced"}, PASSING[3]]
        ),
        "exited 0 although": stream(
            [PASSING[0], {"e": "collect_error", "id": "tests/test_a.py"}, PASSING[3]]
        ),
        "exited 1 (tests failed)": stream([*PASSING[:3], {"e": "finish", "exitstatus": 1}]),
        "key was taken": stream(PASSING) + b"key-taken\n",  # signed by whoever took it; the launcher says so
    }
    for why, raw in cases.items():
        tampering = read_events(raw, KEY).tampering
        assert any(why in t for t in tampering), (why, tampering)


def test_a_test_reported_again_counts_again_only_as_often_as_the_clean_collection_found_it() -> None:
    """A collector may yield one node id several times (docopt-ng's cases from a data file): each report counts,
    and the host's clean collection bounds how many of them there may be."""
    run = read_events(stream([PASSING[0], PASSING[1], PASSING[1], PASSING[3]]), KEY)
    assert run.tampering == [] and len(run.tests) == 2
    once, twice = ["tests/test_a.py::test_x"], ["tests/test_a.py::test_x"] * 2
    assert unexpected(list(run.tests), once) == [list(run.tests)[1]]
    assert unexpected(list(run.tests), twice) == []


def test_a_session_that_never_finished_is_believed_only_when_killed_from_outside() -> None:
    for exit_code, timed_out, believed in (
        (0, False, False),
        (1, False, False),
        (137, False, True),
        (0, True, True),
    ):
        run = read_events(stream(PASSING[:2]), KEY)
        judge_unfinished(run, exit_code, timed_out)
        assert (run.tampering == []) == believed, (exit_code, timed_out, run.tampering)
    # one that reported no test gains nothing by ending early: pytest refusing to start (a hidden conftest that
    # cannot import an empty workspace's package: exit 4) is believed
    run = read_events(stream(PASSING[:1]), KEY)
    judge_unfinished(run, 4, False)
    assert run.tampering == []
    # ... and a task's own conftest raising in a session hook over an empty workspace (exit 3, internal error, issue
    # 31: it was judged tampering, which inflated the signal); once a test was reported, ending there is not
    run = read_events(stream(PASSING[:1]), KEY)
    judge_unfinished(run, 3, False)
    assert run.tampering == []
    run = read_events(stream(PASSING[:2]), KEY)
    judge_unfinished(run, 3, False)
    assert run.tampering != []


def test_reported_ids_must_be_ones_the_host_collected() -> None:
    expected = ["t.py::test_a[0]", "t.py::test_a[1]", "t.py::TestB::test_c"]
    assert unexpected(["t.py::test_a[0]", "t.py::TestB::test_c"], expected) == []
    assert (
        unexpected(["t.py::test_a[<Color.RED>]"], expected) == []
    )  # an id may show the implementation's objects
    assert unexpected(["t.py::test_made_up"], expected) == ["t.py::test_made_up"]
    assert unexpected(["t.py::test_a[0]", "t.py::test_a[x]", "t.py::test_a[y]"], expected) == [
        "t.py::test_a[y]"
    ]
    # a finished session that reported on a file but left out one of its tests (not one whose file failed to collect)
    assert missing(["t.py::test_a[0]"], [], expected) == ["t.py::TestB::test_c"]
    assert missing(["u.py::test_d"], ["t.py"], expected) == []


def test_the_pytest_configuration_is_the_tasks_never_the_workspaces() -> None:
    pyproject = '[tool.pytest.ini_options]\npythonpath = ["src", "."]\naddopts = "-q"\n'
    task = Task(
        id="t", instruction="x", hidden_files={"pyproject.toml": pyproject}, files={"pytest.ini": "[x]\n"}
    )
    assert task_config(task) == ("pytest.ini", "[pytest]\n", [])  # pytest.ini comes first, whatever it holds
    task = Task(
        id="t", instruction="x", hidden_files={"pyproject.toml": pyproject, "setup.cfg": "[tool:pytest]\n"}
    )
    assert task_config(task) == ("pyproject.toml", pyproject, ["src", "."])
    no_pytest = Task(id="t", instruction="x", files={"pyproject.toml": "[project]\nname = 'a'\n"})
    assert task_config(no_pytest) == ("pytest.ini", "[pytest]\n", [])
    ini = Task(id="t", instruction="x", files={"tox.ini": "[pytest]\npythonpath = lib\n"})
    assert task_config(ini)[0::2] == ("tox.ini", ["lib"])


def test_a_channel_takes_what_is_written_while_its_command_runs_and_notices_what_came_before(
    tmp_path: Path,
) -> None:
    async def run(early: bool) -> Channel:
        channel = Channel(tmp_path, int(early))
        channel.open()
        if early:  # an earlier command's code, writing ahead into this command's pipe
            fd = os.open(channel.report_path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"forged\n")
            os.close(fd)
        loop = asyncio.get_running_loop()
        channel.start(loop)
        fd = os.open(channel.key_path, os.O_RDONLY | os.O_NONBLOCK)
        assert os.read(fd, 64) == channel.key  # the key is there for the command's first reader only
        os.close(fd)
        fd = os.open(channel.report_path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, stream(PASSING, key=channel.key))
        os.close(fd)
        await asyncio.sleep(0)
        channel.close(loop)
        return channel

    clean, ahead = asyncio.run(run(False)), asyncio.run(run(True))
    assert not clean.written_early and read_events(bytes(clean.data), clean.key).tampering == []
    assert ahead.written_early


def test_tampered_executions_are_counted_in_eval_and_training_statistics() -> None:
    def result(i: int, outcome: Outcome, score: float) -> ExecutionResult:
        verdict = Verdict(outcome=outcome, score=score)
        return ExecutionResult(
            execution_id=f"e{i}", task_id="t", group_index=i, status="done", agent=None, error=None, records=[],
            prompt_tokens=0, completion_tokens=0, dispatched_s=0.0, started_s=0.0, finished_s=1.0,
            verdict=verdict, reward=score if outcome == "scored" else 0.0,
        )  # fmt: skip

    results = [result(0, "scored", 1.0), result(1, "tampered", 0.0), result(2, "tampered", 0.0)]
    summary = summarize(EvalOptions(suite="s", run_dir="r"), [], results, {}, 1.0, "m")
    assert (summary.tampered, summary.outcomes["tampered"]) == (2, 2)
    assert summary.mean_score == 1 / 3  # trained and evaluated as a 0
    rollouts = [Rollout(execution_id=r.execution_id, group="g", reward=r.reward, records=[]) for r in results]
    trained = msgspec.convert(
        {f: {} if f == "by_member" else "" if f == "untrained" else 0 for f in StepMetrics.__struct_fields__},
        StepMetrics,
    )
    record = step_record(0, rollouts, trained, 1.0, tampered=sum(map(is_tampered, results)))
    assert (record.tampered, record.dropped, record.reward_mean) == (2, 0, 1 / 3)


def test_only_commands_that_run_pytest_get_a_key() -> None:
    install, test = (
        "pip install -e . & pip install -r tests/requirements.txt",
        "pytest --continue-on-collection-errors",
    )
    assert pytest_commands([install, test]) == [1]  # the install step has no key to take
    assert pytest_commands(["pip install pytest-cov", "python -m pytest -x", "py.test t.py"]) == [1, 2]
    assert pytest_commands(["pip install -e . && /opt/env/bin/pytest tests"]) == [0]
    assert pytest_commands(["make test", "tox"]) == [0, 1]  # none names pytest (a script runs it): as before


def test_the_launcher_runs_pytest_for_pytest_and_python_dash_m_pytest_only() -> None:
    assert _pytest_args("pytest", ["-x", "tests"]) == ["-x", "tests"]
    assert _pytest_args("python3", ["-B", "-W", "error", "-m", "pytest", "-q"]) == ["-q"]
    assert _pytest_args("python", ["-mpytest", "t.py"]) == ["t.py"]
    for args in (["setup.py", "develop"], ["-c", "import pytest"], ["-m", "pip", "install", "."], ["-"], []):
        assert _pytest_args("python", args) is None, args  # handed over to the command's own interpreter
