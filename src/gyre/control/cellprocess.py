"""A cell: one long-lived process that owns an inference engine and a trainer, and serves or trains on command.

The controller (a ZeroMQ ROUTER in the driver) owns the cell's state machine; the cell carries out its part of each
switch and reports the seconds each phase took (``SwitchDone``):

- serve -> train (``StartTraining``, sent once the router has drained the cell): the core stops pushing weights to
  this engine (``stop_pushes``), the engine frees its memory (``release``), the cell's trainer joins the step under
  way (``join``: the core's own worker starts claiming micro-steps; a satellite says Hello and takes the step's
  weights over its pair group, which is created once and kept).
- train -> serve (``StartServing``): the trainer leaves after the micro-step it holds (``leave``), the engine takes
  its memory back (``resume``), the core pushes the current weights (``weights``), and the cell reports the version
  its engine now serves; only then does the controller let the router send it calls.

Nothing is restarted and no communication group is rebuilt by a switch. The core cell hosts the core trainer
(authoritative weights, optimizer state, the step's micro-step queue) in a thread for the cell's whole life: it
sums gradients and applies updates whatever the cell's role; only its own computing follows the role. Standalone
cells only serve. The engine is a child process that dies with the cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
import zmq.asyncio

from gyre.config import GyreConfig
from gyre.control.chaos import FaultyLink
from gyre.control.forkserver import Process, spawn
from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, launch_embedded, launch_sglang
from gyre.errors import ConfigError, GyreError
from gyre.protocol import (
    CellBeat,
    CellHello,
    CellKind,
    CellRefused,
    CellRole,
    CellShutdown,
    CellWelcome,
    ControllerMessage,
    ControlPing,
    StartServing,
    StartTraining,
    SwitchDone,
)

if TYPE_CHECKING:  # torch is imported only by cells that train
    from gyre.train.coretrainer import CoreTrainer
    from gyre.train.satellite import Satellite, SatelliteSummary

log = logging.getLogger(__name__)
Phases = dict[str, float]  # phase -> seconds, in the order they ran
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ControllerMessage)
JOINED = 0  # the switch number of a cell's first report: it serves, with the core's weights


class CellSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who one cell process is (the driver or ``gyre cell``'s flags set it; the rest comes from the config)."""

    name: str
    kind: CellKind
    order: int  # place in the training order; 0 is the core
    controller: str  # the controller's ROUTER, tcp://HOST:PORT
    model_path: str
    log_dir: str = ""  # where the engine's log goes; empty: nowhere


class Cell:
    """One cell process's engine, trainer and control-plane connection; ``run`` until ``CellShutdown``."""

    def __init__(self, cfg: GyreConfig, spec: CellSpec) -> None:
        self.cfg, self.spec = cfg, spec
        self.role: CellRole = "resuming"  # until the core's weights are in its engine
        self.version = -1
        self.engine: ServerProcess | None = None
        self.core_address = ""
        self.core: CoreTrainer | None = None  # on the core cell
        self.satellite: Satellite | None = None  # on satellite cells
        self._satellite_run: asyncio.Task[SatelliteSummary | None] | None = None
        self._tags = ["kv_cache", "weights"] if cfg.cells.release_weights else ["kv_cache"]
        self._joining = False
        self._link = FaultyLink(cfg.chaos, f"cell {spec.name}")
        self._seq = itertools.count(1)  # this process's Hellos and beats, in order
        self._switches: dict[int, SwitchDone | None] = {}  # switch -> its report (None while it runs)
        self._hello_at = 0.0

    # ---- start-up (blocking, in the main thread: the engine dies with it) -----------------------------------------
    def start(self) -> None:
        """Launch the engine and, on the core cell, the core trainer."""
        cells, spec = self.cfg.cells, self.spec
        check_local(spec, cells.host, cells.engine_backend)
        log_path = Path(spec.log_dir) / f"{spec.name}-engine.log" if spec.log_dir else None
        if cells.engine_backend == "sglang":
            self.engine = launch_sglang(
                spec.model_path, log_path=log_path, die_with_parent=True, host=cells.host
            )
        else:
            self.engine = launch_embedded(spec.model_path, overrides=list(cells.engine_overrides),
                                          log_path=log_path, timeout_s=cells.startup_timeout_s,
                                          die_with_parent=True, host=cells.host)  # fmt: skip
        if spec.kind == "core":
            from gyre.train.coretrainer import CoreTrainer

            trainer = msgspec.structs.replace(
                self.cfg.trainer,
                model_path=self.cfg.trainer.model_path or spec.model_path,
                core_computes=False,  # it computes while the cell trains
                # cells announce it to the controller: any free port, at the address the others reach this cell at
                bind=f"tcp://{cells.host}:0",
                num_threads=cells.num_threads or self.cfg.trainer.num_threads,
            )
            core = CoreTrainer(trainer)
            threading.Thread(target=core.run, name="core-trainer", daemon=True).start()
            self.core, self.core_address = core, core.address
        elif spec.kind == "satellite":
            from gyre.train.satellite import Satellite

            trainer_cfg = self.cfg.trainer
            self.satellite = Satellite("", name=spec.name, num_threads=cells.num_threads,
                                       backend=trainer_cfg.backend, tensor_parallel=trainer_cfg.tensor_parallel,
                                       pipeline_parallel=trainer_cfg.pipeline_parallel)  # fmt: skip

    # ---- the control loop ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Talk to the controller until it says ``CellShutdown``; carry out switches without blocking heartbeats."""
        assert self.engine is not None
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(self.spec.controller)
        self._sock = sock
        self._engine = EngineClient(self.engine.url, timeout_s=self.cfg.controller.switch_timeout_s)
        timeout_s = self.cfg.controller.cell_timeout_s
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                self._send(self._hello())
                beats = tasks.create_task(self._beat(self.cfg.controller.heartbeat_s))
                while True:
                    if not await sock.poll(
                        int(timeout_s * 1000)
                    ):  # the controller is silent: say Hello again
                        log.warning("%s: the controller said nothing for %.1f s", self.spec.name, timeout_s)
                        self._send(self._hello())
                        continue
                    if (
                        self.version < 0
                        and not self._joining
                        and time.monotonic() - self._hello_at > timeout_s
                    ):
                        self._send(self._hello())  # not welcomed yet: the Hello or the Welcome was lost
                    message = _decoder.decode(await sock.recv())
                    match message:
                        case ControlPing():
                            pass
                        case CellWelcome(core_address=core):
                            if self.role == "resuming" and self.version < 0 and not self._joining:
                                self.core_address = self.core_address or core
                                self._joining = (
                                    True  # one join at a time; a failed one is tried at the next Welcome
                                )
                                tasks.create_task(self._switch(JOINED, self._join_serving))
                        case StartTraining(switch=n) if self._new_switch(n):
                            tasks.create_task(self._switch(n, self._to_training))
                        case StartServing(switch=n) if self._new_switch(n):
                            tasks.create_task(self._switch(n, self._to_serving))
                        case CellRefused(reason=reason):
                            raise GyreError(f"the controller refused cell {self.spec.name}: {reason}")
                        case CellShutdown():
                            break
                beats.cancel()
                if self._satellite_run is not None and self.satellite is not None:
                    self.satellite.request_leave()
        finally:
            if self._link.active:
                log.info("%s: chaos on its control messages: %s", self.spec.name, self._link.counts())
            await self._engine.aclose()
            sock.close(0)
            ctx.term()

    def _new_switch(self, number: int) -> bool:
        """Whether switch ``number`` is new: a command repeated (or overtaken by a later one) is not carried out
        twice; a finished switch's report is repeated, the controller may not have got it."""
        if number in self._switches:
            report = self._switches[number]
            if report is not None:
                self._send(report)
            return False
        if self._switches and number < max(self._switches):
            return False
        self._switches[number] = None
        for old in [n for n in self._switches if n < number - 64]:
            del self._switches[old]
        return True

    def _hello(self) -> CellHello:
        assert self.engine is not None
        self._hello_at = time.monotonic()
        return CellHello(cell=self.spec.name, kind=self.spec.kind, order=self.spec.order,
                         engine_url=self.engine.url, capacity=self.cfg.cells.capacity_executions,
                         core_address=self.core_address if self.spec.kind == "core" else "",
                         role=self.role, version=self.version, hostname=socket.gethostname(),
                         pid=os.getpid(), seq=next(self._seq))  # fmt: skip

    def _send(self, message: Any) -> None:
        self._link.send(functools.partial(self._deliver, _encoder.encode(message)))

    def _deliver(self, data: bytes) -> None:
        if not self._sock.closed:
            self._sock.send(data)  # queued by zmq.asyncio when it cannot go at once

    async def _beat(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._send(
                CellBeat(cell=self.spec.name, seq=next(self._seq), role=self.role, version=self.version)
            )

    async def _switch(self, number: int, do: Callable[[Phases], Awaitable[None]]) -> None:
        """Run one switch's phases and report them (an error is reported, not raised: the controller decides)."""
        phases: Phases = {}
        error = ""
        try:
            await do(phases)
        except (GyreError, OSError, RuntimeError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: switch %d failed", self.spec.name, number)
        report = SwitchDone(cell=self.spec.name, switch=number, role=self.role, phases=phases,
                            version=self.version, error=error)  # fmt: skip
        if number != JOINED:
            self._switches[number] = report
        self._send(report)

    async def _timed(self, phases: Phases, name: str, work: Awaitable[Any]) -> None:
        started = time.perf_counter()
        await work
        phases[name] = time.perf_counter() - started

    async def _core_request(self, active: bool) -> None:
        from gyre.train.trainerclient import TrainerClient

        assert self.engine is not None
        url = self.engine.url

        def ask() -> None:
            with TrainerClient(self.core_address, timeout_s=self.cfg.controller.switch_timeout_s) as client:
                client.set_engine(url, active)

        await asyncio.to_thread(ask)

    async def _join_serving(self, phases: Phases) -> None:
        try:
            await self._timed(phases, "weights", self._core_request(True))
            self.version = await self._engine.get_weight_version()
            self.role = "serving"
        except Exception:
            self._tasks.create_task(self._hello_later())  # the controller's Welcome brings the next try
            raise
        finally:
            self._joining = False

    async def _hello_later(self) -> None:
        await asyncio.sleep(self.cfg.controller.cell_timeout_s)
        self._send(self._hello())

    async def _to_training(self, phases: Phases) -> None:
        if self.spec.kind == "standalone":
            raise GyreError(f"{self.spec.name} is a standalone serving cell; it never trains")
        self.role = "draining"
        await self._timed(phases, "stop_pushes", self._core_request(False))
        await self._timed(phases, "release", self._release())
        await self._timed(phases, "join", self._join_step())
        self.role = "training"

    async def _release(self) -> None:
        """Stop the engine, ending what still runs on it, and free its memory. The router has drained the cell by
        now, but an abort of a call it moved can still be on its way, and a request may have reached the engine
        by its URL rather than through the router: either would make the release refuse ("requests are
        running") and fail the switch. Its caller sees the request end as aborted; the router continues its own
        calls elsewhere. `_to_serving` lets the engine step again."""
        await self._engine.pause_generation("abort")
        try:
            await self._engine.release_memory_occupation(self._tags)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._engine.continue_generation()  # still serving: it must step again
            raise

    async def _join_step(self) -> None:
        if self.core is not None:
            self.core.set_computing(True)
            return
        satellite = self.satellite
        assert satellite is not None
        satellite.core = self.core_address
        self._satellite_run = self._tasks.create_task(self._train_as_satellite(satellite))
        joined = satellite.joined
        while not joined.is_set():
            if self._satellite_run.done():
                raise GyreError(f"{self.spec.name}'s trainer ended before it joined the step (see its log)")
            await asyncio.to_thread(joined.wait, 0.2)

    async def _train_as_satellite(self, satellite: Satellite) -> SatelliteSummary | None:
        """The satellite's loop (a thread) until it leaves; None if the core dropped or refused it."""
        try:
            return await asyncio.to_thread(satellite.run)
        except GyreError as exc:
            log.warning("%s: its satellite left the step: %s", self.spec.name, exc)
            return None

    async def _to_serving(self, phases: Phases) -> None:
        self.role = "resuming"
        await self._timed(phases, "leave", self._leave_step())
        await self._timed(phases, "resume", self._resume())
        await self._timed(phases, "weights", self._core_request(True))
        self.version = await self._engine.get_weight_version()
        self.role = "serving"

    async def _resume(self) -> None:
        await self._engine.resume_memory_occupation(self._tags)
        await self._engine.continue_generation()  # paused by `_release`

    async def _leave_step(self) -> None:
        if self.core is not None:
            await asyncio.to_thread(self.core.set_computing, False)
            return
        run, self._satellite_run = self._satellite_run, None
        if run is None or self.satellite is None:
            return
        self.satellite.request_leave()
        await run

    def close(self) -> None:
        """Stop the engine and a satellite's learner (the core trainer thread ends with the process)."""
        if self.satellite is not None:
            self.satellite.close()
        if self.engine is not None:
            self.engine.stop()


UNSPECIFIED = ("0.0.0.0", "::", "*", "")


def check_local(spec: CellSpec, host: str, backend: str = "embedded") -> None:
    """What a cell needs on its own machine: the model directory at the path it was given (each machine holds its
    own copy; nothing is read from the driver's disk), and an address the others can reach it at."""
    if host in UNSPECIFIED:
        raise ConfigError(f"cells.host {host!r} is where the controller, router and other cells reach cell "
                          f"{spec.name}: give this machine's address (gyre cell --host 10.0.0.5), not a wildcard")  # fmt: skip
    model = Path(spec.model_path)
    if backend == "embedded" and not (model / "config.json").is_file():  # SGLang may also take a hub name
        raise ConfigError(f"cell {spec.name}: no model directory at {model} on {socket.gethostname()}; every "
                          f"machine needs its own copy of the model directory (config, tokenizer, weights) at "
                          f"the path its cells are given (--model)")  # fmt: skip


def cell_command(spec: CellSpec, config_path: str | Path) -> list[str]:
    """``gyre cell``'s command line for ``spec`` with the run's resolved config at ``config_path``."""
    return [sys.executable, "-m", "gyre", "-v", "cell", "--controller", spec.controller, "--name", spec.name,
            "--kind", spec.kind, "--order", str(spec.order), "--model", spec.model_path,
            "--config", str(config_path), *(["--log-dir", spec.log_dir] if spec.log_dir else [])]  # fmt: skip


def launch_cell(
    spec: CellSpec, config_path: str | Path, log: Path | None = None, die_with_parent: bool = True
) -> Process:
    """Start ``gyre cell`` for ``spec`` with the run's resolved config at ``config_path``; it connects by itself.
    ``die_with_parent`` (Linux): a driver killed outright takes its local cells (and their engines) with it, so
    ``gyre train --resume`` starts from a clean machine; call it from a thread that lives as long as the driver."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        return spawn(cell_command(spec, config_path), stdout=out, stderr=subprocess.STDOUT,
                     die_with_parent=die_with_parent)  # fmt: skip
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def cell_specs(cfg: GyreConfig, controller: str, model_path: str, log_dir: str = "") -> list[CellSpec]:
    """The cells ``[cells]`` asks for: cell-0 the core, cell-1.. satellites, then standalone servers."""
    specs = [CellSpec(name=f"cell-{i}", kind="core" if i == 0 else "satellite", order=i, controller=controller,
                      model_path=model_path, log_dir=log_dir) for i in range(cfg.cells.count)]  # fmt: skip
    n = cfg.cells.count
    specs += [CellSpec(name=f"serve-{i}", kind="standalone", order=n + i, controller=controller,
                       model_path=model_path, log_dir=log_dir) for i in range(cfg.cells.standalone)]  # fmt: skip
    return specs


def run_cell(cfg: GyreConfig, spec: CellSpec) -> None:
    """A cell process's entry: start the engine (and the core trainer), then serve the controller's commands."""
    cell = Cell(cfg, spec)
    try:
        cell.start()
        asyncio.run(cell.run())
    finally:
        cell.close()
