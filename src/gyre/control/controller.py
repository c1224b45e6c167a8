"""The live controller: the cells' state machines, the harness-preserving switch protocol, the control plane.

It lives in the driver's event loop. Cells connect to its ZeroMQ ROUTER (``address``) and say ``CellHello``; it owns
one state machine per cell (``serving -> draining -> training -> resuming -> serving``, or ``gone``) and the router's
engine states follow it: a cell's engine joins the router's pool as a managed engine only once it serves the core's
weights, is drained before the cell trains, and takes calls again only after the cell reports the new version.

Switches (DESIGN section 4), each timed per phase and journaled to ``switches.jsonl``:
- serve -> train: the router sends the cell no new calls and moves the calls in flight there, from the tokens
  generated so far, to the capacity reserved for them (a standalone server first, else the serving cell that will
  serve longest: the last in training order) (``drain``); then the cell's own phases (see `gyre.control.cellprocess`).
- train -> serve: the cell's phases, then the router sends it calls again (``route``).

Heartbeats both ways: a cell silent for ``cell_timeout_s`` is gone (the router stops routing to it and continues its
calls elsewhere; the core gives its claimed micro-steps to others by its own member timeout; the policy plans
without it). A cell that says Hello again, restarted or reconnected, rejoins.

Messages may be lost, repeated or reordered on the way (a flaky network; `gyre.control.chaos` does it on purpose):
a switch's command is sent again every ``RESEND_BEATS`` heartbeats until the cell reports (the cell runs each switch
number once and repeats its report), a Hello or beat older than one already applied is ignored (each carries the
cell process's sequence number), and beats carry the cell's role, so a lost join report cannot leave a serving cell
unrouted.

The policy (`gyre.control.policy.decide`) is not called here: the loop that drives the run (`gyre.control.loop`)
builds an ``Observation`` from `cell_views` and its books and carries out the moves with `apply`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import msgspec
import zmq
import zmq.asyncio

from gyre.config import ChaosConfig, ControllerConfig
from gyre.control.chaos import FaultyLink
from gyre.control.policy import Action, CellView, ToServe, ToTrain
from gyre.control.silence import SYSTEM, Clock, StallClock, credit, silent
from gyre.errors import SwitchFailed
from gyre.journal import Journal
from gyre.protocol import (
    CellBeat,
    CellHello,
    CellKind,
    CellMessage,
    CellRefused,
    CellRole,
    CellShutdown,
    CellWelcome,
    ControlPing,
    StartServing,
    StartTraining,
    SwitchDone,
    SwitchRecord,
)
from gyre.router.pool import PoolStatistics

log = logging.getLogger(__name__)


class _EngineEntry(Protocol):
    url: str
    outstanding_tokens: int


class ControlledPool(Protocol):
    """The engines the controller routes to: a router's `EnginePool`, or every shard's (`ShardedPool`)."""

    @property
    def engines(self) -> Mapping[str, _EngineEntry]: ...

    def add(self, url: str, name: str | None = None, managed: bool = False) -> object: ...

    def resume(self, name: str) -> None: ...

    def mark_gone(self, name: str, reason: str) -> None: ...

    def forget(self, name: str) -> None: ...

    async def drain(self, name: str, destination: str | None = None) -> None: ...

    def statistics(self) -> PoolStatistics: ...


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CellMessage)
RESEND_BEATS = 4  # heartbeats between two sends of a switch's command the cell has not yet reported
SWEEP_BATCH = 64  # cells pinged between two returns to the event loop


def _stale(cell: _Cell | None, hello: CellHello) -> bool:
    return cell is not None and cell.role != "gone" and cell.pid == hello.pid and hello.seq <= cell.seq


@dataclass(eq=False)
class _Cell:
    name: str
    kind: CellKind
    order: int
    engine_url: str
    capacity: int
    identity: bytes
    role: CellRole = "resuming"
    version: int = -1
    last_seen: float = field(default_factory=time.monotonic)
    waiting: dict[int, asyncio.Future[SwitchDone]] = field(default_factory=dict)  # switch -> its report
    switches: int = 0
    pid: int = 0  # its process, as its Hello said
    seq: int = 0  # the last Hello or beat applied: older ones are stale
    gone_reason: str = ""  # why it was declared gone, last time


class CellStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One cell as the controller sees it."""

    name: str
    kind: CellKind
    order: int
    role: CellRole
    version: int
    capacity: int
    switches: int


class ControllerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The cells in planning order, and the switch history's size."""

    address: str
    cells: tuple[CellStatistics, ...]
    switches: int
    failed_switches: int
    gone: int  # times a cell was declared gone


class Controller:
    """Cells, their roles and switches; ``async with Controller(...)`` binds the ROUTER and runs its loops."""

    def __init__(
        self,
        cfg: ControllerConfig,
        pool: ControlledPool,
        journal_dir: str | Path | None = None,
        chaos: ChaosConfig | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.cfg, self.pool, self.clock = cfg, pool, clock
        self.link = FaultyLink(chaos or ChaosConfig(), "controller")
        self.cells: dict[str, _Cell] = {}
        self.core_address = ""
        self.address = ""
        self._journal = Journal(journal_dir, "switches.jsonl") if journal_dir else None
        self.records: list[SwitchRecord] = []
        self._numbers = itertools.count(1)
        self._changed = asyncio.Event()
        self._failed = 0
        self._gone = 0
        self._unwelcomed: list[str] = []  # cells waiting for the core's address

    # ---- lifetime -----------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Controller:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        # a reconnecting cell's new connection takes over its identity
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        bind = self.cfg.bind[:-2] + ":*" if self.cfg.bind.endswith(":0") else self.cfg.bind
        self._sock.bind(bind)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        self._loops = [self._tasks.create_task(self._receive()), self._tasks.create_task(self._beat())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._loops:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._tasks.__aexit__(None, None, None)
        self._sock.close(0)
        self._ctx.term()
        if self._journal is not None:
            self._journal.close()

    async def shutdown_cells(self) -> None:
        """Tell every cell to stop (its engine and trainer with it)."""
        for cell in self.cells.values():
            if cell.role != "gone":
                await self._send(cell, CellShutdown())

    # ---- what the policy sees -----------------------------------------------------------------------------------
    def ordered(self) -> list[_Cell]:
        """Cells in planning order: the core, satellites by order, then standalone servers."""
        return sorted(self.cells.values(), key=lambda c: (c.kind == "standalone", c.order, c.name))

    def cell_views(self) -> tuple[CellView, ...]:
        """The cells as the policy sees them, in order."""
        return tuple(CellView(name=c.name, role=c.role, capacity=c.capacity, standalone=c.kind == "standalone")
                     for c in self.ordered())  # fmt: skip

    def statistics(self) -> ControllerStatistics:
        """A snapshot of every cell's state."""
        return ControllerStatistics(
            address=self.address,
            cells=tuple(CellStatistics(name=c.name, kind=c.kind, order=c.order, role=c.role, version=c.version,
                                       capacity=c.capacity, switches=c.switches) for c in self.ordered()),
            switches=len(self.records), failed_switches=self._failed, gone=self._gone,
        )  # fmt: skip

    async def wait_serving(self, count: int, timeout_s: float) -> None:
        """Return once ``count`` cells serve (at start-up: their engines hold the core's weights)."""
        async with asyncio.timeout(timeout_s):
            while sum(c.role == "serving" for c in self.cells.values()) < count:
                await self._wait_changed()

    async def wait_role(self, name: str, roles: tuple[CellRole, ...], timeout_s: float) -> None:
        """Return once cell ``name`` is in one of ``roles``."""
        async with asyncio.timeout(timeout_s):
            while name not in self.cells or self.cells[name].role not in roles:
                await self._wait_changed()

    async def wait_core_gone(self) -> str:
        """Return, with the reason, once the core cell (the optimizer and the weights: no other cell can take its
        place mid-run) is declared gone."""
        while True:
            core = next((c for c in self.cells.values() if c.kind == "core"), None)
            if core is not None and core.role == "gone":
                return f"{core.name} {core.gone_reason}"
            await self._wait_changed()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- switches -----------------------------------------------------------------------------------------------
    async def to_train(self, name: str) -> SwitchRecord:
        """Serve -> train: drain the router's calls off the cell, then it releases memory and joins the step."""
        cell = self._get(name)
        if cell.kind == "standalone" or cell.role != "serving":
            raise SwitchFailed(f"{name} cannot start training: it is {cell.role} ({cell.kind})")
        number, started, clock = next(self._numbers), time.time(), time.perf_counter()
        cell.role = "draining"
        self._notify()
        destination = self._destination(cell)
        moved = self.pool.statistics().moved_calls
        await self.pool.drain(name, destination)
        phases = {"drain": time.perf_counter() - clock}
        moved = self.pool.statistics().moved_calls - moved
        report = await self._carry_out(cell, number, StartTraining(switch=number))
        return self._record(cell, number, "serve_to_train", started, clock, phases, report, moved)

    async def to_serve(self, name: str) -> SwitchRecord:
        """Train -> serve: the cell leaves the step, takes its memory and the new weights back; then it gets calls."""
        cell = self._get(name)
        if cell.role != "training":
            raise SwitchFailed(f"{name} cannot start serving: it is {cell.role}")
        number, started, clock = next(self._numbers), time.time(), time.perf_counter()
        cell.role = "resuming"
        self._notify()
        report = await self._carry_out(cell, number, StartServing(switch=number))
        phases: dict[str, float] = {}
        if not report.error:
            routed = time.perf_counter()
            self.pool.resume(name)
            phases["route"] = time.perf_counter() - routed
        return self._record(cell, number, "train_to_serve", started, clock, phases, report, 0)

    async def apply(self, actions: list[Action]) -> None:
        """Carry out the policy's role moves (in order, each to its end); dispatching is the caller's."""
        for action in actions:
            match action:
                case ToTrain(cell=name):
                    await self.to_train(name)
                case ToServe(cell=name):
                    await self.to_serve(name)

    def _destination(self, leaving: _Cell) -> str | None:
        """Where the leaving cell's calls continue: a standalone server, else the serving cell last in order."""
        serving = [c for c in self.ordered() if c.role == "serving" and c is not leaving]
        standalone = [c for c in serving if c.kind == "standalone"]
        if standalone:
            return min(standalone, key=lambda c: self.pool.engines[c.name].outstanding_tokens).name
        return serving[-1].name if serving else None

    async def _carry_out(self, cell: _Cell, number: int, command: StartTraining | StartServing) -> SwitchDone:
        if cell.role == "gone":  # declared gone while the router drained it: nobody would answer
            return SwitchDone(
                cell=cell.name, switch=number, role="gone", phases={}, error="the cell went away"
            )
        future: asyncio.Future[SwitchDone] = asyncio.get_running_loop().create_future()
        cell.waiting[number] = future
        try:
            async with asyncio.timeout(self.cfg.switch_timeout_s):
                while True:  # again until it reports: a command or a report may be lost on the way
                    await self._send(cell, command)
                    done, _ = await asyncio.wait([future], timeout=RESEND_BEATS * self.cfg.heartbeat_s)
                    if done:
                        report = future.result()
                        break
        except TimeoutError:
            report = SwitchDone(cell=cell.name, switch=number, role=cell.role, phases={},
                                error=f"no report within {self.cfg.switch_timeout_s:g} s")  # fmt: skip
        finally:
            cell.waiting.pop(number, None)
        return report

    def _record(self, cell: _Cell, number: int, direction: Literal["serve_to_train", "train_to_serve"],
                started: float, clock: float, phases: dict[str, float], report: SwitchDone,
                moved: int) -> SwitchRecord:  # fmt: skip
        ordered = (
            {**phases, **report.phases} if direction == "serve_to_train" else {**report.phases, **phases}
        )
        if cell.role != "gone":
            cell.role = report.role
            cell.version = report.version if report.version >= 0 else cell.version
        cell.switches += 1
        record = SwitchRecord(switch=number, cell=cell.name, direction=direction, started=started,
                              phases=ordered, total_s=time.perf_counter() - clock, version=cell.version,
                              moved_calls=moved, error=report.error)  # fmt: skip
        self.records.append(record)
        if self._journal is not None:
            self._journal.append(record)
        self._notify()
        if report.error:
            self._failed += 1
            raise SwitchFailed(f"{direction.replace('_', ' ')} of {cell.name} failed: {report.error}")
        log.info("%s: %s in %.3f s (%s)", cell.name, direction, record.total_s,
                 ", ".join(f"{k} {v:.3f}" for k, v in ordered.items()))  # fmt: skip
        return record

    def _get(self, name: str) -> _Cell:
        cell = self.cells.get(name)
        if cell is None:
            raise SwitchFailed(f"no cell named {name!r}; cells: {sorted(self.cells)}")
        return cell

    # ---- the control plane --------------------------------------------------------------------------------------
    async def _send(self, cell: _Cell, message: object) -> None:
        self.link.send(functools.partial(self._deliver, [cell.identity, _encoder.encode(message)]))

    def _deliver(self, parts: list[bytes]) -> None:
        if not self._sock.closed:
            self._sock.send_multipart(parts)  # queued by zmq.asyncio when it cannot go at once

    async def _receive(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            try:
                message = _decoder.decode(payload)
            except msgspec.DecodeError as exc:
                log.warning("not a cell message (%s): dropped", exc)
                continue
            cell = self.cells.get(message.cell)
            if cell is not None and cell.role != "gone":
                cell.last_seen = self.clock.now()
            match message:
                case CellBeat():
                    if cell is not None and cell.role != "gone" and message.seq > cell.seq:
                        cell.seq = message.seq
                        self._beat_state(cell, message)
                case CellHello():
                    if _stale(cell, message):
                        continue  # a duplicate, or overtaken by newer news of the same process
                    await self._hello(identity, message)
                case SwitchDone(switch=number):
                    if cell is None:
                        continue
                    if number == 0:  # joined: it serves the core's weights
                        self._joined(cell, message)
                    elif (waiting := cell.waiting.get(number)) is not None and not waiting.done():
                        waiting.set_result(message)

    async def _hello(self, identity: bytes, hello: CellHello) -> None:
        if hello.kind == "core":
            if self.core_address and self.core_address != hello.core_address:
                core = next((c for c in self.cells.values() if c.kind == "core" and c.role != "gone"), None)
                if core is not None and core.name != hello.cell:
                    await self._sock.send_multipart([identity, _encoder.encode(
                        CellRefused(reason=f"{core.name} is the core already"))])  # fmt: skip
                    return
            self.core_address = hello.core_address
        cell = self.cells.get(hello.cell)
        if cell is None or cell.role == "gone" or cell.engine_url != hello.engine_url:
            cell = self.cells[hello.cell] = _Cell(hello.cell, hello.kind, hello.order, hello.engine_url,
                                                  hello.capacity, identity)  # fmt: skip
            log.info("cell %s (%s, order %d) connected from %s pid %d", hello.cell, hello.kind, hello.order,
                     hello.hostname, hello.pid)  # fmt: skip
        cell.identity, cell.last_seen = identity, self.clock.now()
        cell.role, cell.version = hello.role, hello.version
        cell.pid, cell.seq = hello.pid, hello.seq
        if hello.role == "serving":  # a cell that kept serving while the controller restarted
            self._route(cell)
        self._notify()
        if self.core_address:
            for waiting in [cell.name, *self._unwelcomed]:
                if waiting in self.cells:
                    await self._send(self.cells[waiting], self._welcome(self.cells[waiting]))
            self._unwelcomed.clear()
        else:
            self._unwelcomed.append(cell.name)

    def _welcome(self, cell: _Cell) -> CellWelcome:
        return CellWelcome(cell=cell.name, core_address=self.core_address, heartbeat_s=self.cfg.heartbeat_s,
                           cell_timeout_s=self.cfg.cell_timeout_s)  # fmt: skip

    def _beat_state(self, cell: _Cell, beat: CellBeat) -> None:
        """A cell that serves the core's weights while the controller still waits for it to join lost its report:
        its beat says it serves (never while a switch of it is under way: the controller leads those)."""
        if beat.role == "serving" and cell.role == "resuming" and cell.version < 0 and not cell.waiting:
            log.info("cell %s: its join report was lost; its heartbeat says it serves", cell.name)
            self._joined(
                cell, SwitchDone(cell=cell.name, switch=0, role="serving", phases={}, version=beat.version)
            )

    def _joined(self, cell: _Cell, report: SwitchDone) -> None:
        if report.error:
            log.error("cell %s could not take the core's weights: %s", cell.name, report.error)
            return
        cell.role, cell.version = "serving", report.version
        self._route(cell)
        log.info("cell %s serves version %d", cell.name, cell.version)
        self._notify()

    def _route(self, cell: _Cell) -> None:
        engine = self.pool.engines.get(cell.name)
        if engine is None or engine.url != cell.engine_url.rstrip("/"):
            if engine is not None:
                self.pool.forget(cell.name)
            self.pool.add(cell.engine_url, cell.name, managed=True)
        else:
            self.pool.resume(cell.name)

    async def _beat(self) -> None:
        """Every ``heartbeat_s``: ping each live cell, declare the silent ones gone. The sweep gives the loop back
        every ``SWEEP_BATCH`` cells: at 1,000 cells one unbroken sweep held the driver's loop for tens of ms."""
        ping = _encoder.encode(ControlPing())
        clock = StallClock(self.cfg.heartbeat_s, self.clock.now)
        while True:
            await self.clock.sleep(self.cfg.heartbeat_s)
            stalled = clock.stalled()  # the driver stood still that long: nobody could be heard
            now = self.clock.now()
            live = [cell for cell in self.cells.values() if cell.role != "gone"]
            for cell in live:
                cell.last_seen = credit(cell.last_seen, stalled, now)
            quiet = silent({cell: cell.last_seen for cell in live}, now, self.cfg.cell_timeout_s)
            for i, cell in enumerate(live):
                if i and i % SWEEP_BATCH == 0:
                    await asyncio.sleep(0)
                if cell.role == "gone":  # declared gone while the sweep gave the loop back
                    continue
                if cell in quiet:
                    self._declare_gone(cell, f"silent for {quiet[cell]:.1f} s")
                else:
                    self.link.send(functools.partial(self._deliver, [cell.identity, ping]))

    def process_exited(self, name: str, code: int | None) -> None:
        """The cell's process was seen to exit (by what started it, `Cluster`): the cell is gone now, without waiting
        out ``cell_timeout_s`` of silence (nothing if it is gone already)."""
        cell = self.cells.get(name)
        if cell is not None and cell.role != "gone":
            self._declare_gone(cell, f"its process exited with code {code}")

    def _declare_gone(self, cell: _Cell, reason: str) -> None:
        log.warning("cell %s is gone: %s", cell.name, reason)
        cell.role, cell.gone_reason = "gone", reason
        self._gone += 1
        if cell.name in self.pool.engines:
            self.pool.mark_gone(cell.name, f"its cell is gone: {reason}")
        for waiting in cell.waiting.values():
            if not waiting.done():
                waiting.set_result(SwitchDone(cell=cell.name, switch=0, role="gone", phases={},
                                              error=f"the cell went away: {reason}"))  # fmt: skip
        self._notify()
