"""The driver's side of runtime shards: `ShardHub` sends each execution to the shard that owns its session and
`ShardedPool` carries the controller's word on engines to every shard's router.

A shard (`gyre.runtime.shard`) is a process with a runtime and a router of its own, on this machine or, placed by
Ray (`gyre.control.placement`), on another. Shards share no state: an execution (its router session) belongs to one
shard, chosen by a rendezvous hash of its id among the live shards (a lost shard moves only its own executions), and
journals there, under ``journal/shards/NAME/`` (readers merge every shard's journal:
`gyre.driver.rundir.execution_journals`). Each shard sends its counters in one report every ``shards.report_s``; the
controller sees cells and shard totals, never sessions.

A shard silent for ``shards.timeout_s`` (its process or machine died, or froze) is lost for the rest of the run: each
execution running there ends ``cancelled`` with a ``dropped`` verdict naming the loss, journaled by the driver (the
shard could not), and runs again from the start on a live shard under a new id (``ID~rerun1``) up to
``shards.reruns`` times, in the same step: nothing that finished is lost, nothing that was cut off is scored.

Every execution id ends exactly once across the driver's journal and the shards': the hub is the one that decides.
A shard journals a result only when the hub answers it `ShardJournal`, which the hub does for a result that arrives
while the shard is live, taking it at that moment (it is then no longer the shard's to cut off). Once lost, a shard is
told `ShardStop(lost=True)` at once and again whenever it is heard (a frozen process or machine that comes back):
nothing it says is taken, scored or journaled here, and it journals none of what it held or ran (`Shard`). It is
not welcomed back; if it has not ended ``STOP_S`` after it was lost, its process (or Ray actor) is killed.
`statistics` leaves a lost shard's last report out and names it under ``lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec
import zmq
import zmq.asyncio

from gyre.config import GyreConfig, dump_config
from gyre.control.placement import Launcher, LocalLauncher, Process
from gyre.control.silence import SYSTEM, Clock, StallClock, credit, silent
from gyre.driver.rundir import execution_journals
from gyre.errors import CoreLost, GyreError, TaskError
from gyre.journal import Journal, read_journal
from gyre.router.pool import EngineState, PoolStatistics
from gyre.runtime.dispatch import ExecutionResult, ExecutionSpec, RuntimeStatistics
from gyre.runtime.shard import (
    EngineAction,
    EngineOp,
    RuntimeSpec,
    ShardAck,
    ShardHello,
    ShardJournal,
    ShardMessage,
    ShardReport,
    ShardResult,
    ShardRun,
    ShardStop,
    ShardWelcome,
    encoder,
)
from gyre.tasks.verify import Verdict

log = logging.getLogger(__name__)
STOP_S = 30.0  # how long shards may take to stop once told; then they are killed


class ShardError(GyreError):
    """A shard's runtime raised running an execution."""


class ShardLost(ShardError):
    """The shard running an execution went silent."""


class NoShardLeft(CoreLost):
    """Every shard is lost: no execution can run, so the run stops (``gyre train --resume`` continues it)."""


class ShardEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``journal/shards.jsonl``: a shard joined or was lost."""

    at_s: float
    shard: str
    event: str  # "joined" | "lost"
    pid: int = 0
    hostname: str = ""
    node: str = ""  # the Ray node, when Ray placed it
    reason: str = ""
    running: int = 0  # executions it held when lost


class ShardStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Every shard's last report summed (what the controller sees of the shards), and how many are live."""

    shards: int
    live: int
    totals: RuntimeStatistics
    lost: list[str]
    reruns: int  # executions run again after their shard was lost


@dataclass(eq=False)
class _Shard:
    name: str
    hello: ShardHello | None = None
    live: bool = False  # welcomed and reporting: it runs executions
    lost: bool = False  # for the rest of the run: never live again, every word it says answered with a stop
    lost_at: float = 0.0  # on the hub's clock; its process is killed if it has not ended STOP_S later
    last_seen: float = field(default_factory=time.monotonic)
    report: ShardReport | None = None
    jobs: dict[int, asyncio.Future[ShardResult]] = field(default_factory=dict)
    acks: dict[int, asyncio.Future[ShardAck]] = field(default_factory=dict)
    moved_calls: int = 0


def owner(execution_id: str, shards: list[str]) -> str:
    """The shard that owns ``execution_id``'s session: the highest rendezvous hash among ``shards`` (losing a shard
    moves only its own executions; adding one moves a fair share)."""

    def weight(shard: str) -> int:
        return int.from_bytes(
            hashlib.blake2b(f"{shard}\0{execution_id}".encode(), digest_size=8).digest(), "big"
        )

    return max(shards, key=weight)


def read_executions(base: str | Path) -> Iterator[ExecutionResult]:
    """Every execution journaled under ``base`` (`execution_journals`), journal by journal."""
    for path in execution_journals(base):
        yield from read_journal(path, ExecutionResult)


class Runner(Protocol):
    """What runs executions for a driver: a `Runtime` in its own process, or a `ShardedRuntime`."""

    async def run_one(self, spec: ExecutionSpec) -> ExecutionResult: ...

    async def aclose(self) -> None: ...


class ShardedRuntime:
    """One of the runtimes every shard hosts (``key``), as a `Runner`."""

    def __init__(self, hub: ShardHub, key: str) -> None:
        self.hub, self.key = hub, key

    async def run_one(self, spec: ExecutionSpec) -> ExecutionResult:
        return await self.hub.run_one(spec, self.key)

    def statistics(self) -> RuntimeStatistics:
        """Every shard's counters as last reported (all of a shard's runtimes together)."""
        return self.hub.statistics().totals

    async def aclose(self) -> None:
        pass  # each shard closes its journals when the hub stops it


class ShardHub:
    """``async with ShardHub(cfg, run_dir, runtimes)``: binds, starts ``shards.count`` shard processes (through
    ``launcher``), and returns once every one has joined; leaving tells them to stop."""

    def __init__(self, cfg: GyreConfig, run_dir: str | Path, runtimes: dict[str, RuntimeSpec],
                 launcher: Launcher | None = None, calls_dir: str | Path | None = None,
                 clock: Clock = SYSTEM) -> None:  # fmt: skip
        self.cfg, self.run_dir, self.runtimes, self.clock = cfg, Path(run_dir), runtimes, clock
        self.launcher = launcher or LocalLauncher()
        self.calls_dir = str(calls_dir or self.run_dir / "journal")
        self.shards = {f"shard-{i}": _Shard(f"shard-{i}") for i in range(cfg.shards.count)}
        self.procs: dict[str, Process] = {}
        self.pool = ShardedPool(self)
        self.address = ""
        self._jobs = iter(range(1, 2**62))
        self._ops = iter(range(1, 2**62))
        self._reruns = 0
        self._journals = {k: Journal(spec.journal_dir, "executions.jsonl") for k, spec in runtimes.items()}
        self._events = Journal(self.run_dir / "journal", "shards.jsonl")
        self._decoder = msgspec.msgpack.Decoder(ShardMessage)
        self._changed = asyncio.Event()
        self._stopping = False  # told to stop: a shard that exits now is not lost

    # ---- lifetime -----------------------------------------------------------------------------------------------
    async def __aenter__(self) -> ShardHub:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        bind = self.cfg.shards.bind
        self._sock.bind(bind[:-2] + ":*" if bind.endswith(":0") else bind)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        self._loops = [self._tasks.create_task(self._receive()), self._tasks.create_task(self._watch())]
        try:
            config = self.run_dir / "shards.toml"
            config.write_text(dump_config(self.cfg))
            (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
            for name in self.shards:
                self.procs[name] = self.launcher.start_shard(name, self.address, config,
                                                             self.run_dir / "logs" / f"{name}.log")  # fmt: skip
            await self._wait_joined()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _wait_joined(self) -> None:
        timeout_s = self.cfg.shards.startup_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                while not all(s.live for s in self.shards.values()):
                    for name, proc in self.procs.items():
                        if (proc.poll() is not None or self.shards[name].lost) and not self.shards[name].live:
                            raise ShardError(f"shard {name} exited with code {proc.returncode} before joining; "
                                             f"see {self.run_dir / 'logs' / f'{name}.log'}")  # fmt: skip
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            await self._wait_changed()
        except TimeoutError:
            waiting = [s.name for s in self.shards.values() if not s.live]
            raise ShardError(f"shards {', '.join(waiting)} did not join within {timeout_s:g} s (shards."
                             f"startup_timeout_s); see their logs in {self.run_dir / 'logs'}") from None  # fmt: skip

    async def __aexit__(self, *exc: object) -> None:
        deadline, self._stopping = time.monotonic() + STOP_S, True
        stop = encoder.encode(ShardStop())
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            for shard in self.shards.values():
                if shard.live:
                    with contextlib.suppress(zmq.ZMQError):
                        await self._sock.send_multipart([shard.name.encode(), stop])
            await asyncio.sleep(0.5)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        for task in self._loops:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._tasks.__aexit__(None, None, None)
        self._sock.close(0)
        self._ctx.term()
        for journal in (*self._journals.values(), self._events):
            journal.close()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- executions ---------------------------------------------------------------------------------------------
    def live(self) -> list[str]:
        """The shards that run executions now."""
        return [s.name for s in self.shards.values() if s.live]

    async def run_one(self, spec: ExecutionSpec, runtime: str = "run") -> ExecutionResult:
        """Run ``spec`` on the shard that owns it (`owner`) with that shard's runtime ``runtime``; if the shard is
        lost meanwhile, journal the execution dropped and run it again on a live one (see the module)."""
        if not spec.execution_id:
            spec = msgspec.structs.replace(
                spec, execution_id=f"{spec.task.id}/{spec.group_index}/{uuid.uuid4().hex[:8]}"
            )
        attempt = spec
        for rerun in range(1, self.cfg.shards.reruns + 2):
            live = self.live()
            if not live:
                raise NoShardLeft(f"no shard is left to run {attempt.execution_id}: "
                                 f"{', '.join(self.shards)} were lost (see {self._events.path})")  # fmt: skip
            shard = self.shards[owner(attempt.execution_id, live)]
            dispatched = time.time()
            try:
                return await self._run_on(shard, attempt, runtime)
            except ShardLost as lost:
                again = f"{spec.execution_id}~rerun{rerun}"
                last = rerun > self.cfg.shards.reruns
                dropped = _lost(attempt, str(lost), dispatched, "" if last else again)
                self._journals[runtime].append(dropped)  # the shard could not journal it
                if last:
                    return dropped
                self._reruns += 1
                log.warning("%s: running %s again as %s", lost, attempt.execution_id, again)
                attempt = msgspec.structs.replace(spec, execution_id=again)
        raise AssertionError("unreachable")

    async def _run_on(self, shard: _Shard, spec: ExecutionSpec, runtime: str) -> ExecutionResult:
        job = next(self._jobs)
        future: asyncio.Future[ShardResult] = asyncio.get_running_loop().create_future()
        shard.jobs[job] = future
        try:
            await self._sock.send_multipart(
                [shard.name.encode(), encoder.encode(ShardRun.of(job, runtime, spec))]
            )
            answer = await future
        finally:
            shard.jobs.pop(job, None)
        if answer.refused:
            raise TaskError(answer.error)
        if answer.result is None:
            raise ShardError(f"shard {shard.name} could not run {spec.execution_id}: {answer.error}")
        return answer.result

    def statistics(self) -> ShardStatistics:
        """Every shard's last report, summed; a lost shard's left out (what it ran, the driver journaled or ran
        again)."""
        reports = [s.report for s in self.shards.values() if s.report is not None and not s.lost]

        def total(name: str) -> int:
            return sum(getattr(r, name) for r in reports)

        totals = RuntimeStatistics(dispatched=total("dispatched"), started=total("started"),
                                   finished=total("finished"), water_level=total("dispatched") - total("finished"),
                                   running=total("running"), by_status={}, in_flight=total("running"),
                                   internal_errors=total("internal_errors"))  # fmt: skip
        return ShardStatistics(shards=len(self.shards), live=len(self.live()), totals=totals,
                               lost=[s.name for s in self.shards.values() if s.lost],
                               reruns=self._reruns)  # fmt: skip

    # ---- engines ------------------------------------------------------------------------------------------------
    async def broadcast(self, action: EngineAction, engine: str, **fields: object) -> list[ShardAck]:
        """Send one engine op to every live shard and wait for their acknowledgements (a shard lost meanwhile is
        not waited for)."""
        waits: list[asyncio.Future[ShardAck]] = []
        for shard in self.shards.values():
            if not shard.live:
                continue
            op = next(self._ops)
            future: asyncio.Future[ShardAck] = asyncio.get_running_loop().create_future()
            shard.acks[op] = future
            waits.append(future)
            message = EngineOp(op=op, action=action, engine=engine, **fields)  # type: ignore[arg-type]
            await self._sock.send_multipart([shard.name.encode(), encoder.encode(message)])
        acks = [a for a in await asyncio.gather(*waits) if a.op]
        for ack in acks:
            if ack.error:
                log.warning("shard %s: %s of %s: %s", ack.shard, action, engine, ack.error)
        return acks

    def tell(self, action: EngineAction, engine: str, **fields: object) -> None:
        """`broadcast` without waiting (the controller's synchronous calls)."""
        self._tasks.create_task(self.broadcast(action, engine, **fields))

    # ---- the hub's loops ----------------------------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            try:
                message = self._decoder.decode(payload)
            except msgspec.DecodeError as exc:
                log.warning("not a shard message (%s): dropped", exc)
                continue
            shard = self.shards.get(message.shard)
            if shard is None or identity != shard.name.encode():
                log.warning("a message from an unknown shard %r: dropped", message.shard)
                continue
            # it stays lost (its executions ended here): heard again, it is told to stop and nothing is taken
            if shard.lost:
                with contextlib.suppress(zmq.ZMQError):
                    await self._sock.send_multipart([identity, encoder.encode(ShardStop(lost=True))])
                continue
            shard.last_seen = self.clock.now()
            match message:
                case ShardHello():
                    await self._welcome(shard, message)
                case ShardReport():
                    if not shard.live and shard.hello is not None:
                        await self._joined(shard, shard.hello)  # its runtimes and router are up
                    shard.report = message
                    shard.moved_calls = max(shard.moved_calls, message.moved_calls)
                    self.pool.statistics()  # the engines' load, for the controller's choice of destination
                case ShardResult(job=job):
                    # taken (no await since the shard was found live): no longer the loss's to cut off
                    if (future := shard.jobs.pop(job, None)) is not None and not future.done():
                        future.set_result(message)
                    if message.result is not None:  # the shard journals it now
                        await self._sock.send_multipart([identity, encoder.encode(ShardJournal(job=job))])
                case ShardAck(op=op):
                    shard.moved_calls = max(shard.moved_calls, message.moved_calls)
                    if (waiting := shard.acks.pop(op, None)) is not None and not waiting.done():
                        waiting.set_result(message)

    async def _welcome(self, shard: _Shard, hello: ShardHello) -> None:
        shard.hello = hello
        await self._sock.send_multipart([shard.name.encode(), encoder.encode(ShardWelcome(
            runtimes=self.runtimes, calls_dir=self.calls_dir, report_s=self.cfg.shards.report_s,
            engines=self.pool.replay()))])  # fmt: skip

    async def _joined(self, shard: _Shard, hello: ShardHello) -> None:
        for op in self.pool.replay():  # what changed while it started (an op goes to live shards only)
            await self._sock.send_multipart([shard.name.encode(), encoder.encode(op)])
        shard.live = True
        self._events.append(ShardEvent(at_s=time.time(), shard=shard.name, event="joined", pid=hello.pid,
                                       hostname=hello.hostname, node=hello.node))  # fmt: skip
        log.info("shard %s joined from %s pid %d", shard.name, hello.hostname, hello.pid)
        self._notify()

    async def _watch(self) -> None:
        """Every ``report_s``: a live shard silent for ``timeout_s``, or whose process ended, is lost."""
        cfg = self.cfg.shards
        clock = StallClock(cfg.report_s, self.clock.now)
        while True:
            await self.clock.sleep(cfg.report_s)
            stalled = clock.stalled()  # the driver stood still that long: nobody could be heard
            now = self.clock.now()
            if self._stopping:
                continue
            for shard in self.shards.values():
                proc = self.procs.get(shard.name)
                if shard.lost and proc is not None and now - shard.lost_at > STOP_S and proc.poll() is None:
                    log.warning("lost shard %s did not stop within %g s: killed", shard.name, STOP_S)
                    proc.kill()
                    shard.lost_at = float("inf")  # killed once
            live = [shard for shard in self.shards.values() if shard.live and not shard.lost]
            for shard in live:
                shard.last_seen = credit(shard.last_seen, stalled, now)
            quiet = silent({shard.name: shard.last_seen for shard in live}, now, cfg.timeout_s)
            for shard in live:
                proc = self.procs.get(shard.name)
                if proc is not None and proc.poll() is not None:
                    await self._lose(shard, f"its process exited with code {proc.returncode}")
                elif shard.name in quiet:
                    await self._lose(shard, f"silent for {quiet[shard.name]:.1f} s")

    async def _lose(self, shard: _Shard, reason: str) -> None:
        log.warning(
            "shard %s is lost (%s): %d executions run again elsewhere", shard.name, reason, len(shard.jobs)
        )
        shard.live, shard.lost, shard.lost_at = False, True, self.clock.now()
        self._events.append(ShardEvent(at_s=time.time(), shard=shard.name, event="lost", reason=reason,
                                       running=len(shard.jobs), node=shard.hello.node if shard.hello else ""))  # fmt: skip
        for future in shard.jobs.values():
            if not future.done():
                future.set_exception(ShardLost(f"shard {shard.name} was lost ({reason})"))
        for waiting in shard.acks.values():
            if not waiting.done():
                waiting.set_result(ShardAck(shard=shard.name, op=0, error="lost"))
        self._notify()
        with contextlib.suppress(zmq.ZMQError):  # queued for a frozen one: it reads it when it comes back
            await self._sock.send_multipart([shard.name.encode(), encoder.encode(ShardStop(lost=True))])


def _lost(spec: ExecutionSpec, reason: str, dispatched: float, again: str) -> ExecutionResult:
    """The journal line of an execution cut off by its shard's loss: cancelled, dropped (never scored)."""
    detail = f"{reason}: cut off, not scored" + (f"; it runs again as {again}" if again else "")
    return ExecutionResult(execution_id=spec.execution_id, task_id=spec.task.id, group_index=spec.group_index,
                           status="cancelled", agent=None, error=detail, records=[], prompt_tokens=0,
                           completion_tokens=0, dispatched_s=dispatched, started_s=dispatched,
                           finished_s=time.time(), verdict=Verdict(outcome="dropped", detail=detail))  # fmt: skip


@dataclass(eq=False)
class _EngineView:
    """An engine as the controller left it (what a shard that joins later is told)."""

    name: str
    url: str
    state: EngineState = EngineState.SERVING
    destination: str | None = None
    reason: str = ""
    managed: bool = True  # the controller decides its state (a cell's engine); else the routers probe it
    outstanding_tokens: int = 0  # over every shard, as last reported


class ShardedPool:
    """The controller's pool when shards run the executions: each change goes to every shard's router; a drain
    holds the engine on every shard before any shard aborts its calls there (`EnginePool.hold`)."""

    def __init__(self, hub: ShardHub) -> None:
        self.hub = hub
        self.engines: dict[str, _EngineView] = {}

    def add(self, url: str, name: str | None = None, managed: bool = False) -> _EngineView:
        name = name or f"engine-{len(self.engines)}"
        self.engines[name] = view = _EngineView(name, url.rstrip("/"), managed=managed)
        self.hub.tell("add", name, url=view.url, managed=managed)
        return view

    def resume(self, name: str) -> None:
        view = self.engines[name]
        view.state, view.destination, view.reason = EngineState.SERVING, None, ""
        self.hub.tell("resume", name)

    def forget(self, name: str) -> None:
        self.engines.pop(name, None)  # the next add replaces it on every shard

    def mark_gone(self, name: str, reason: str) -> None:
        view = self.engines[name]
        view.state, view.reason = EngineState.GONE, reason
        self.hub.tell("gone", name, reason=reason)

    async def drain(self, name: str, destination: str | None = None) -> None:
        view = self.engines[name]
        if view.state is EngineState.SERVING:
            view.state = EngineState.DRAINING
        view.destination = destination
        await self.hub.broadcast("hold", name, destination=destination)
        await self.hub.broadcast("drain", name, destination=destination)

    def replay(self) -> list[EngineOp]:
        """The ops that bring a new shard's pool to the controller's state (op 0: not acknowledged)."""
        ops = []
        for view in self.engines.values():
            ops.append(EngineOp(op=0, action="add", engine=view.name, url=view.url, managed=view.managed))
            if view.state is EngineState.DRAINING:
                ops.append(EngineOp(op=0, action="hold", engine=view.name, destination=view.destination))
            elif view.state is EngineState.GONE:
                ops.append(EngineOp(op=0, action="gone", engine=view.name, reason=view.reason))
        return ops

    def statistics(self) -> PoolStatistics:
        """The shards' pools in sum (moved calls as last reported or acknowledged)."""
        outstanding: dict[str, int] = {}
        for shard in self.hub.shards.values():
            if shard.lost:  # its calls are no one's now
                continue
            for engine, tokens in (shard.report.outstanding_tokens if shard.report else {}).items():
                outstanding[engine] = outstanding.get(engine, 0) + tokens
        for name, view in self.engines.items():
            view.outstanding_tokens = outstanding.get(name, 0)
        return PoolStatistics(engines={v.name: v.state.value for v in self.engines.values()},
                              outstanding_tokens=outstanding, inflight_calls=0,
                              moved_calls=sum(s.moved_calls for s in self.hub.shards.values()), kv_handovers=0,
                              engine_failures=0)  # fmt: skip
