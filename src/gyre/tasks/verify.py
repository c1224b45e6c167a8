"""Scoring what an execution built: the task's verifier, run on a copy of its workspace in a fresh sandbox.

The score comes from artifacts, never from how the execution ended: an execution that ran out of time or crashed is
verified like one that finished. Each verification ends as one `Verdict`:

- ``scored``: the verifier ran and its artifact (a JUnit report, a reward file, exit codes) gave the score;
- ``placeholder``: nothing evaluable exists (the workspace was never set up); reward 0, so the group stays complete;
- ``dropped``: the verifier itself failed (infrastructure: a sandbox that would not start, a missing tool, no report
  where one must be) on every attempt of its retry budget; the execution leaves training and is counted;
- ``unscored``: the task has no verifier.

Before the commands run, the agent's copies of what the grader supplies are removed: the hidden test directories,
the task's ``remove`` paths (packaging and pytest configuration files the grader replaces) and any stale report. A
JUnit score counts only test cases from the hidden test files, so tests an agent adds cannot raise it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import math
import os
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Literal

import msgspec

from gyre.config import SandboxConfig
from gyre.errors import SandboxError, TaskError
from gyre.sandbox import Sandbox, make_sandbox, paths
from gyre.sandbox.workspace import SYSTEM_PATH, copy_tree, make_scratch
from gyre.tasks.base import Task, VerifierSpec

log = logging.getLogger(__name__)

Outcome = Literal["scored", "placeholder", "dropped", "unscored"]
TRAINABLE_OUTCOMES: tuple[Outcome, ...] = ("scored", "placeholder")  # these stay in their group for training
SandboxFactory = Callable[[SandboxConfig, Path, Sequence[tuple[str, str, bool]]], Sandbox]

REPORT_DIR = ".gyre-verifier"  # where pytest writes its JUnit reports (one per command) in the graded copy
LOGS_DIR = (
    "/logs"  # Harbor's verifier writes /logs/verifier/reward.txt: a writable host directory is bound here
)
MAX_REPORT_BYTES = 64 << 20  # a larger report is not parsed (infrastructure failure)
COMMAND_NOT_FOUND = 127


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """How one execution's work products scored, and how sure that score is."""

    outcome: Outcome
    score: float = 0.0  # the reward: in [0, 1] for JUnit and exit-code verifiers; 0 unless scored
    passed: int | None = None  # JUnit: hidden test cases that passed
    failed: int | None = None  # JUnit: failed or errored (collection errors included)
    skipped: int | None = None
    declared: int | None = None  # the task's declared test count (the score's denominator)
    exit_codes: list[int] = msgspec.field(default_factory=list)  # of the verifier's commands, in order
    timed_out: bool = (
        False  # the commands ran out of the verifier's time budget (a legitimate score, not a failure)
    )
    attempts: int = 0  # verifier runs, retries included
    detail: str = ""  # why it was dropped or a placeholder; the verifier's output tail when it scored 0
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
    ) -> None:
        """``retries``: attempts after the first before dropping; ``python_env``: show the driver's Python (and its
        pytest) read-only to the commands, first on their PATH."""
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries}")
        self.sandbox_cfg = sandbox or SandboxConfig()
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.python_env = python_env
        self._factory: SandboxFactory = sandbox_factory or (
            lambda cfg, ws, binds: make_sandbox(cfg, ws, binds)
        )
        self._outcomes: Counter[str] = Counter()
        self._retries = 0

    def statistics(self) -> VerifierStatistics:
        """Verdicts so far, by outcome, and the retries they took."""
        return VerifierStatistics(sum(self._outcomes.values()), dict(self._outcomes), self._retries)

    async def verify(self, task: Task, workspace: Path | None) -> Verdict:
        """Score the workspace an execution of ``task`` left (``None``: it never had one: a placeholder)."""
        verdict = await self._verify(task, workspace)
        self._outcomes[verdict.outcome] += 1
        self._retries += max(verdict.attempts - 1, 0)
        return verdict

    def check(self, task: Task) -> None:
        """Raise `TaskError` when this verifier cannot score ``task`` at all (check before running it)."""
        if task.unsupported:
            raise TaskError(f"task {task.id} cannot be verified on this host: {task.unsupported}")
        report = task.verifier.report_path if task.verifier is not None else ""
        if report.startswith("/") and self.sandbox_cfg.backend != "bubblewrap":
            raise TaskError(
                f"task {task.id}: its verifier writes {report}, outside the workspace, which only the bubblewrap "
                "backend can give each execution its own copy of (sandbox.backend = 'bubblewrap')"
            )
        if report.startswith("/") and not report.startswith(LOGS_DIR + "/"):
            raise TaskError(
                f"task {task.id}: verifier report {report}: an absolute path must be under {LOGS_DIR}/"
            )

    async def _verify(self, task: Task, workspace: Path | None) -> Verdict:
        self.check(task)
        if task.verifier is None:
            return Verdict(outcome="unscored", detail="the task has no verifier")
        if workspace is None or not await asyncio.to_thread(workspace.is_dir):
            return Verdict(
                outcome="placeholder", detail="nothing to evaluate: the workspace was never set up"
            )
        start = time.monotonic()
        failures: list[str] = []
        for attempt in range(1, self.retries + 2):
            try:
                verdict = await self._attempt(task, task.verifier, workspace)
            except (VerifierFailure, SandboxError, OSError) as exc:
                failures.append(f"attempt {attempt}: {exc}")
                log.warning("verifier of %s failed (attempt %d): %s", task.id, attempt, exc)
                if attempt <= self.retries:
                    await asyncio.sleep(self.retry_delay_s * attempt)
                continue
            return msgspec.structs.replace(verdict, attempts=attempt, duration_s=time.monotonic() - start)
        return Verdict(
            outcome="dropped",
            attempts=len(failures),
            detail="the verifier failed on every attempt:\n" + "\n".join(failures),
            duration_s=time.monotonic() - start,
        )

    async def _attempt(self, task: Task, spec: VerifierSpec, workspace: Path) -> Verdict:
        scratch = await asyncio.to_thread(_make_scratch, self.sandbox_cfg.workspace_root)
        try:
            graded, logs = scratch / "workspace", scratch / "logs"
            await copy_tree(workspace, graded)
            await asyncio.to_thread(_prepare, task, spec, graded)
            binds = [(str(logs), LOGS_DIR, True)] if self.sandbox_cfg.backend == "bubblewrap" else []
            env = dict(spec.env)
            if self.python_env:
                binds += [(p, p, False) for p in sorted({sys.prefix, sys.base_prefix})]
                env.setdefault("PATH", f"{sys.prefix}/bin:{SYSTEM_PATH}")
            async with self._factory(self.sandbox_cfg, graded, binds) as sandbox:
                codes, timed_out, tail = await _run_commands(sandbox, spec, env)
                return await asyncio.to_thread(
                    _score, task, spec, graded, logs, sandbox.WORKSPACE, codes, timed_out, tail
                )
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)


def _make_scratch(workspace_root: str) -> Path:
    """A private directory for one attempt: the graded copy goes in ``workspace/``, /logs is ``logs/``."""
    scratch = make_scratch(workspace_root, "gyre-verify-")
    (scratch / "logs" / "verifier").mkdir(parents=True)
    for d in (scratch / "logs", scratch / "logs" / "verifier"):
        d.chmod(0o777)  # and write the reward under /logs
    return scratch


async def _run_commands(
    sandbox: Sandbox, spec: VerifierSpec, env: dict[str, str]
) -> tuple[list[int], bool, str]:
    """Run the commands in order, each in its own shell, within the verifier's budget: (exit codes, timed out, tail)."""
    deadline = time.monotonic() + spec.timeout_s
    codes: list[int] = []
    tail = ""
    for i, command in enumerate(spec.commands):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return codes, True, tail
        command_env = dict(env)
        if spec.result == "junit" and not spec.report_path:
            report = f"{sandbox.WORKSPACE}/{REPORT_DIR}/junit-{i}.xml"
            extra = f"-p no:cacheprovider --junitxml={report}"
            command_env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} {extra}".strip()
        result = await sandbox.exec(command, timeout_s=remaining, env=command_env)
        tail = (result.stdout + result.stderr)[-2000:]
        if result.exit_code == COMMAND_NOT_FOUND and "not found" in result.stderr:
            raise VerifierFailure(f"command {i} ({command!r}) could not run: {result.stderr.strip()[-300:]}")
        codes.append(result.exit_code)
        if result.timed_out:
            return codes, True, tail
    return codes, False, tail


def _prepare(task: Task, spec: VerifierSpec, graded: Path) -> None:
    """Remove what the grader supplies or replaces from the copy, then put the hidden files in (blocking)."""
    hidden_dirs = {PurePosixPath(p).parts[0] for p in task.hidden_files if len(PurePosixPath(p).parts) > 1}
    patterns = [*spec.remove, *sorted(hidden_dirs), REPORT_DIR]
    if spec.report_path and not spec.report_path.startswith("/"):
        patterns.append(spec.report_path)
    _remove_matching(graded, patterns)
    for path, text in task.hidden_files.items():
        paths.write_file(graded, path, str(graded), text.encode())


def _remove_matching(root: Path, patterns: list[str]) -> None:
    """Delete every entry under ``root`` whose relative path matches a pattern (never following symlinks)."""

    def matches(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return any(
            fnmatch.fnmatchcase(name, p[3:]) if p.startswith("**/") else fnmatch.fnmatchcase(rel, p)
            for p in patterns
        )

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in list(dirnames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            full = os.path.join(dirpath, name)
            if matches(rel):
                dirnames.remove(name)
                if os.path.islink(full):
                    os.unlink(full)
                else:
                    shutil.rmtree(full)
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if matches(rel):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))


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


def _read_artifact(graded: Path, logs: Path, shown: str, path: str) -> bytes | None:
    """An artifact the verifier wrote: under /logs (bound to ``logs``) or in the workspace; None when absent."""
    try:
        if path.startswith(LOGS_DIR + "/"):
            host = logs / path[len(LOGS_DIR) + 1 :]
            if host.is_symlink() or not host.is_file():
                return None
            data = host.read_bytes()
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
