"""A runtime shard: one process (`gyre shard`) hosting a runtime (executions, their sandboxes and verifiers) and a
router for its own sessions, driven by the driver's shard hub (`gyre.runtime.shards`) over ZeroMQ.

The shard says `ShardHello` until the hub answers `ShardWelcome` (its runtimes, its journal directories and the
engines the controller routes to now); then it runs each `ShardRun` it is sent and answers its `ShardResult` (the
result, which it journals once the hub takes it: one journal per shard), applies each `EngineOp` to its router's pool and
acknowledges it, and every ``report_s`` sends a `ShardReport`: its counters and its pool's load, in one message
(what the controller sees of it; its silence is its loss). Tokens never leave the shard but in the records of a
finished execution; the engines it calls are the cells' own, reached over HTTP like the driver's router reaches them.

The hub decides how each execution ends, the shard writes it down: a result is journaled only once the hub answers
it `ShardJournal` (it took the result: the shard was live when it arrived), held until then. A hub that lost the
shard (silent for ``shards.timeout_s``) has journaled its running executions ``dropped`` itself; it answers anything
the shard says later with ``ShardStop(lost=True)``, which the shard obeys by dropping what it holds and what its
cancelled executions would journal, so a cut-off execution never ends twice, and never scored. The answers travel in
order on the one connection: a result the hub took is journaled before the stop that follows it is read. A shard
stopped at the end of the run (``lost=False``) journals everything, its cancelled executions included. The one gap:
a shard killed between the hub taking a result and writing it down (one local write) leaves it in no journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path
from typing import Any, Literal

import msgspec
import zmq
import zmq.asyncio

from gyre.config import GyreConfig
from gyre.control.chaos import FaultyStarts
from gyre.errors import TaskError
from gyre.journal import Journal
from gyre.router.pool import EnginePool
from gyre.router.routing import Router
from gyre.runtime.dispatch import AgentSpec, ExecutionResult, ExecutionSpec, Runtime
from gyre.tasks.task import Task
from gyre.tasks.verify import Verifier

log = logging.getLogger(__name__)


# ---- shard -> hub -----------------------------------------------------------------------------------------------
class ShardHello(msgspec.Struct, tag="shard_hello", kw_only=True):
    shard: str
    pid: int
    hostname: str
    node: str = ""  # the Ray node it runs on, when Ray placed it


class ShardReport(msgspec.Struct, tag="shard_report", kw_only=True):
    """A shard's counters since it started, sent every ``report_s`` (the batched counts of its executions)."""

    shard: str
    dispatched: int
    started: int
    finished: int
    running: int
    internal_errors: int
    moved_calls: int  # its router's calls continued on another engine (drains, failures)
    outstanding_tokens: dict[str, int]  # engine -> tokens of its calls in flight there


class ShardResult(msgspec.Struct, tag="shard_result", kw_only=True):
    shard: str
    job: int
    result: ExecutionResult | None = None
    error: str = ""  # the runtime refused the execution (``refused``) or raised
    refused: bool = False  # a TaskError: the task cannot run or be scored on this host


class ShardAck(msgspec.Struct, tag="shard_ack", kw_only=True):
    shard: str
    op: int
    error: str = ""
    moved_calls: int = 0


ShardMessage = ShardHello | ShardReport | ShardResult | ShardAck


# ---- hub -> shard -----------------------------------------------------------------------------------------------
class RuntimeSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One runtime a shard hosts (a training run has two: its executions and its held-out evaluations)."""

    journal_dir: str  # the shard journals under ``journal_dir/shards/NAME/``
    verifier_retries: int = 2
    chaos_starts: bool = (
        False  # [chaos] verifier_start_fail applies (the run's executions, not held-out ones)
    )
    max_concurrency: int = 0


EngineAction = Literal["add", "hold", "drain", "resume", "gone"]


class EngineOp(msgspec.Struct, tag="engine_op", kw_only=True):
    """The controller's word on one engine, for the shard's pool (``hold`` before ``drain``: see `EnginePool.hold`)."""

    op: int
    action: EngineAction
    engine: str
    url: str = ""
    destination: str | None = None
    reason: str = ""
    managed: bool = (
        True  # add: a cell's engine, its state the controller's word (else probed like any engine)
    )


class ShardWelcome(msgspec.Struct, tag="shard_welcome", kw_only=True):
    runtimes: dict[str, RuntimeSpec]
    calls_dir: str  # the router journals its calls under ``calls_dir/shards/NAME/``
    report_s: float
    engines: list[EngineOp]  # the engines as the controller routes to them now (op 0: no answer expected)


class ShardRun(msgspec.Struct, tag="shard_run", kw_only=True):
    """An execution to run. Its task travels as a map (a task file is text or bytes, a union msgspec cannot decode
    into a type; msgpack keeps the two apart by itself), rebuilt field by field (`execution`)."""

    job: int
    runtime: str
    task: dict[str, Any]
    group_index: int
    agent: AgentSpec
    execution_id: str

    @classmethod
    def of(cls, job: int, runtime: str, spec: ExecutionSpec) -> ShardRun:
        task = msgspec.to_builtins(spec.task, builtin_types=(bytes,))
        return cls(job=job, runtime=runtime, task=task, group_index=spec.group_index, agent=spec.agent,
                   execution_id=spec.execution_id)  # fmt: skip

    def execution(self) -> ExecutionSpec:
        """The execution as the driver sent it (`msgspec.ValidationError` for a malformed task)."""
        fields: dict[str, Any] = {}
        for f in msgspec.structs.fields(Task):
            if f.name not in self.task:
                continue
            value = self.task[f.name]
            if f.name in _FILE_FIELDS:
                if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, str | bytes) for k, v in value.items()
                ):
                    raise msgspec.ValidationError(f"task.{f.name} must map paths to text or bytes")
                fields[f.name] = value
            else:
                fields[f.name] = msgspec.convert(value, f.type)
        return ExecutionSpec(task=Task(**fields), group_index=self.group_index, agent=self.agent,
                             execution_id=self.execution_id)  # fmt: skip


_FILE_FIELDS = ("files", "hidden_files", "solution_files")


class ShardJournal(msgspec.Struct, tag="shard_journal", kw_only=True):
    """The hub took job ``job``'s result: the shard journals it (until then it holds it)."""

    job: int


class ShardStop(msgspec.Struct, tag="shard_stop", kw_only=True):
    """Stop: the run ends (journal every result), or the hub lost the shard (``lost``: journal nothing more, the
    hub journaled its executions dropped)."""

    lost: bool = False


HubMessage = ShardWelcome | ShardRun | EngineOp | ShardJournal | ShardStop
encoder = msgspec.msgpack.Encoder()


def shard_dir(base: str | Path, name: str) -> Path:
    """Where shard ``name`` journals what belongs under ``base``."""
    return Path(base) / "shards" / name


class HeldJournal(Journal):
    """A shard runtime's journal: it holds each result until the hub takes it (`release`), or until the shard stops
    (`settle`): a normal stop writes what it holds and everything after, a lost shard's writes nothing more."""

    def __init__(self, directory: str | Path) -> None:
        super().__init__(directory, "executions.jsonl")
        self.held: dict[str, ExecutionResult] = {}  # execution id -> result: sent, not yet taken
        self.mode: Literal["hold", "write", "drop"] = "hold"

    def append(self, item: object) -> None:
        """Hold a result (``hold``), write it (``write``) or forget it (``drop``: the hub cut it off)."""
        if self.mode == "write":
            super().append(item)
        elif self.mode == "hold":
            assert isinstance(item, ExecutionResult)
            self.held[item.execution_id] = item

    def release(self, execution_id: str) -> None:
        """The hub took this result: journal it."""
        if (result := self.held.pop(execution_id, None)) is not None:
            super().append(result)

    def settle(self, lost: bool) -> None:
        """The shard stops: write what it holds and all that follows, or (``lost``) none of it."""
        self.mode = "drop" if lost else "write"
        for result in self.held.values():
            if not lost:
                super().append(result)
        self.held.clear()


class Shard:
    """One shard process's runtimes and router; `serve` until the hub says stop."""

    def __init__(self, cfg: GyreConfig, name: str, hub: str, node: str = "") -> None:
        self.cfg, self.name, self.hub, self.node = cfg, name, hub, node
        self.runtimes: dict[str, Runtime] = {}
        self.router: Router | None = None
        self._decoder = msgspec.msgpack.Decoder(HubMessage)
        self._stopped = asyncio.Event()
        self._lost = False  # the hub lost it: its executions were cut off, none is journaled here any more
        self._jobs: set[asyncio.Task[None]] = set()  # executions running now
        self._journals: dict[str, HeldJournal] = {}  # runtime -> its journal
        self._sent: dict[int, tuple[str, str]] = {}  # job -> (runtime, execution id): awaits the hub

    async def serve(self) -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.name.encode())
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(self.hub)
        self._sock = sock
        try:
            welcome = await self._join()
            self._start(welcome)
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                reporter = tasks.create_task(self._report(welcome.report_s))
                receiver = tasks.create_task(self._receive())
                await self._stopped.wait()
                reporter.cancel()
                receiver.cancel()
                for journal in self._journals.values():
                    journal.settle(self._lost)
                for job in self._jobs:  # executions still running: cancelled, journaled as such (unless lost)
                    job.cancel()
        finally:
            for runtime in self.runtimes.values():
                await runtime.aclose()
            if self.router is not None:
                await self.router.aclose()
            sock.close(0)
            ctx.term()

    async def _join(self) -> ShardWelcome:
        hello = encoder.encode(ShardHello(shard=self.name, pid=os.getpid(), hostname=socket.gethostname(),
                                          node=self.node))  # fmt: skip
        while True:  # again each second until welcomed: the hub may not be up yet
            await self._sock.send(hello)
            if await self._sock.poll(1000):
                message = self._decoder.decode(await self._sock.recv())
                if isinstance(message, ShardWelcome):
                    return message

    def _start(self, welcome: ShardWelcome) -> None:
        calls = shard_dir(welcome.calls_dir, self.name)
        router_cfg = msgspec.structs.replace(self.cfg.router, engines=[], journal_dir=str(calls))
        self.router = Router(router_cfg, pool=EnginePool.from_config(router_cfg))
        starts = FaultyStarts(self.cfg.chaos)
        for key, spec in welcome.runtimes.items():
            fault = starts.fails if spec.chaos_starts and starts.active else None
            verifier = Verifier(self.cfg.sandbox, retries=spec.verifier_retries, start_fault=fault)
            runtime = Runtime(
                self.router, self.cfg.sandbox, max_concurrency=spec.max_concurrency, verifier=verifier
            )
            runtime.journal = self._journals[key] = HeldJournal(shard_dir(spec.journal_dir, self.name))
            self.runtimes[key] = runtime
        for op in welcome.engines:
            self._apply_now(op)
        log.info(
            "shard %s serves (runtimes %s, %d engines)",
            self.name,
            sorted(self.runtimes),
            len(welcome.engines),
        )

    async def _receive(self) -> None:
        while True:
            payload = await self._sock.recv()
            try:
                message = self._decoder.decode(payload)
            except msgspec.DecodeError as exc:
                log.warning("not a hub message (%s): dropped", exc)
                continue
            match message:
                case ShardRun():
                    job = self._tasks.create_task(self._run(message))
                    self._jobs.add(job)
                    job.add_done_callback(self._jobs.discard)
                case EngineOp(action="drain"):
                    self._tasks.create_task(self._drain(message))
                case EngineOp():
                    await self._ack(message.op, self._apply_now(message))
                case ShardJournal(job=job):
                    if (sent := self._sent.pop(job, None)) is not None:
                        self._journals[sent[0]].release(sent[1])
                case ShardStop(lost=lost):
                    if lost and not self._lost:
                        log.warning(
                            "shard %s: the hub lost it and ran its executions elsewhere: stopping", self.name
                        )
                    self._lost = self._lost or lost
                    self._stopped.set()
                case ShardWelcome():
                    pass  # a repeated welcome (the hub answered a repeated hello)

    def _apply_now(self, op: EngineOp) -> str:
        """Apply a synchronous engine op to the pool; the error, if any."""
        assert self.router is not None
        pool = self.router.pool
        try:
            match op.action:
                case "add":
                    engine = pool.engines.get(op.engine)
                    if engine is not None and engine.url == op.url.rstrip("/"):
                        pool.resume(op.engine)
                    else:
                        pool.forget(op.engine)
                        pool.add(op.url, op.engine, managed=op.managed)
                case "hold":
                    pool.hold(op.engine, op.destination)
                case "resume":
                    pool.resume(op.engine)
                case "gone":
                    pool.mark_gone(op.engine, op.reason)
        except Exception as exc:  # an engine it never heard of: the controller's state is the truth next time
            log.warning("engine op %s on %s: %s", op.action, op.engine, exc)
            return str(exc)
        return ""

    async def _drain(self, op: EngineOp) -> None:
        assert self.router is not None
        error = ""
        try:
            await self.router.pool.drain(op.engine, op.destination)
        except Exception as exc:
            error = str(exc)
        await self._ack(op.op, error)

    async def _ack(self, op: int, error: str) -> None:
        if op:
            assert self.router is not None
            moved = self.router.pool.statistics().moved_calls
            await self._sock.send(
                encoder.encode(ShardAck(shard=self.name, op=op, error=error, moved_calls=moved))
            )

    async def _run(self, message: ShardRun) -> None:
        answer = ShardResult(shard=self.name, job=message.job)
        try:
            result = await self.runtimes[message.runtime].run_one(message.execution())
            answer = ShardResult(shard=self.name, job=message.job, result=result)
        except TaskError as exc:
            answer = ShardResult(shard=self.name, job=message.job, error=str(exc), refused=True)
        except Exception as exc:  # the runtime's own bug: the driver sees it as a failed execution
            log.exception("execution %s raised", message.execution_id)
            answer = ShardResult(shard=self.name, job=message.job, error=f"{type(exc).__name__}: {exc}")
        if answer.result is not None:  # held in its journal until the hub takes it
            self._sent[message.job] = (message.runtime, answer.result.execution_id)
        await self._sock.send(encoder.encode(answer))

    async def _report(self, every_s: float) -> None:
        assert self.router is not None
        while True:
            totals = [r.statistics() for r in self.runtimes.values()]
            pool = self.router.pool.statistics()
            report = ShardReport(
                shard=self.name, dispatched=sum(t.dispatched for t in totals),
                started=sum(t.started for t in totals), finished=sum(t.finished for t in totals),
                running=sum(t.running for t in totals), internal_errors=sum(t.internal_errors for t in totals),
                moved_calls=pool.moved_calls, outstanding_tokens=pool.outstanding_tokens,
            )  # fmt: skip
            with contextlib.suppress(zmq.ZMQError):
                await self._sock.send(encoder.encode(report))
            await asyncio.sleep(every_s)


def run_shard(cfg: GyreConfig, name: str, hub: str, node: str = "") -> None:
    """``gyre shard``'s entry: serve the hub at ``hub`` until it says stop."""
    from gyre.driver.eventloop import run

    run(Shard(cfg, name, hub, node).serve())
