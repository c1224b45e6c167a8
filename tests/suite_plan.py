"""How the suite is run, so that it stays fast and green as it grows (a pytest plugin, loaded by tests/conftest.py).

- **Longest first.** ``tests/durations.json`` holds each test's seconds from a full run (``--store-durations``
  writes it). Modules run longest first, so the two xdist workers (``--dist loadscope``: a module's tests on one
  worker) finish together instead of one starting the longest module last.
- **A budget per fast-tier test.** A test not marked ``slow`` that takes over `FAST_TEST_BUDGET_S` (setup, call and
  teardown) fails the run, named; the fast tier stays fast because nothing can quietly grow in it.
- **The slow tier against its stored durations.** The summary compares what each tier took with what is stored and
  names the tests that grew past `GROWTH` times their stored seconds; ``tests/unit/test_suite_budget.py`` keeps the
  stored totals inside CI's budget.
- **No hang eats CI.** pytest-timeout gives every test a limit (``timeout`` in pyproject.toml, ``@pytest.mark.timeout``
  for the long ones); a test's own fault handler dumps every thread's stack `HANG_GRACE_S` after that limit, for a
  hang the timeout's signal cannot break (a C call holding the GIL). Processes a test's body started and left
  running after its teardown are killed and named (a timed-out test's body never reached its ``finally``).
- **Quiet workers.** Each worker computes on one torch thread (two workers share two cores); Hypothesis is
  derandomised when ``CI`` is set, so CI runs the same examples every time.
- **Rank processes forked, not spawned.** The gloo tests start their ranks with ``start_method="forkserver"``: each
  worker's fork server imports torch and Gyre's trainer once (`FORKSERVER_PRELOAD`), every rank after is a fork.
- **Gyre's own processes forked too.** Each worker starts a `gyre.control.forkserver` and names it in ``GYRE_FORKSERVER``:
  the cells, engines, routers, trainers, shards and ranks that Gyre starts (in the worker or in any process below
  it) fork from one interpreter that imported torch, transformers and Gyre once, instead of 3 CPU-seconds of
  imports each. ``GYRE_TEST_FORKSERVER=0`` runs the suite without it; tests that run a user's command line exactly
  as a user would take the `fresh_processes` fixture.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parent / "durations.json"
FAST_TEST_BUDGET_S = 60.0
GROWTH = 3.0  # a test that took this many times its stored seconds (and 30 s more) is named in the summary
HANG_GRACE_S = 60.0
DEFAULT_S = 1.0  # a test with no stored duration (new): counted as this when ordering
# Rank processes of the gloo tests start as forks of one server per worker that imported these once
# (``start_method="forkserver"``): 1 s a start instead of the 9 s of a spawned interpreter importing torch.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "gyre.train.state", "gyre.train.context", "gyre.train.objective",
                      "gyre.train.checkpoint", "context_ranks", "sharded_ranks", "checkpoint_ranks"]  # fmt: skip

# servers that outlive the test that started them by design: the worker's fork server and resource tracker (every
# later test forks from them), the pooled workers of a module's Ray cluster (its raylet starts them on demand)
KEPT = ("multiprocessing.forkserver", "multiprocessing.resource_tracker", "ray::", "gyre.control.forkserver")

_seconds: dict[str, float] = defaultdict(float)  # nodeid -> setup + call + teardown seconds, this run
_slow: set[str] = set()
_killed: dict[str, str] = {}
_before: dict[str, float] = {}  # the stored durations as this run began (the summary compares with them)
_server: list[
    tuple[subprocess.Popen[bytes], str]
] = []  # this worker's gyre.control.forkserver and its directory


def stored() -> dict[str, float]:
    """The stored durations (nodeid -> seconds); empty when there are none."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's seconds to {DURATIONS.name} (longest-first order, budgets)")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    _before.update(stored())
    if os.environ.get("CI"):
        from hypothesis import settings

        settings.register_profile("ci", derandomize=True, database=None)
        settings.load_profile("ci")
    if hasattr(config, "workerinput") or not getattr(
        config.option, "numprocesses", None
    ):  # a process that tests
        import torch
        import torch.multiprocessing

        torch.set_num_threads(1)
        torch.multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
        if os.environ.get("GYRE_TEST_FORKSERVER", "1") != "0":
            from gyre.control import forkserver

            where = tempfile.mkdtemp(
                prefix="gyre-forkserver-"
            )  # mode 0700: only this user reaches the socket
            path = os.path.join(where, "socket")
            _server.append((forkserver.start_server(path, log=os.path.join(where, "log")), where))
            os.environ[forkserver.ENV] = path  # it imports while the worker collects


def pytest_unconfigure(config: pytest.Config) -> None:
    for proc, where in _server:
        proc.kill()
        proc.wait()
        shutil.rmtree(where, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules longest first by their stored seconds; a module's tests keep their order."""
    durations = stored()
    totals: dict[str, float] = defaultdict(float)
    for item in items:
        totals[module_of(item.nodeid)] += durations.get(item.nodeid, DEFAULT_S)
    first = {module: i for i, module in enumerate(dict.fromkeys(module_of(item.nodeid) for item in items))}
    items.sort(key=lambda item: (-totals[module_of(item.nodeid)], first[module_of(item.nodeid)]))


def _timeout_of(item: pytest.Item) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout is not installed
        return 0.0


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time (clock ticks) of every running process below ``root``, read from /proc."""
    parent: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if fields[0] != "Z":  # a zombie has ended (its parent has not reaped it yet)
            parent[int(entry)] = (int(fields[1]), int(fields[19]))
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, (ppid, started) in parent.items():
            if ppid == pid and child not in found:
                found[child] = started
                frontier.append(child)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    limit = _timeout_of(item)
    if limit:
        faulthandler.dump_traceback_later(limit + HANG_GRACE_S, exit=False, file=sys.stderr)
    try:
        yield
    finally:
        if limit:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    before = _descendants(os.getpid())
    yield
    item.stash[_started_in_call] = {
        pid: t for pid, t in _descendants(os.getpid()).items() if before.get(pid) != t
    }


_started_in_call = pytest.StashKey[dict[int, int]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None]:
    """After the fixtures' teardown (however it ended): kill what the test's body started and left running."""
    try:
        return (yield)
    finally:
        _reap(item)


def _reap(item: pytest.Item) -> None:
    started = item.stash.get(_started_in_call, {})
    if not started:
        return
    left: dict[int, str] = {}
    for pid, t in _descendants(os.getpid()).items():
        if started.get(pid) != t:
            continue
        try:  # named before it is killed (its command line goes with it)
            cmd = (
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
            )
        except OSError:
            continue
        if any(server in cmd for server in KEPT):
            continue
        left[pid] = cmd
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:  # reported by the controller's summary (user properties travel with the teardown's report)
        item.user_properties.append(("killed", "; ".join(f"{pid} {cmd}" for pid, cmd in left.items())))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] += report.duration
    if "slow" in report.keywords:
        _slow.add(report.nodeid)
    for key, value in report.user_properties:
        if key == "killed":
            _killed[report.nodeid] = str(value)


def _over_budget() -> list[str]:
    return sorted(
        (n for n, s in _seconds.items() if n not in _slow and s > FAST_TEST_BUDGET_S), key=_seconds.get
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or not _seconds:
        return
    if session.config.getoption("store_durations"):  # a module that ran keeps only the tests it has now
        ran = {module_of(n) for n in _seconds}
        kept = {n: s for n, s in _before.items() if module_of(n) not in ran}
        durations = kept | {n: round(s, 2) for n, s in _seconds.items()}
        DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    if _over_budget() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _seconds:
        return
    write = terminalreporter.write_line
    durations = _before
    for tier, names in (
        ("fast", [n for n in _seconds if n not in _slow]),
        ("slow", [n for n in _seconds if n in _slow]),
    ):
        if names:
            was = sum(durations.get(n, 0.0) for n in names)
            write(
                f"{tier} tier: {sum(_seconds[n] for n in names):.0f} s of tests ({len(names)}); stored {was:.0f} s"
            )
    grew = [n for n, s in _seconds.items() if n in durations and s > GROWTH * durations[n] + 30]
    for name in grew:
        write(f"grew: {name} took {_seconds[name]:.0f} s, stored {durations[name]:.0f} s", yellow=True)
    for name, what in _killed.items():
        write(f"killed what its body left running: {name}: {what}", yellow=True)
    for name in _over_budget():
        write(f"over the fast tier's {FAST_TEST_BUDGET_S:.0f} s budget per test: {name} took {_seconds[name]:.0f} s "
              "(make it faster, or mark it slow with the reason)", red=True)  # fmt: skip
