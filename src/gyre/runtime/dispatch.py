"""Dispatches executions (a task, a group index, an agent spec) and keeps the counters the elastic controller reads.

Each execution gets a router session and a sandbox, runs its agent under its wall-clock budget and its workspace's
disk and inode quotas, and ends as data: ``done``, ``budget_exceeded``, ``resource_exceeded`` (a quota, or a command
agent's processes killed in its sandbox past a memory, process or CPU limit: the agent is stopped, the workspace is
not scored, the verdict is a 0: what the agent caused in its own sandbox is its outcome, trained on), ``crashed`` or
``cancelled``; only the host's own faults (the driver out of descriptors, memory or disk) drop an execution. Then,
whatever the status (cancelled and over quota aside), the workspace loses its set-id bits and device files and the task's verifier
scores it (`gyre.tasks.verify`). Its result (records, status, verdict, timings, error) is journaled before anything
downstream sees it. Anything one execution raises, its verification and clean-up included, is recorded on it and
never reaches the others; cancelling the runtime cancels every execution and their sandboxes are cleaned up. A
command agent reaches the router only through its own socket, which serves its own session only (`sockets`); a
python agent (`gyre.agents.python`, in this process) through a loopback port restricted the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from gyre.agents.command import SOCKET_DIR
from gyre.agents.contract import Agent, AgentContext, AgentResult
from gyre.agents.modelclient import InProcessModelClient
from gyre.agents.toolagent import BuiltinAgent, BuiltinAgentConfig
from gyre.config import SandboxConfig
from gyre.errors import ResourceExceeded, SandboxError, TaskError, WorkspaceLimitExceeded
from gyre.journal import Journal
from gyre.journal.records import ApiCallRecord, CallRecord
from gyre.router.routing import Router
from gyre.runtime.sockets import session_port, session_socket
from gyre.sandbox import Sandbox, filetree, make_sandbox
from gyre.sandbox.workspace import HostSandbox, make_scratch, workspace_limits
from gyre.tasks import environments
from gyre.tasks.task import Task
from gyre.tasks.verify import Verdict, Verifier

log = logging.getLogger(__name__)
# the most of a running execution's wall clock its quota checks may take (a thread walking its workspace)
QUOTA_DUTY = 0.05
ExecutionStatus = Literal["done", "budget_exceeded", "resource_exceeded", "crashed", "cancelled"]


class BuiltinAgentSpec(msgspec.Struct, frozen=True, kw_only=True, tag="builtin"):
    """Run Gyre's built-in tool-calling agent."""

    config: BuiltinAgentConfig = msgspec.field(default_factory=BuiltinAgentConfig)


class CommandAgentSpec(msgspec.Struct, frozen=True, kw_only=True, tag="command"):
    """Run an external scaffold process in the sandbox, its OpenAI environment pointing at its own session."""

    argv: list[str]
    env: dict[str, str] = msgspec.field(default_factory=dict)
    python_env: bool = True  # show the driver's Python installation read-only, for scaffolds installed there


class PythonAgentSpec(msgspec.Struct, frozen=True, kw_only=True, tag="python"):
    """Run a Python callable in the driver's process (`gyre.agents.python`): an openai-agents, langgraph or smolagents
    agent, or any code, given its session's OpenAI base URL and key and the execution's sandbox."""

    target: str  # MODULE:ATTR or /absolute/path/file.py:ATTR, loadable in the process running the execution
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 30  # model calls to make at most (max_turns binds too)
    max_tokens: int | None = None  # per call, for the callable to pass on; None: the framework's default
    temperature: float | None = None  # the sampling temperature to ask for; None: the framework's default


class OracleAgentSpec(msgspec.Struct, frozen=True, kw_only=True, tag="oracle"):
    """Write the task's reference solution instead of running a model (validates a suite)."""


AgentSpec = BuiltinAgentSpec | CommandAgentSpec | PythonAgentSpec | OracleAgentSpec


class ExecutionSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One execution to run: which task, which member of its group, which agent."""

    task: Task
    group_index: int = 0
    agent: AgentSpec = msgspec.field(default_factory=BuiltinAgentSpec)
    execution_id: str = ""  # empty: one is made up


class ExecutionResult(msgspec.Struct, frozen=True, kw_only=True):
    """How an execution ended; journaled (``executions.jsonl``) before the runtime returns it."""

    execution_id: str
    task_id: str
    group_index: int
    status: ExecutionStatus
    agent: AgentResult | None  # None when the agent did not finish by itself
    error: str | None  # what went wrong: a crash, the quota passed, a failed verification or clean-up
    records: list[CallRecord]  # every model call, in order, token-exact (deltas on the calls they extend)
    prompt_tokens: int  # new input tokens over all calls
    completion_tokens: int
    dispatched_s: float  # wall-clock timestamps
    started_s: float
    finished_s: float
    verdict: Verdict | None = None  # the verifier's; None when cancelled or verification is off
    reward: float = 0.0  # the verdict's score (0 for placeholders, dropped and unscored executions)
    api_calls: list[ApiCallRecord] = msgspec.field(default_factory=list)  # calls to an outside model, as text

    @property
    def calls(self) -> int:
        """Model calls made, token-exact or to an outside model."""
        return len(self.records) + len(self.api_calls)

    @property
    def trainable(self) -> bool:
        """Whether it stays in its group for training: scored or a placeholder (not dropped, unscored, cancelled)."""
        return self.verdict is not None and self.verdict.trainable


class RuntimeStatistics(msgspec.Struct, frozen=True):
    """Counters of one burst, readable at any time: the elastic controller drives from them."""

    dispatched: int  # d(t)
    started: int  # p(t)
    finished: int  # f(t)
    water_level: int  # w(t) = d(t) - f(t)
    running: int
    by_status: dict[str, int]
    burst: int = 0  # which burst these counters are of
    in_flight: int = 0  # executions dispatched and not finished, of every burst (overlapping bursts included)
    internal_errors: int = 0  # verifications and clean-ups that raised, recorded on their executions


@dataclass
class _Burst:
    """One burst's counters."""

    dispatched: int = 0
    started: int = 0
    finished: int = 0
    by_status: Counter[str] = field(default_factory=Counter)


class Runtime:
    """Runs executions against a router, each in its own sandbox, all in the calling event loop."""

    def __init__(
        self,
        router: Router,
        sandbox: SandboxConfig | None = None,
        journal_dir: str | None = None,
        max_concurrency: int = 0,
        verifier: Verifier | Literal[False] | None = None,
    ) -> None:
        """``verifier``: scores each execution; None makes one on the same sandbox settings, False verifies nothing."""
        self.router = router
        self.sandbox_cfg = sandbox or SandboxConfig()
        self.verifier = Verifier(self.sandbox_cfg) if verifier is None else verifier or None
        self.journal = Journal(journal_dir, "executions.jsonl") if journal_dir else None
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self._bursts: dict[int, _Burst] = {0: _Burst()}
        self._burst = 0  # the burst new executions join
        self._internal_errors = 0

    def statistics(self, burst: int | None = None) -> RuntimeStatistics:
        """The counters of ``burst`` (default: the current one) now."""
        number = self._burst if burst is None else burst
        b = self._bursts.get(number)
        if b is None:
            raise KeyError(f"no burst {number}; bursts so far: 0-{self._burst}")
        return RuntimeStatistics(
            dispatched=b.dispatched,
            started=b.started,
            finished=b.finished,
            water_level=b.dispatched - b.finished,
            running=b.started - b.finished,
            by_status=dict(b.by_status),
            burst=number,
            in_flight=sum(x.dispatched - x.finished for x in self._bursts.values()),
            internal_errors=self._internal_errors,
        )

    def new_burst(self) -> int:
        """Executions dispatched from now on form a new burst (returned); earlier ones may still be running (bursts
        overlap) and keep their own counters, readable with ``statistics(burst)``."""
        self._burst += 1
        self._bursts[self._burst] = _Burst()
        return self._burst

    async def run(self, specs: Iterable[ExecutionSpec]) -> list[ExecutionResult]:
        """Dispatch every spec at once and return their results in order (cancellation cancels them all)."""
        specs = list(specs)
        await self._check_supported(specs)
        burst = self._bursts[self._burst]
        burst.dispatched += len(specs)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._execute(spec, burst)) for spec in specs]
        return [t.result() for t in tasks]

    async def run_one(self, spec: ExecutionSpec) -> ExecutionResult:
        """Dispatch one execution and wait for it."""
        await self._check_supported([spec])
        burst = self._bursts[self._burst]
        burst.dispatched += 1
        return await self._execute(spec, burst)

    async def _execute(self, spec: ExecutionSpec, burst: _Burst) -> ExecutionResult:
        dispatched = time.time()
        execution_id = spec.execution_id or f"{spec.task.id}/{spec.group_index}/{uuid.uuid4().hex[:8]}"
        held = self._slots is not None
        if self._slots is not None:
            await self._slots.acquire()
        started = time.time()
        burst.started += 1
        token = self.router.open_session(execution_id)
        status: ExecutionStatus = "crashed"
        agent_result: AgentResult | None = None
        errors: list[str] = []
        scratch: Path | None = None
        verdict: Verdict | None = None
        unscorable = False  # the workspace could not be made safe for the host: never scored
        infrastructure = ""  # the driver itself failed it (out of descriptors, memory, disk): never trained
        try:
            # set once the task's files are in: from then on there is something to score
            ready = asyncio.Event()
            try:
                scratch = await asyncio.to_thread(self._make_scratch)
                async with asyncio.timeout(spec.task.time_budget_s):
                    agent_result = await self._run_agent(
                        spec, execution_id, token, scratch / "workspace", ready
                    )
                status = "done"
            except TimeoutError:
                status = "budget_exceeded"
            except (WorkspaceLimitExceeded, ResourceExceeded) as exc:
                status = "resource_exceeded"
                errors.append(str(exc))
            except Exception as exc:  # a failed execution is data, never raised to its neighbours
                errors.append(_describe(exc))
                log.info("execution %s crashed: %s", execution_id, errors[-1])
                if _host_fault(exc):
                    infrastructure = errors[-1]
            if self._slots is not None:  # verification needs no model: free the slot for the next execution
                self._slots.release()
                held = False
            workspace = scratch / "workspace" if scratch is not None and ready.is_set() else None
            if workspace is not None and status != "resource_exceeded":
                try:  # the last word on the quota, and nothing privileged leaves the sandbox: one walk
                    await asyncio.to_thread(filetree.sanitize, workspace, workspace_limits(self.sandbox_cfg))
                except WorkspaceLimitExceeded as exc:
                    status = "resource_exceeded"
                    errors.append(str(exc))
                except (OSError, SandboxError) as exc:
                    self._internal_errors += 1
                    errors.append(f"the workspace could not be checked: {_describe(exc)}")
                    unscorable = True
                    infrastructure = errors[-1] if _host_fault(exc) else infrastructure
            if self.verifier is not None:
                verdict = await self._verify(
                    spec, execution_id, workspace, status, errors, unscorable, infrastructure
                )
        except asyncio.CancelledError:
            self._finish(
                spec, burst, execution_id, token, "cancelled", None, "cancelled", dispatched, started, None
            )
            raise
        finally:
            if self._slots is not None and held:
                self._slots.release()
            if scratch is not None:
                cleanup = await self._remove(scratch)
        if scratch is not None and cleanup is not None:
            errors.append(cleanup)
        error = "\n".join(errors) or None
        return self._finish(
            spec, burst, execution_id, token, status, agent_result, error, dispatched, started, verdict
        )

    async def _verify(
        self,
        spec: ExecutionSpec,
        execution_id: str,
        workspace: Path | None,
        status: ExecutionStatus,
        errors: list[str],
        unscorable: bool,
        infrastructure: str = "",
    ) -> Verdict:
        """The verifier's verdict. What the agent caused in its own sandbox is its outcome, trained on: over its quota,
        or a workspace that cannot be made safe to score (too deep, unreadable), scores 0. Only the host's faults are
        ``dropped``: the driver out of descriptors, memory or disk while running it (``infrastructure``), or the
        verifier raising (the reason is the last of ``errors``)."""
        assert self.verifier is not None
        if infrastructure:
            return Verdict(
                outcome="dropped", detail=f"the host failed this execution, not its agent: {infrastructure}"
            )
        if status == "resource_exceeded" or unscorable:
            return Verdict(
                outcome="scored", score=0.0, detail=f"the agent's own doing, scored 0: {errors[-1]}"
            )
        try:
            return await self.verifier.verify(spec.task, workspace, execution_id)
        except Exception as exc:  # the verifier's bug or a hostile workspace: this execution's, no one else's
            self._internal_errors += 1
            errors.append(f"verification failed: {_describe(exc)}")
            log.warning("verification of %s raised: %s", spec.task.id, errors[-1])
            return Verdict(outcome="dropped", detail=errors[-1])

    async def _remove(self, scratch: Path) -> str | None:
        """Delete an execution's scratch directory off the loop (a cancellation still waits for it); what went wrong,
        if anything."""
        removing = asyncio.ensure_future(asyncio.to_thread(filetree.remove, scratch))
        try:
            await asyncio.shield(removing)
        except asyncio.CancelledError:
            await asyncio.wait([removing])
            raise
        except Exception as exc:
            self._internal_errors += 1
            log.warning("cannot remove %s: %s", scratch, exc)
            return f"clean-up failed: {_describe(exc)}"
        return None

    def _make_scratch(self) -> Path:
        """A private directory holding the execution's workspace, which outlives its sandbox until it is scored."""
        scratch = make_scratch(self.sandbox_cfg.workspace_root, "gyre-execution-")
        (scratch / "workspace").mkdir()
        return scratch

    async def _run_agent(
        self, spec: ExecutionSpec, execution_id: str, token: str, workspace: Path, ready: asyncio.Event
    ) -> AgentResult:
        async with contextlib.AsyncExitStack() as stack:
            binds: list[tuple[str, str, bool]] = []
            if isinstance(spec.agent, CommandAgentSpec):
                # its own socket, read-only, for its session only: no other sandbox sees it, no other token works
                socket_dir = await stack.enter_async_context(session_socket(self.router, token))
                binds.append((socket_dir, SOCKET_DIR, False))
                if spec.agent.python_env:
                    binds += [(p, p, False) for p in sorted({sys.prefix, sys.base_prefix})]
            base_url = ""
            if isinstance(spec.agent, PythonAgentSpec):  # in this process: its HTTP clients need a URL
                port = await stack.enter_async_context(session_port(self.router, token))
                base_url = f"http://127.0.0.1:{port}/s/{token}/v1"
            task = spec.task
            sandbox = await stack.enter_async_context(
                make_sandbox(
                    msgspec.structs.replace(self.sandbox_cfg, image=task.image or self.sandbox_cfg.image),
                    workspace=workspace,
                    binds=binds,
                    python_env=await environments.ensure_path(task, self.sandbox_cfg),
                    variables=task.environment.env if task.environment is not None else None,
                )
            )
            for path, text in spec.task.files.items():
                await sandbox.write_file(path, text)
            ready.set()
            ctx = AgentContext(
                execution_id=execution_id,
                task=spec.task,
                client=InProcessModelClient(self.router, token),
                sandbox=sandbox,
                deadline=time.monotonic() + spec.task.time_budget_s,
                group_index=spec.group_index,
                base_url=base_url,
                api_key=token,
                model=self.router.model_name,
            )
            return await self._within_quota(self._agent(spec).run(ctx), sandbox)
        raise AssertionError("unreachable")  # for mypy: the exit stack does not swallow exceptions

    async def _within_quota(self, run: Coroutine[Any, Any, AgentResult], sandbox: Sandbox) -> AgentResult:
        """Run the agent while measuring its workspace (and /tmp) every ``quota_check_s``: past a quota, the agent
        is stopped and `WorkspaceLimitExceeded` raised."""
        roots = [sandbox.workspace]
        if isinstance(sandbox, HostSandbox):
            roots.append(sandbox.root / "tmp")
        limits = workspace_limits(self.sandbox_cfg)
        try:
            async with asyncio.TaskGroup() as group:
                agent = group.create_task(run)
                watch = group.create_task(_watch_quota(roots, limits, self.sandbox_cfg.quota_check_s))
                agent.add_done_callback(lambda _: watch.cancel())
        except ExceptionGroup as failed:  # the agent's own failure or the quota's, as it was raised
            raise failed.exceptions[0] from None
        return agent.result()

    async def aclose(self) -> None:
        """Close the journal (each command agent's socket already went with its execution)."""
        if self.journal is not None:
            self.journal.close()

    async def _check_supported(self, specs: list[ExecutionSpec]) -> None:
        """Refuse, before dispatching anything, tasks this host cannot run or score (`TaskError`); prepare the
        environments the tasks declare (built once per host, then a lookup: `gyre.tasks.environments`)."""
        for spec in specs:
            if spec.task.unsupported:
                raise TaskError(f"task {spec.task.id} cannot run on this host: {spec.task.unsupported}")
            if self.verifier is not None:
                self.verifier.check(spec.task)
        for task in {s.task.id: s.task for s in specs}.values():
            await environments.ensure(task, self.sandbox_cfg)

    def _agent(self, spec: ExecutionSpec) -> Agent:
        match spec.agent:
            case BuiltinAgentSpec(config=config):
                turns = spec.task.limits.max_turns  # the task's own limit binds every caller (eval, training)
                if turns is not None and turns < config.max_steps:
                    config = msgspec.structs.replace(config, max_steps=turns)
                return BuiltinAgent(config)
            case CommandAgentSpec():
                from gyre.agents.command import CommandAgent

                return CommandAgent(spec.agent.argv, spec.agent.env)
            case PythonAgentSpec(target=target, max_steps=steps, max_tokens=tokens, temperature=temperature):
                from gyre.agents.python import PythonAgent

                turns = spec.task.limits.max_turns
                steps = steps if turns is None else min(steps, turns)
                return PythonAgent(target, steps, tokens, temperature)
            case OracleAgentSpec():
                from gyre.agents.oracle import OracleAgent

                return OracleAgent()
        raise TypeError(f"unknown agent spec {spec.agent!r}")

    def _finish(
        self,
        spec: ExecutionSpec,
        burst: _Burst,
        execution_id: str,
        token: str,
        status: ExecutionStatus,
        agent_result: AgentResult | None,
        error: str | None,
        dispatched: float,
        started: float,
        verdict: Verdict | None,
    ) -> ExecutionResult:
        session = self.router.sessions.close(token)
        records = session.records if session is not None else []
        api_calls = session.api_calls if session is not None else []
        result = ExecutionResult(
            execution_id=execution_id,
            task_id=spec.task.id,
            group_index=spec.group_index,
            status=status,
            agent=agent_result,
            error=error,
            records=list(records),
            prompt_tokens=sum(len(r.new_input_ids) for r in records)
            + sum(c.prompt_tokens for c in api_calls),
            completion_tokens=sum(len(r.output_ids) for r in records)
            + sum(c.completion_tokens for c in api_calls),
            dispatched_s=dispatched,
            started_s=started,
            finished_s=time.time(),
            verdict=verdict,
            reward=verdict.score if verdict is not None and verdict.outcome == "scored" else 0.0,
            api_calls=list(api_calls),
        )
        if self.journal is not None:  # journaled before anything downstream sees it
            self.journal.append(result)
        burst.finished += 1
        burst.by_status[status] += 1
        return result


async def _watch_quota(roots: list[Path], limits: filetree.Limits, every_s: float) -> None:
    """Measure ``roots`` together every ``every_s`` (or less often, so that measuring takes at most `QUOTA_DUTY` of
    the time: a large workspace is walked less often) until cancelled; `WorkspaceLimitExceeded` past ``limits``."""
    while True:
        start = time.monotonic()
        await asyncio.to_thread(_measure, roots, limits)
        await asyncio.sleep(max(every_s, (time.monotonic() - start) / QUOTA_DUTY))


def _measure(roots: list[Path], limits: filetree.Limits) -> filetree.Usage:
    """The usage of ``roots`` together (blocking); `WorkspaceLimitExceeded` past ``limits``."""
    used = filetree.Usage()
    for root in roots:
        filetree.usage(root, limits, used)
    return used


_HOST_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EIO})


def _host_fault(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the driver's own resources failing: descriptors, memory, disk."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno in _HOST_ERRNOS:
            return True
        if "Too many open files" in str(item):  # wrapped by a library that kept only the message
            return True
        stack += [item.__cause__, item.__context__, *getattr(item, "exceptions", ())]
    return False


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()
