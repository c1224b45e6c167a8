"""Scoring what an execution built: the task's verifier, run on a copy of its workspace in a fresh sandbox.

The score comes from artifacts, never from how the execution ended: an execution that ran out of time or crashed is
verified like one that finished. Each verification ends as one `Verdict`:

- ``scored``: the verifier ran and its artifact (a JUnit report, a reward file, exit codes) gave the score;
- ``placeholder``: nothing evaluable exists (the workspace was never set up); reward 0, so the group stays complete;
- ``tampered``: the grader caught the agent's code tampering with the test run or its report (see
  `gyre.tasks.grading`); reward 0, trained on like any score, and counted, so a run shows its policy hacking;
- ``dropped``: the verifier itself failed (infrastructure: a sandbox that would not start, a missing tool, no report
  where one must be, or anything else it raised) on every attempt of its retry budget; the execution leaves
  training and is counted;
- ``unscored``: the task has no verifier.

Before the commands run, the agent's copies of what the grader supplies are removed: the hidden test directories,
the task's ``remove`` paths (packaging and pytest configuration files the grader replaces) and any stale report. A
JUnit score counts only test cases from the hidden test files, so tests an agent adds cannot raise it. A JUnit
verifier without a ``report_path`` runs pytest under the grader's own configuration and reads its outcomes from an
authenticated channel rather than a file (`gyre.tasks.grading`). Walks and deletes of the agent's tree never recurse
on Python's stack (a workspace may nest thousands of directories): ``find`` and ``rm`` do them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import re
import stat
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

import msgspec

from gyre.config import SandboxConfig
from gyre.errors import SandboxError, TaskError, WorkspaceLimitExceeded
from gyre.sandbox import ExecResult, Sandbox, make_sandbox, paths, pyenv
from gyre.sandbox.workspace import SYSTEM_PATH, copy_tree, make_scratch, workspace_limits
from gyre.tasks import environments, grading
from gyre.tasks.environments import PreparedEnvironment
from gyre.tasks.task import FileData, Task, VerifierSpec

log = logging.getLogger(__name__)

Outcome = Literal["scored", "placeholder", "tampered", "dropped", "unscored"]
# these stay in their group for training (tampered: reward 0, so the policy learns that hacking the grader fails)
TRAINABLE_OUTCOMES: tuple[Outcome, ...] = ("scored", "placeholder", "tampered")
# (config, workspace, binds, python_env=..., variables=...) -> a sandbox not yet started, as `make_sandbox`
SandboxFactory = Callable[..., Sandbox]

REPORT_DIR = ".gyre-verifier"  # where pytest writes its JUnit reports (one per command) in the graded copy
LOGS_DIR = (
    "/logs"  # Harbor's verifier writes /logs/verifier/reward.txt: a writable host directory is bound here
)
MAX_REPORT_BYTES = 64 << 20  # a larger report is not parsed (infrastructure failure)
COMMAND_NOT_FOUND = 127
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
PYTEST_USAGE_ERROR = 4
_USAGE = re.compile(
    r"error: unrecognized arguments|^usage: |ERROR: usage|in config file .* unknown", re.MULTILINE
)  # pytest's exit status for a command line or configuration it refuses


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """How one execution's work products scored, and how sure that score is."""

    outcome: Outcome
    score: float = (
        0.0  # the reward: in [0, 1] for JUnit and exit-code verifiers; 0 unless scored (tampered: 0)
    )
    passed: int | None = None  # JUnit: hidden test cases that passed
    failed: int | None = None  # JUnit: failed or errored (collection errors included)
    skipped: int | None = None
    declared: int | None = None  # the task's declared test count (the score's denominator)
    exit_codes: list[int] = msgspec.field(default_factory=list)  # of the verifier's commands, in order
    timed_out: bool = (
        False  # the commands ran out of the verifier's time budget (a legitimate score, not a failure)
    )
    attempts: int = 0  # verifier runs, retries included
    detail: str = (
        ""  # why it was dropped, tampered or a placeholder; the verifier's output tail when it scored 0
    )
    duration_s: float = 0.0

    @property
    def trainable(self) -> bool:
        """Whether the execution belongs in its group for training (dropped and unscored ones do not)."""
        return self.outcome in TRAINABLE_OUTCOMES


class VerifierStatistics(msgspec.Struct, frozen=True):
    """Counts since the verifier was made."""

    verified: int  # verdicts given
    by_outcome: dict[str, int]
    retries: int  # attempts beyond each verdict's first


class VerifierFailure(Exception):
    """The verifier could not produce a score (infrastructure, not the agent's work): retried, then dropped."""


class UnfoundTests(VerifierFailure):
    """A command's pytest cannot find the tests it names (a path its hidden test files do not include): every
    workspace, a perfect one included, would score 0. Preflight refuses the task."""


class DeterministicFailure(VerifierFailure):
    """The grader itself is broken for this task (pytest refused its command line): the same every time, so it is
    dropped at once, never retried."""


class Verifier:
    """Runs tasks' verifiers (see the module); one per driver, shared by every execution."""

    def __init__(
        self,
        sandbox: SandboxConfig | None = None,
        *,
        retries: int = 2,
        retry_delay_s: float = 1.0,
        python_env: bool = True,
        sandbox_factory: SandboxFactory | None = None,
        start_fault: Callable[[str, int], bool] | None = None,
    ) -> None:
        """``retries``: attempts after the first before dropping; ``python_env``: show the driver's Python (and its
        pytest) read-only to the commands, first on their PATH; ``start_fault(key, attempt)``: whether that attempt's
        sandbox fails to start (injected faults: `gyre.control.chaos.FaultyStarts`)."""
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries}")
        self.sandbox_cfg = sandbox or SandboxConfig()
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.python_env = python_env
        self._factory: SandboxFactory = sandbox_factory or make_sandbox
        self._start_fault = start_fault
        self._outcomes: Counter[str] = Counter()
        self._retries = 0
        self._expected: dict[str, list[str] | None] = {}  # task id -> the test ids of its clean collection
        self._collection_failed: dict[str, str] = {}  # task id -> why that collection failed
        self._unfound: dict[str, str] = {}  # task id -> which test path its commands name that is not there
        self._collecting: dict[str, asyncio.Lock] = {}

    def statistics(self) -> VerifierStatistics:
        """Verdicts so far, by outcome, and the retries they took."""
        return VerifierStatistics(sum(self._outcomes.values()), dict(self._outcomes), self._retries)

    async def verify(self, task: Task, workspace: Path | None, key: str = "") -> Verdict:
        """Score the workspace an execution of ``task`` left (``None``: it never had one: a placeholder); ``key``
        names the execution (its id) to ``start_fault``."""
        verdict = await self._verify(task, workspace, key)
        self._outcomes[verdict.outcome] += 1
        self._retries += max(verdict.attempts - 1, 0)
        return verdict

    def check(self, task: Task) -> None:
        """Raise `TaskError` when this verifier cannot score ``task`` at all (check before running it)."""
        if task.unsupported:
            kind = "hidden tests" if task.missing_hidden_files else "host"
            raise TaskError(f"task {task.id} ({kind}) cannot be verified: {task.unsupported}")
        report = task.verifier.report_path if task.verifier is not None else ""
        isolated = self.sandbox_cfg.backend == "bubblewrap" or task.image or self.sandbox_cfg.image
        if report.startswith("/") and not isolated:
            raise TaskError(
                f"task {task.id}: its verifier writes {report}, outside the workspace, which only the bubblewrap "
                "backend can give each execution its own copy of (sandbox.backend = 'bubblewrap')"
            )
        if report.startswith("/") and not report.startswith(LOGS_DIR + "/"):
            raise TaskError(
                f"task {task.id}: verifier report {report}: an absolute path must be under {LOGS_DIR}/"
            )

    async def preflight(self, task: Task) -> None:
        """Refuse (`TaskError`, with the reason) a task whose grading cannot be faithful, before anything runs: its
        environment cannot be built, its test commands name a test path its hidden files do not include (pytest
        would find no tests in any workspace), or its hidden tests import a module that neither its reference
        solution nor its environment provides (a missing test dependency). Builds the environment and runs the
        grader's collection (both once per task; verifications reuse them): a clean one over the reference
        solution, or without one over the starting files (`_expected_ids`). The first line of a refusal is its
        reason; what follows is the tools' own output."""
        self.check(task)
        python_env = await environments.ensure(task, self.sandbox_cfg)
        await self._expected_ids(task, python_env)
        refusal = self._refusal(task)
        if refusal is not None:
            raise TaskError(refusal)

    def _refusal(self, task: Task) -> str | None:
        """Why ``task``'s grading cannot be faithful, once its clean collection has run (None: it can)."""
        if task.id in self._unfound:
            return f"task {task.id} (test command): {self._unfound[task.id]}"
        failure = self._collection_failed.get(task.id)
        if failure is None:
            return None
        provided = {
            part.removesuffix(".py") for p in {**task.files, **task.solution_files} for part in p.split("/")
        }
        missing = sorted({m for m in _MISSING_MODULE.findall(failure) if m.split(".")[0] not in provided})
        if missing:
            return (
                f"task {task.id} (hidden tests): they import {', '.join(missing)}, which neither its reference "
                "solution nor its environment provides (a test dependency the task does not declare)"
            )
        # its start says what failed, its end the last lines of the failing command's output
        brief = failure if len(failure) <= 3000 else f"{failure[:1000]}\n[...]\n{failure[-2000:]}"
        return f"task {task.id} (reference): the hidden tests cannot be collected over its reference solution: {brief}"

    async def _verify(self, task: Task, workspace: Path | None, key: str) -> Verdict:
        self.check(task)
        if task.verifier is None:
            return Verdict(outcome="unscored", detail="the task has no verifier")
        if workspace is None or not await asyncio.to_thread(workspace.is_dir):
            return Verdict(
                outcome="placeholder", detail="nothing to evaluate: the workspace was never set up"
            )
        start = time.monotonic()
        failures: list[str] = []
        try:
            python_env = await environments.ensure(task, self.sandbox_cfg)
        except environments.EnvironmentFailed as exc:  # refused up front by eval and train; never scored 0
            return Verdict(
                outcome="dropped", attempts=0, detail=str(exc), duration_s=time.monotonic() - start
            )
        expected = await self._expected_ids(task, python_env)
        refusal = self._refusal(task)
        if refusal is not None:  # what preflight refuses is never scored (a 0 here would be the task's fault)
            return Verdict(
                outcome="dropped",
                attempts=0,
                detail=f"refused: {refusal}",
                duration_s=time.monotonic() - start,
            )
        for attempt in range(1, self.retries + 2):
            fault = self._start_fault is not None and self._start_fault(key, attempt)
            try:
                verdict = await self._attempt(task, task.verifier, workspace, python_env, expected=expected,
                                              start_fails=fault)  # fmt: skip
            except WorkspaceLimitExceeded as exc:  # the workspace's doing, not the verifier's: the agent's 0
                return Verdict(outcome="scored", score=0.0, attempts=attempt,
                               detail=f"not copied for grading (the agent's own doing, scored 0): {exc}",
                               duration_s=time.monotonic() - start)  # fmt: skip
            except Exception as exc:  # anything it raises is this execution's, never its neighbours'
                failures.append(f"attempt {attempt}: {type(exc).__name__}: {exc}"[:2000])
                known = isinstance(exc, VerifierFailure | SandboxError | OSError)
                log.warning(
                    "verifier of %s failed (attempt %d): %r", task.id, attempt, exc, exc_info=not known
                )
                if isinstance(exc, DeterministicFailure):
                    break
                if attempt <= self.retries:
                    await asyncio.sleep(self.retry_delay_s * attempt)
                continue
            return msgspec.structs.replace(verdict, attempts=attempt, duration_s=time.monotonic() - start)
        return Verdict(
            outcome="dropped",
            attempts=len(failures),
            detail=f"the verifier failed on every attempt ({len(failures)}), the last: {failures[-1]}\n"
            + "\n".join(failures),
            duration_s=time.monotonic() - start,
        )

    async def _expected_ids(self, task: Task, python_env: PreparedEnvironment | None) -> list[str] | None:
        """The test ids pytest collects of the hidden tests over the task's reference solution, in a clean run under
        the grader's control (once per task); None without a solution, or when that run fails. Without a solution
        the collection runs once over the starting files, only to find a command whose pytest cannot find the
        tests it names (`_unfound_tests`)."""
        spec = task.verifier
        if spec is None or not _pytest_graded(spec):
            return None
        async with self._collecting.setdefault(task.id, asyncio.Lock()):
            if task.id not in self._expected:
                self._expected[task.id] = None
                scratch = await asyncio.to_thread(
                    make_scratch, self.sandbox_cfg.workspace_root, "gyre-collect-"
                )
                solved = {**task.files, **task.solution_files}
                try:
                    await asyncio.to_thread(_write_tree, scratch / "solved", solved)
                    collected: list[str] = []
                    await self._attempt(task, spec, scratch / "solved", python_env, collect=collected,
                                        reference=bool(task.solution_files))  # fmt: skip
                    self._expected[task.id] = (collected or None) if task.solution_files else None
                except UnfoundTests as exc:
                    self._unfound[task.id] = str(exc)
                except Exception as exc:
                    over = "its solution" if task.solution_files else "its starting files"
                    log.log(logging.WARNING if task.solution_files else logging.INFO,
                            "cannot collect the hidden tests of %s over %s: %r", task.id, over, exc)  # fmt: skip
                    # without it, reported ids are checked against the hidden files and the plugin only; over the
                    # starting files nothing else can be refused (the agent's work is missing)
                    if task.solution_files:
                        self._collection_failed[task.id] = str(exc)
                finally:
                    await remove_tree(scratch)
        return self._expected[task.id]

    async def _attempt(
        self,
        task: Task,
        spec: VerifierSpec,
        workspace: Path,
        python_env: PreparedEnvironment | None,
        *,
        expected: list[str] | None = None,
        collect: list[str] | None = None,
        reference: bool = True,
        start_fails: bool = False,
    ) -> Verdict:
        """One run of the verifier. Under the pytest grader, reported test ids must be among ``expected`` (when
        known); a ``collect`` list makes it a ``--collect-only`` run whose test ids go there (its verdict is moot),
        `UnfoundTests` when a command's pytest cannot find its tests (``reference``: over the reference solution;
        else over the starting files, where only the test paths the grader supplies count); ``start_fails``: its
        sandbox fails to start (an injected fault)."""
        scratch = await asyncio.to_thread(_make_scratch, self.sandbox_cfg.workspace_root)
        channels: list[grading.Channel] = []
        try:
            graded, logs, grader = scratch / "workspace", scratch / "logs", scratch / "grader"
            await copy_tree(
                workspace, graded, workspace_limits(self.sandbox_cfg)
            )  # bounded: bytes, inodes, time
            await asyncio.to_thread(_prepare, task, spec, graded)
            cfg = msgspec.structs.replace(self.sandbox_cfg, image=task.image or self.sandbox_cfg.image)
            bwrap = cfg.backend == "bubblewrap" or bool(cfg.image)  # isolated: /logs, the grader's dir bound
            binds = [(str(logs), LOGS_DIR, True)] if bwrap else []
            env = dict(spec.env)
            trusted = [sys.prefix, sys.base_prefix]  # where pytest and the plugins the grader accepts live
            env_dir = None if python_env is None else Path(python_env.path)
            if python_env is not None and env_dir is not None:  # the task's own, under this sandbox's layer
                trusted = [str(env_dir), pyenv.base_prefix(env_dir)]
                # its plugins, as autoload would have loaded them (autoload is off: the layer is not the task's)
                spec = msgspec.structs.replace(
                    spec, pytest_plugins=(*spec.pytest_plugins, *python_env.pytest_plugins)
                )
            elif self.python_env and not cfg.image:  # an image brings its own toolchain
                binds += [(p, p, False) for p in sorted({sys.prefix, sys.base_prefix})]
                env.setdefault("PATH", f"{sys.prefix}/bin:{SYSTEM_PATH}")
            variables = task.environment.env if task.environment is not None else {}
            if _pytest_graded(spec):  # a channel (a key) only for the commands that run pytest
                channels = [grading.Channel(grader, i) for i in grading.pytest_commands(spec.commands)]
                await asyncio.to_thread(grading.open_channels, grader, channels)
                binds.append((str(grader), grading.GRADER_DIR, False))  # read-only: FIFOs still pass data
            shown_grader = grading.GRADER_DIR if bwrap else str(grader)
            sandbox = self._factory(cfg, graded, binds, python_env=env_dir, variables=variables)
            if start_fails:  # as bubblewrap refusing to start: before any command, nothing scored
                raise SandboxError(
                    "the verifier's sandbox failed to start (injected: [chaos] verifier_start_fail)"
                )
            async with sandbox:
                if channels:
                    env = grading.environment(
                        task, spec, env, shown_grader, sandbox.WORKSPACE, collect is not None
                    )
                    # an image brings its own Python, and without python_env the sandbox may not see ours: there
                    # pytest starts as the commands find it
                    launch = None
                    if not cfg.image and (python_env is not None or self.python_env):
                        launch = grading.Launch.for_sandbox(env, env_dir, sandbox)
                        env["PATH"] = f"{shown_grader}/bin:{launch.path}"  # the grader's pytest first
                    await asyncio.to_thread(
                        grading.write_grader, task, spec, grader, sandbox.WORKSPACE, trusted, launch
                    )
                results = await _run_commands(sandbox, spec, env, channels, shown_grader)
                codes = [r.exit_code for r in results]
                timed_out = len(results) < len(spec.commands) or any(r.timed_out for r in results)
                tail = (results[-1].stdout + results[-1].stderr)[-2000:] if results else ""
                if collect is not None:
                    unfound = _unfound_tests(task, spec.commands, channels, results, reference)
                    if unfound is not None:
                        raise UnfoundTests(unfound)
                    if reference:
                        output = results[-1].stdout + results[-1].stderr if results else ""
                        collect += _collected(channels, results, _collection_report(output), spec.commands)
                    return Verdict(outcome="unscored", detail="a collection")
                if channels:
                    return _score_pytest(task, spec, channels, results, timed_out, tail, expected)
                try:
                    return await asyncio.to_thread(
                        _score, task, spec, graded, logs, sandbox.WORKSPACE, codes, timed_out, tail
                    )
                except ArtifactRedirected as exc:  # the agent's code aimed the host's read elsewhere
                    return Verdict(outcome="tampered", exit_codes=codes, timed_out=timed_out, detail=str(exc))
        finally:
            for channel in channels:
                channel.close(None)
            await remove_tree(scratch)


def _make_scratch(workspace_root: str) -> Path:
    """A private directory for one attempt: the graded copy goes in ``workspace/``, /logs is ``logs/``."""
    scratch = make_scratch(workspace_root, "gyre-verify-")
    (scratch / "logs" / "verifier").mkdir(parents=True)
    for d in (scratch / "logs", scratch / "logs" / "verifier"):
        d.chmod(0o777)  # and write the reward under /logs
    return scratch


async def _run_commands(
    sandbox: Sandbox,
    spec: VerifierSpec,
    env: dict[str, str],
    channels: list[grading.Channel],
    shown_grader: str,
) -> list[ExecResult]:
    """Run the commands in order, each in its own shell, within the verifier's budget; fewer results than commands:
    the budget ran out. With ``channels``, each command's pytest reports through its own."""
    deadline = time.monotonic() + spec.timeout_s
    results: list[ExecResult] = []
    loop = asyncio.get_running_loop()
    by_command = {c.index: c for c in channels}
    for i, command in enumerate(spec.commands):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        command_env = dict(env)
        channel = by_command.get(i)  # none for a command that does not run pytest: no key to take
        if channel is not None:
            command_env["GYRE_GRADER_KEY"] = f"{shown_grader}/{channel.key_path.name}"
            command_env["GYRE_GRADER_REPORT"] = f"{shown_grader}/{channel.report_path.name}"
            channel.start(loop)
        try:
            result = await sandbox.exec(command, timeout_s=remaining, env=command_env)
        finally:
            if channel is not None:
                channel.close(loop)
        if result.exit_code == COMMAND_NOT_FOUND and "not found" in result.stderr:
            raise VerifierFailure(f"command {i} ({command!r}) could not run: {result.stderr.strip()[-300:]}")
        results.append(result)
        if result.timed_out:
            break
    return results


def _pytest_graded(spec: VerifierSpec) -> bool:
    """Whether the commands' pytest runs under the grader's control (JUnit without a report of the task's own)."""
    return spec.result == "junit" and not spec.report_path


def _prepare(task: Task, spec: VerifierSpec, graded: Path) -> None:
    """Remove what the grader supplies or replaces from the copy, then put the hidden files in (blocking)."""
    hidden_dirs = {PurePosixPath(p).parts[0] for p in task.hidden_files if len(PurePosixPath(p).parts) > 1}
    patterns = [*spec.remove, *sorted(hidden_dirs), REPORT_DIR]
    if _pytest_graded(
        spec
    ):  # no bytecode or conftest of the agent's making: the task's conftests are put back
        patterns += ["**/__pycache__", "**/conftest.py"]
    if spec.report_path and not spec.report_path.startswith("/"):
        patterns.append(spec.report_path)
    # the owner may read, write and search everything: a tree the commands cannot enter is the agent's 0, not an
    # infrastructure failure (which would drop the execution from training)
    subprocess.run(["chmod", "-R", "u+rwX", "--", str(graded)], capture_output=True, check=False)
    _remove_matching(graded, patterns)
    supplied = dict(task.hidden_files)
    if _pytest_graded(spec):
        supplied |= {p: t for p, t in task.files.items() if PurePosixPath(p).name == "conftest.py"}
    for path, text in supplied.items():
        paths.write_file(graded, path, str(graded), text if isinstance(text, bytes) else text.encode())


def _remove_matching(root: Path, patterns: list[str]) -> None:
    """Delete every entry under ``root`` whose relative path matches a pattern (``**/name``: a name at any depth),
    never following symlinks, at any depth (blocking). ``find`` walks: Python's walk recurses on its stack."""
    tests: list[str] = []
    for pattern in patterns:
        tests += (
            ["-o", "-name", pattern[3:]] if pattern.startswith("**/") else ["-o", "-path", f"./{pattern}"]
        )
    argv = ["find", ".", "-mindepth", "1", "(", *tests[1:], ")", "-prune", "-print0"]
    found = subprocess.run(argv, cwd=root, capture_output=True, check=False)
    if found.returncode != 0:
        raise VerifierFailure(f"cannot walk the graded copy: {found.stderr.decode(errors='replace')[-300:]}")
    doomed = [p for p in found.stdout.split(b"\0") if p]
    for start in range(0, len(doomed), 1000):
        _rm(root, doomed[start : start + 1000])


def _rm(cwd: Path, targets: list[bytes]) -> None:
    """``rm -rf`` relative to ``cwd``; what a command left without write or search permission is opened up first."""
    argv = [b"rm", b"-rf", b"--one-file-system", b"--", *targets]
    if subprocess.run(argv, cwd=cwd, capture_output=True, check=False).returncode == 0:
        return
    subprocess.run([b"chmod", b"-R", b"u+rwx", b"--", *targets], cwd=cwd, capture_output=True, check=False)
    done = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    if done.returncode != 0:
        raise VerifierFailure(
            f"cannot delete from the graded copy: {done.stderr.decode(errors='replace')[-300:]}"
        )


async def remove_tree(path: Path) -> None:
    """Delete a directory tree of any depth (``rm``; Python's rmtree recurses on its stack); missing is fine."""
    if await asyncio.to_thread(os.path.lexists, path):
        await asyncio.to_thread(_rm, path.parent, [os.fsencode(path.name)])


def _write_tree(root: Path, files: dict[str, FileData]) -> None:
    """Write ``files`` (relative path -> text) into a new directory ``root`` (blocking)."""
    root.mkdir()
    for rel, text in files.items():
        paths.write_file(root, rel, str(root), text if isinstance(text, bytes) else text.encode())


def _collected(
    channels: list[grading.Channel], results: list[ExecResult], tail: str, commands: Sequence[str] = ()
) -> list[str]:
    """The test ids of a clean ``--collect-only`` run; `VerifierFailure` unless every command collected cleanly,
    naming first the other commands that failed before it (an install step), with their last lines."""
    if any(c.index >= len(results) for c in channels) or any(r.timed_out for r in results):
        raise VerifierFailure("the clean collection ran out of the verifier's time")
    graded = {c.index for c in channels}
    steps = [
        (f"`{command}` exited {r.exit_code}", _last_lines(r.stdout + r.stderr))
        for i, (command, r) in enumerate(zip(commands, results, strict=False))
        if r.exit_code != 0 and i not in graded
    ]
    # what failed on the first line; the commands' own output below it
    before = f" (before it, {'; '.join(s for s, _ in steps)})" if steps else ""
    outputs = "".join(f"{step}: {last}\n" for step, last in steps)
    ids: list[str] = []
    for channel in channels:
        run = grading.read_events(bytes(channel.data), channel.key)
        if run.tampering or run.collect_errors or (run.started and run.exitstatus != grading.EXIT_OK):
            raise VerifierFailure(
                f"the clean collection failed: {run.tampering or run.collect_errors}{before}\n{outputs}{tail}"
            )
        ids += run.collected
    return ids


_NOT_FOUND = re.compile(r"^ERROR: file or directory not found: (.+?)\s*$", re.MULTILINE)  # pytest's exit 4
_TEST_MODULE = re.compile(r"^(test_.*|.*_test)\.py$")  # pytest's default python_files


def _unfound_tests(
    task: Task,
    commands: Sequence[str],
    channels: list[grading.Channel],
    results: list[ExecResult],
    reference: bool,
) -> str | None:
    """Why a command's pytest cannot find the tests it names, in one line (None: each finds them), from a
    ``--collect-only`` run: pytest said a path it was given is not there (exit 4), or it collected nothing and
    skipped nothing (exit 5). Over the reference solution any such path is the task's fault. Over the starting
    files only a path the grader's own files must provide is: one under a directory the grader replaces with the
    hidden tests, or a test module (`test_*.py`, `*_test.py`); one the agent's work may provide (its package, named
    for doctests) is not."""
    hidden_dirs = {PurePosixPath(p).parts[0] for p in task.hidden_files if len(PurePosixPath(p).parts) > 1}
    for channel in channels:
        if channel.index >= len(results):
            continue
        result, command = results[channel.index], commands[channel.index]
        output = result.stdout + result.stderr
        for path in _NOT_FOUND.findall(output):
            where = PurePosixPath(path.split("::", 1)[0].removeprefix("./"))
            # under a directory the grader wipes and fills with the hidden tests, only they can provide it
            replaced = bool(where.parts) and where.parts[0] in hidden_dirs
            if reference:
                return (
                    f"`{command}` names {path}, which neither its hidden test files nor its reference solution "
                    f"include (pytest: file or directory not found, exit {result.exit_code}): the reference scores 0"
                )
            if replaced or _TEST_MODULE.match(where.name):
                return (
                    f"`{command}` names {path}, which its hidden test files do not include (pytest: file or "
                    f"directory not found, exit {result.exit_code}): every workspace would score 0"
                )
        run = grading.read_events(bytes(channel.data), channel.key)
        nothing = not run.collected and not run.collect_errors and not re.search(r"\bskipped\b", output)
        if run.exitstatus == grading.EXIT_NO_TESTS and nothing:
            return f"`{command}` collects no tests (pytest exit 5): every workspace would score 0"
    return None


_SECTION = re.compile(r"^={3,} ?(.*?) ?={3,}$", re.MULTILINE)


def _collection_report(output: str) -> str:
    """What a failed collection's output says: pytest's ERRORS section (why each file failed to collect; a warnings
    summary after it can be far longer) and its short summary, else the output's end."""
    sections = [(m.group(1), m.start(), m.end()) for m in _SECTION.finditer(output)]
    parts = []
    for i, (title, start, _) in enumerate(sections):
        end = sections[i + 1][1] if i + 1 < len(sections) else len(output)
        if title == "ERRORS":
            text = output[start:end]
            parts.append(text if len(text) <= 2500 else f"{text[:2500]}\n[...]")
        elif title == "short test summary info":
            parts.append(output[start:end][-800:])
    return "\n".join(parts) if parts else output[-2000:]


def _last_lines(text: str, lines: int = 8, chars: int = 800) -> str:
    """The last non-blank ``lines`` of a command's output, on one line (`` | `` between them)."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-chars:]


def _score_pytest(
    task: Task,
    spec: VerifierSpec,
    channels: list[grading.Channel],
    results: list[ExecResult],
    timed_out: bool,
    tail: str,
    expected: list[str] | None = None,
) -> Verdict:
    """The verdict of the grader plugin's events (see `gyre.tasks.grading`); `VerifierFailure` when none came."""
    codes = [r.exit_code for r in results]
    detail = f"the verifier ran out of its {spec.timeout_s:g} s" if timed_out else ""
    hidden = grading.hidden_tests(task)
    counted = set(
        expected or ()
    )  # besides the hidden files' tests: what the task's own configuration collects
    outcomes: dict[str, str] = {}
    collect_errors: set[str] = set()
    tampering: list[str] = []
    sessions = 0
    for channel in channels:
        if channel.index >= len(results):  # the budget ran out before its command
            continue
        result = results[channel.index]
        run = grading.read_events(bytes(channel.data), channel.key)
        if channel.overflowed:
            run.tampering.append(f"more than {grading.MAX_EVENT_BYTES} bytes of report")
        if channel.written_early:
            run.tampering.append("its key or report pipe was written before it started")
        grading.judge_unfinished(run, result.exit_code, result.timed_out)
        tampering += [f"command {channel.index}: {why}" for why in run.tampering]
        sessions += run.started
        # the hidden files' tests, and items the task's configuration collects elsewhere over its reference solution
        # (doctests of README and modules); tests the agent added anywhere else do not count
        reported = [
            i
            for i in run.tests
            if not hidden or i.split("::", 1)[0] in hidden or grading.base_id(i) in counted
        ]
        if expected is not None:
            tampering += [
                f"command {channel.index}: test {i[:200]} is not one the grader collected from the hidden tests"
                for i in grading.unexpected(reported, expected)
            ]
            if run.finished:
                in_files = [i for i in reported if not hidden or i.split("::", 1)[0] in hidden]
                tampering += [
                    f"command {channel.index}: test {i[:200]} of the hidden tests ran without a report"
                    for i in grading.missing(in_files, run.collect_errors, expected)
                ]
        outcomes.update({i: run.tests[i] for i in reported})
        collect_errors.update(i for i in run.collect_errors if not hidden or grading.in_hidden(i, hidden))
    if tampering:
        reasons = "\n".join(tampering)[:4000]  # then the run's last words, to tell a false alarm from a cheat
        return Verdict(
            outcome="tampered", exit_codes=codes, timed_out=timed_out,
            detail=f"{reasons}\n--- the commands' output, last lines ---\n{tail[-2000:]}" if tail else reasons,
        )  # fmt: skip
    # pytest refused to start (exit 4, before its session). Its command line or configuration (an option of a plugin
    # the environment lacks) is the grader's failure, the same on every attempt; a conftest that cannot import the
    # agent's missing package is the agent's 0. With a clean collection over the reference, it is always the latter.
    refused = PYTEST_USAGE_ERROR in codes and not outcomes and expected is None and _USAGE.search(tail)
    if refused:
        raise DeterministicFailure(f"pytest refused its command line or configuration (exit 4): {tail}")
    if not sessions:
        if timed_out:
            return Verdict(outcome="scored", exit_codes=codes, timed_out=True, detail=detail)
        if PYTEST_USAGE_ERROR in codes:
            raise DeterministicFailure(f"pytest refused its command line or configuration (exit 4): {tail}")
        raise VerifierFailure(f"no command ran pytest (the grader plugin never reported); output: {tail}")
    passed = sum(o == "passed" for o in outcomes.values())
    failed = sum(o == "failed" for o in outcomes.values()) + len(collect_errors)
    declared = spec.declared_test_count
    # without a declared count, the host's clean collection over the reference is the denominator: a test the
    # workspace skipped (a stub raising unittest.SkipTest) or never ran counts as not passed
    counted_ids = len(expected) if expected is not None else 0
    denominator = declared if declared is not None else max(counted_ids, passed + failed)
    score = min(passed / denominator, 1.0) if denominator else 0.0
    return Verdict(
        outcome="scored",
        score=score,
        passed=passed,
        failed=failed,
        skipped=sum(o == "skipped" for o in outcomes.values()),
        declared=declared,
        exit_codes=codes,
        timed_out=timed_out,
        detail=detail or ("" if score == 1.0 else tail),
    )


def _score(
    task: Task,
    spec: VerifierSpec,
    graded: Path,
    logs: Path,
    shown: str,
    codes: list[int],
    timed_out: bool,
    tail: str,
) -> Verdict:
    """The verdict the commands' artifacts give (blocking); `VerifierFailure` when the artifact is missing or bad."""
    detail = f"the verifier ran out of its {spec.timeout_s:g} s" if timed_out else ""
    match spec.result:
        case "exit_code":
            ok = bool(codes) and not timed_out and all(c == 0 for c in codes)
            return Verdict(
                outcome="scored",
                score=1.0 if ok else 0.0,
                exit_codes=codes,
                timed_out=timed_out,
                detail=detail or ("" if ok else tail),
            )
        case "reward_file":
            raw = _read_artifact(graded, logs, shown, spec.report_path)
            if raw is None:
                if timed_out:
                    return Verdict(outcome="scored", exit_codes=codes, timed_out=True, detail=detail)
                raise VerifierFailure(
                    f"the verifier wrote no reward file at {spec.report_path}; output: {tail}"
                )
            try:
                reward = float(raw.decode().strip())
            except (UnicodeDecodeError, ValueError):
                raise VerifierFailure(
                    f"the reward file {spec.report_path} does not hold a number: {raw[:100]!r}"
                ) from None
            if not math.isfinite(reward):
                raise VerifierFailure(f"the reward file {spec.report_path} holds {reward}")
            return Verdict(
                outcome="scored", score=reward, exit_codes=codes, timed_out=timed_out, detail=detail
            )
        case "junit":
            if spec.report_path:
                raw = _read_artifact(graded, logs, shown, spec.report_path)
                reports = [raw] if raw is not None else []
            else:
                report_dir = graded / REPORT_DIR
                names = sorted(os.listdir(report_dir)) if report_dir.is_dir() else []
                reports = [
                    r
                    for n in names
                    if (r := _read_artifact(graded, logs, shown, f"{REPORT_DIR}/{n}")) is not None
                ]
            if not reports:
                if timed_out:
                    return Verdict(outcome="scored", exit_codes=codes, timed_out=True, detail=detail)
                raise VerifierFailure(
                    f"the commands wrote no JUnit report (did they run pytest?); output: {tail}"
                )
            counts = Counter[str]()
            for raw in reports:
                counts.update(count_junit(raw, _hidden_test_stems(task)))
            run = counts["passed"] + counts["failed"]
            declared = spec.declared_test_count
            denominator = declared if declared is not None else run
            score = min(counts["passed"] / denominator, 1.0) if denominator else 0.0
            return Verdict(
                outcome="scored",
                score=score,
                passed=counts["passed"],
                failed=counts["failed"],
                skipped=counts["skipped"],
                declared=declared,
                exit_codes=codes,
                timed_out=timed_out,
                detail=detail or ("" if score == 1.0 else tail),
            )


class ArtifactRedirected(Exception):
    """A directory or file on the way to an artifact under /logs is a link: the commands (which run the agent's code)
    pointed the host's read somewhere else. Tampering."""


def _read_beneath(root: Path, relative: str) -> bytes | None:
    """The regular file ``root/relative``, opened component by component without following any link (blocking);
    None when absent; `ArtifactRedirected` when a component is a link."""
    parts = [p for p in PurePosixPath(relative).parts if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)]
    try:
        for i, part in enumerate(parts):
            try:
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if stat.S_ISLNK(st.st_mode):
                raise ArtifactRedirected(f"{LOGS_DIR}/{'/'.join(parts[: i + 1])} is a link")
            last = i == len(parts) - 1
            if stat.S_ISREG(st.st_mode) != last or not (last or stat.S_ISDIR(st.st_mode)):
                return None
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            fds.append(os.open(part, flags, dir_fd=fds[-1]))
        size = os.fstat(fds[-1]).st_size
        if size > MAX_REPORT_BYTES:
            raise VerifierFailure(f"the artifact {relative} is {size} bytes, over {MAX_REPORT_BYTES}")
        with os.fdopen(os.dup(fds[-1]), "rb") as f:
            return f.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a link between the look and the open
            raise ArtifactRedirected(f"{LOGS_DIR}/{relative} became a link") from None
        raise
    finally:
        for fd in fds:
            os.close(fd)


def _read_artifact(graded: Path, logs: Path, shown: str, path: str) -> bytes | None:
    """An artifact the verifier wrote: under /logs (bound to ``logs``; read without following links) or in the
    workspace; None when absent."""
    try:
        if path.startswith(LOGS_DIR + "/"):
            data = _read_beneath(logs, path[len(LOGS_DIR) + 1 :])
            if data is None:
                return None
        else:
            data = paths.read_file(graded, path, shown)
    except (SandboxError, FileNotFoundError):
        return None
    if len(data) > MAX_REPORT_BYTES:
        raise VerifierFailure(f"the artifact {path} is {len(data)} bytes, over {MAX_REPORT_BYTES}")
    return data


def _hidden_test_stems(task: Task) -> frozenset[str]:
    """Module names of the hidden test files (``tests/test_a.py`` -> ``test_a``); empty: count every test case."""
    return frozenset(
        PurePosixPath(p).stem for p in (*task.hidden_files, *task.missing_hidden_files) if p.endswith(".py")
    )


def count_junit(raw: bytes, only: frozenset[str] = frozenset()) -> Counter[str]:
    """Passed, failed (failures and errors) and skipped test cases of a JUnit XML report.

    ``only``: count just the cases whose class name names one of these modules (``tests.test_a.TestX`` -> test_a).
    """
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as exc:
        raise VerifierFailure(f"the JUnit report is not valid XML: {exc}") from None
    counts: Counter[str] = Counter(passed=0, failed=0, skipped=0)
    for case in root.iter("testcase"):
        # a collection error has no class name; its name is the module's
        where = case.get("classname") or case.get("name") or ""
        if only and not only.intersection(where.split(".")):
            continue
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            counts["failed"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts
