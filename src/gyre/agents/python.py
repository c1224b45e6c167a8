"""Python agents: a callable of the user's (an openai-agents, langgraph or smolagents agent, or any code) run in the
driver's process, talking to its own router session over HTTP and acting through the execution's sandbox.

The callable is named ``MODULE:ATTR`` or ``path/to/file.py:ATTR`` and takes one `ScaffoldContext`: the session's
OpenAI ``base_url`` (``http://127.0.0.1:PORT/s/{token}/v1``, a loopback port the runtime opens for this execution
alone, serving its session only), ``api_key`` and ``model``, the task's instruction, and helpers that run commands
and read and write files in the sandbox: ``await ctx.bash(...)`` from async code, ``ctx.bash_sync(...)`` from a
sync callable (which runs in a thread of its own, so the event loop keeps serving every other execution; the helper
hops onto the loop). It returns its final answer (a string or None) or an `AgentResult`; ``ctx.submit(answer)``
from a tool marks the task submitted. Whatever it raises is recorded on its execution as ``gave_up`` with the
traceback's tail, never raised into the driver. At the deadline the runtime stops waiting: an async callable is
cancelled, a sync one is abandoned in its thread (its helpers raise `AgentError` from then on and its session's
port is closed, so it stops at its next call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gyre.agents.contract import AgentContext, AgentResult
from gyre.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from gyre.sandbox import Sandbox

COMMAND_TIMEOUT_S = 120.0  # one command's wall clock at most (less when the deadline is nearer)
MAX_OUTPUT_CHARS = 8_000  # a command's output past this is cut in the middle, as the built-in agent does
TRACEBACK_CHARS = 4_000  # of a failed callable's traceback, kept on its execution
T = TypeVar("T")


@dataclass
class ScaffoldContext:
    """What a Python agent gets: its router session as an OpenAI endpoint, its task, and its sandbox.

    Async helpers (``bash``, ``read_file``, ``write_file``) are for code on the event loop; their ``_sync`` twins
    for a sync callable and its tools (they run on the loop and wait for it; never call them on the loop itself).
    """

    base_url: str  # the session's OpenAI base URL (ends in /v1); only this execution's session answers there
    api_key: str  # the session token: pass it as the API key
    model: str  # the served model's name, for the ``model`` field
    task: str  # the task's instruction: the agent's prompt
    task_id: str
    execution_id: str
    workspace: Path  # the sandbox's workspace as the driver sees it; commands run there (``bash``'s cwd)
    deadline: float  # time.monotonic() by which the execution ends
    max_steps: int = 30  # model calls the agent should make at most (run.agent_max_calls / --max-steps)
    max_tokens: int | None = None  # per model call; None: the framework's default
    temperature: float | None = None  # to ask for (gyre train: the one its loss assumes); None: default
    submitted: str | None = None  # the answer ``submit`` was given, if it was called
    _sandbox: Sandbox | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _pending: set[concurrent.futures.Future[Any]] = field(default_factory=set, repr=False)
    _closed: bool = field(default=False, repr=False)

    def remaining_s(self) -> float:
        """Seconds left before the deadline."""
        return max(self.deadline - time.monotonic(), 0.0)

    def submit(self, answer: str) -> str:
        """Mark the task done with ``answer`` (safe from any thread); returns what a submit tool should say."""
        self.submitted = str(answer)
        return "Submitted."

    async def bash(self, command: str, timeout_s: float | None = None) -> str:
        """Run ``command`` with bash in the sandbox's workspace: its exit code and output (cut past
        `MAX_OUTPUT_CHARS`), as a tool returns it to the model. ``timeout_s`` defaults to `COMMAND_TIMEOUT_S`,
        never past the deadline."""
        limit = min(timeout_s or COMMAND_TIMEOUT_S, self.remaining_s())
        result = await self._box().exec(command, timeout_s=max(limit, 1.0))
        text = f"exit code: {result.exit_code}" + (" (timed out)" if result.timed_out else "")
        if result.stdout:
            text += f"\nstdout:\n{result.stdout}"
        if result.stderr:
            text += f"\nstderr:\n{result.stderr}"
        return cut(text)

    async def read_file(self, path: str) -> str:
        """A workspace file's text (UTF-8, undecodable bytes replaced)."""
        return (await self._box().read_file(path)).decode("utf-8", errors="replace")

    async def write_file(self, path: str, text: str) -> None:
        """Create or replace a workspace file (parent directories are created)."""
        await self._box().write_file(path, text)

    def bash_sync(self, command: str, timeout_s: float | None = None) -> str:
        """`bash` from a sync callable's thread."""
        return self._on_loop(self.bash(command, timeout_s))

    def read_file_sync(self, path: str) -> str:
        """`read_file` from a sync callable's thread."""
        return self._on_loop(self.read_file(path))

    def write_file_sync(self, path: str, text: str) -> None:
        """`write_file` from a sync callable's thread."""
        self._on_loop(self.write_file(path, text))

    def _box(self) -> Sandbox:
        if self._closed or self._sandbox is None:
            raise AgentError(f"execution {self.execution_id} is over: its sandbox is gone")
        return self._sandbox

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the execution's event loop and wait for it here (a worker thread)."""
        loop = self._loop
        if self._closed or loop is None:
            work.close()
            raise AgentError(f"execution {self.execution_id} is over: its sandbox is gone")
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            work.close()
            raise AgentError(
                "the _sync helpers would block the event loop: await ctx.bash(...) there instead"
            )
        future = asyncio.run_coroutine_threadsafe(work, loop)
        self._pending.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise AgentError(f"execution {self.execution_id} is over: its sandbox is gone") from None
        finally:
            self._pending.discard(future)

    def _close(self) -> None:
        """The execution is over: the helpers refuse, and commands a thread still waits on are cancelled."""
        self._closed = True
        for future in list(self._pending):
            future.cancel()


def cut(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text`` cut in the middle to ``limit`` characters, saying how much went."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


AgentCallable = Callable[[ScaffoldContext], Any]


def load(target: str) -> AgentCallable:
    """The callable ``MODULE:ATTR`` or ``path/to/file.py:ATTR`` names; `ConfigError` saying what is wrong."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"python agent {target!r}: expected MODULE:ATTR or path/to/file.py:ATTR")
    try:
        module = _load_file(where) if _is_path(where) else importlib.import_module(where)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"python agent {target!r}: cannot import {where}: {_one_line(exc)}") from exc
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(f"python agent {target!r}: {where} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(
            f"python agent {target!r}: {attr} is a {type(fn).__name__}, not a callable taking a ScaffoldContext"
        )
    return fn


def resolve(target: str) -> str:
    """``target`` with a file path made absolute (shards and later runs may start elsewhere), once it loads."""
    where, _, attr = target.rpartition(":")
    if _is_path(where):
        target = f"{Path(where).expanduser().resolve()}:{attr}"
    load(target)
    return target


def _is_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where


@functools.cache
def _load_file(path: str) -> Any:
    """A Python file as a module of its own (loaded once per process), under a name its path determines."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"python agent: no file {file}")
    name = f"gyre_agent_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _one_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip().replace("\n", " ")


class PythonAgent:
    """Runs a user's callable with a `ScaffoldContext` of its execution; see the module docstring."""

    def __init__(
        self,
        target: str,
        max_steps: int = 30,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        self.target = target
        self.max_steps, self.max_tokens, self.temperature = max_steps, max_tokens, temperature

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Call the callable and say how it ended; its exceptions end it as ``gave_up``."""
        if not ctx.base_url:
            raise AgentError("a python agent needs its session's base URL (the runtime opens a port for it)")
        fn = load(self.target)
        scaffold = ScaffoldContext(
            base_url=ctx.base_url,
            api_key=ctx.api_key,
            model=ctx.model,
            task=ctx.task.instruction,
            task_id=ctx.task.id,
            execution_id=ctx.execution_id,
            workspace=ctx.sandbox.workspace,
            deadline=ctx.deadline,
            max_steps=self.max_steps,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            _sandbox=ctx.sandbox,
            _loop=asyncio.get_running_loop(),
        )
        try:
            value = await (_call_async(fn, scaffold) if _is_async(fn) else _call_in_thread(fn, scaffold))
            if inspect.isawaitable(value):  # a sync callable that returned a coroutine
                value = await value
        except (Exception, SystemExit):  # a library that calls sys.exit() must not end the driver
            tail = traceback.format_exc()[-TRACEBACK_CHARS:]
            return AgentResult(
                status="gave_up", answer=scaffold.submitted, detail=f"{self.target} raised:\n{tail}"
            )
        finally:
            scaffold._close()
        return _result(value, scaffold)


def _is_async(fn: AgentCallable) -> bool:
    call = None if inspect.isroutine(fn) else type(fn).__call__  # a callable object: its method
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


async def _call_async(fn: AgentCallable, ctx: ScaffoldContext) -> Any:
    return await fn(ctx)


async def _call_in_thread(fn: AgentCallable, ctx: ScaffoldContext) -> Any:
    """``fn(ctx)`` in a daemon thread of its own; cancelling this stops waiting for it (nothing joins it later)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def work() -> None:
        try:
            value, error = contextvars.copy_context().run(fn, ctx), None
        except BaseException as exc:
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for it any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name=f"gyre-agent:{ctx.execution_id}", daemon=True).start()
    return await done


def _result(value: Any, ctx: ScaffoldContext) -> AgentResult:
    """How the callable ended, from what it returned and whether it submitted."""
    if isinstance(value, AgentResult):
        return value
    if value is not None and not isinstance(value, str):
        value = str(value)
    if ctx.submitted is not None:
        return AgentResult(status="submitted", answer=ctx.submitted, detail=value or "")
    return AgentResult(status="finished", answer=value)
