"""`gyre.control.forkserver`: a child forked from the server is the process ``python -m`` would have started (arguments,
environment, working directory, standard streams, exit status, command line), behaves as a ``subprocess.Popen``
(poll, wait with a timeout, signals), dies with its caller when asked to, and anything the server cannot start
exactly (another interpreter, a variable read at import, no server) starts as a fresh interpreter instead."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.control import forkserver

DESCRIBE = [sys.executable, "-m", "gyre.control.forkserver", "--describe", "GYRE_PROBE"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The worker's fork server when the suite runs one, else one for this module."""
    if os.environ.get(forkserver.ENV):
        yield os.environ[forkserver.ENV]
        return
    path = str(tmp_path_factory.mktemp("forkserver") / "socket")
    proc = forkserver.start_server(path)
    try:
        yield path
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def served(server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(forkserver.ENV, server)
    return server


def run(argv: list[str], out: Path, stdin: bytes | None = None, **kwargs: object) -> tuple[object, int, str]:
    with open(out, "wb") as f:
        proc = forkserver.spawn(argv, stdin=subprocess.PIPE, stdout=f, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[arg-type]
    assert proc.stdin is not None
    proc.stdin.write(stdin or b"")
    proc.stdin.close()
    return proc, proc.wait(120), out.read_text()


def test_a_forked_child_is_what_python_m_starts(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "GYRE_PROBE": "42"}
    forked, code, text = run(DESCRIBE, tmp_path / "forked.out", b"hello", env=env)
    assert not isinstance(forked, subprocess.Popen) and code == 0
    seen = json.loads(text.splitlines()[0])
    assert seen == {"cwd": str(tmp_path), "env": {"GYRE_PROBE": "42"}, "forked": True, "stdin": "hello",
                    "argv": ["--describe", "GYRE_PROBE"]}  # fmt: skip
    assert text.splitlines()[1:] == ["to stderr"]  # stderr=STDOUT: one file

    monkeypatch.delenv(forkserver.ENV)
    fresh, code, text = run(DESCRIBE, tmp_path / "fresh.out", b"hello", env=env)
    assert isinstance(fresh, subprocess.Popen) and code == 0
    assert json.loads(text.splitlines()[0]) == {**seen, "forked": False}


def test_a_forked_child_ends_as_an_interpreter_ends(served: str, tmp_path: Path) -> None:
    """Its exit skips the teardown of every module, not what an exit promises: a file left open is flushed."""
    env = {**os.environ, "GYRE_DESCRIBE_TO": str(tmp_path / "left-open.json")}
    proc, code, text = run(DESCRIBE, tmp_path / "out", env=env)
    assert not isinstance(proc, subprocess.Popen) and code == 0
    assert (tmp_path / "left-open.json").read_text() == text.splitlines()[0]


def test_exit_statuses_and_errors_come_back(served: str, tmp_path: Path) -> None:
    proc, code, text = run([sys.executable, "-m", "gyre.control.forkserver"], tmp_path / "usage.out")
    assert not isinstance(proc, subprocess.Popen)
    assert (
        code == 1 and "usage: python -m gyre.control.forkserver" in text
    )  # SystemExit("...") as python -m reports it
    _, code, text = run([sys.executable, "-m", "gyre.no_such_module"], tmp_path / "missing.out")
    assert code == 1 and "No module named gyre.no_such_module" in text
    _, code, text = run([sys.executable, "-m", "gyre", "--help"], tmp_path / "help.out")
    assert code == 0 and text.startswith("usage: gyre")


def test_a_running_child_waits_polls_shows_its_command_and_takes_signals(served: str) -> None:
    proc = forkserver.spawn(
        DESCRIBE, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )  # reads until stdin closes
    try:
        assert not isinstance(proc, subprocess.Popen)
        assert proc.poll() is None and proc.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert cmdline == [os.fsencode(a) for a in DESCRIBE]  # ps and /proc show what was asked for
        proc.terminate()
        assert proc.wait(30) == -signal.SIGTERM and proc.poll() == -signal.SIGTERM
        proc.kill()  # after the end: nothing to signal, no error
    finally:
        proc.kill()
        assert proc.stdin is not None
        proc.stdin.close()


def test_a_handle_dropped_in_a_reference_cycle_goes_quietly(served: str) -> None:
    """(CI once failed on "unclosed socket" warnings from handles a collection found in cycles.)"""
    for read_its_end in (False, True):
        proc = forkserver.spawn(DESCRIBE, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        if read_its_end:
            assert proc.wait(60) == 0
        cycle: list[object] = [proc]
        cycle.append(cycle)
        del proc, cycle
        gc.collect()  # a ResourceWarning here fails the test (warnings are errors)


CALLER = """
import os, subprocess, sys, time
from gyre.control import forkserver
r = int(sys.argv[1])
argv = [sys.executable, "-m", "gyre.control.forkserver", "--describe"]
dies = forkserver.spawn(argv, stdin=r, stdout=subprocess.DEVNULL, die_with_parent=True)
lives = forkserver.spawn(argv, stdin=r, stdout=subprocess.DEVNULL)
print(type(dies).__name__, dies.pid, lives.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_started_to_die_with_its_caller_does_and_another_lives_on(served: str) -> None:
    r, w = os.pipe()  # the children block reading it while this test holds the writing end
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(r)], pass_fds=(r,), stdout=subprocess.PIPE, text=True
    )
    os.close(r)
    try:
        assert caller.stdout is not None
        kind, dies, lives = caller.stdout.readline().split()
        assert kind == "_ForkedProcess" and alive(int(dies)) and alive(int(lives))
        caller.kill()  # as a driver killed outright
        caller.wait()
        deadline = time.monotonic() + 30
        while alive(int(dies)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(int(dies)), "the child asked to die with its caller outlived it"
        assert alive(int(lives))
    finally:
        os.close(w)  # the survivor reads EOF and ends
        caller.kill()
        caller.communicate()


def test_what_a_fork_cannot_start_exactly_starts_afresh(served: str, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "3"}  # read when torch loads: the server's value would stick
    proc, code, text = run(DESCRIBE, tmp_path / "omp.out", env=env)
    assert (
        isinstance(proc, subprocess.Popen)
        and code == 0
        and json.loads(text.splitlines()[0])["forked"] is False
    )
    proc, code, _ = run([sys.executable, "-c", "print(1)"], tmp_path / "c.out")  # not a Gyre module
    assert isinstance(proc, subprocess.Popen) and code == 0


def test_no_server_listening_means_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(forkserver.ENV, str(tmp_path / "nobody"))
    proc, code, text = run(DESCRIBE, tmp_path / "none.out")
    assert (
        isinstance(proc, subprocess.Popen)
        and code == 0
        and json.loads(text.splitlines()[0])["forked"] is False
    )
