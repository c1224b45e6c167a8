"""A driver loop that stood still (a long garbage collection, thousands of executions starting at once) must not
make the controller declare live cells gone: their beats wait in the socket and are read before any judgement. Nor
must a whole machine that stood still (the cells frozen with the driver, so no beat waits), nor every cell going quiet
at once while the driver runs: neither is any one cell's silence. One cell going quiet while the others beat is.

The controller's time is a `ManualClock`: the tests step it through minutes of silence in milliseconds, and a step
is taken only once every beating cell was heard, so no loaded machine can make a healthy cell look silent."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest
import uvloop
import zmq

from gyre.config import ControllerConfig
from gyre.control.controller import Controller
from gyre.control.silence import ALL_QUIET, ManualClock
from gyre.protocol import CellBeat, CellHello
from gyre.router.pool import EnginePool

pytestmark = (
    pytest.mark.timing
)  # the cells' beats are real threads: they must be heard between the clock's steps
CELLS = [f"c{i}" for i in range(100)]
TIMEOUT_S = 30.0  # a cell silent this long (on the controller's clock) is gone, while others are heard
CONFIG = ControllerConfig(heartbeat_s=1.0, cell_timeout_s=TIMEOUT_S)


class Beating:
    """The heartbeat threads of 100 cell processes: a Hello each, then a beat each every 0.05 s (real time) from every
    cell not in ``mute``, none while ``frozen`` is set."""

    def __init__(self, address: str) -> None:
        self.address, self.stop, self.frozen = address, threading.Event(), threading.Event()
        self.mute: set[str] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Beating:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        ctx = zmq.Context()
        socks = [ctx.socket(zmq.DEALER) for _ in CELLS]
        encode = msgspec.msgpack.Encoder().encode
        for order, (name, sock) in enumerate(zip(CELLS, socks, strict=True), 1):
            sock.connect(self.address)
            sock.send(encode(CellHello(cell=name, kind="standalone", order=order, capacity=4, role="resuming",
                                       engine_url=f"http://127.0.0.1:{order}", seq=1)))  # fmt: skip
        seq = 1
        while not self.stop.wait(0.05):
            if self.frozen.is_set():
                continue
            seq += 1
            for name, sock in zip(CELLS, socks, strict=True):
                if name not in self.mute:
                    sock.send(encode(CellBeat(cell=name, seq=seq)))
        for sock in socks:
            sock.close(0)
        ctx.term()


async def _until(predicate, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Real time: only for what the cells' threads do (a healthy peer gets a generous limit)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _tick(clock: ManualClock, seconds: float) -> None:
    """The controller's clock moves on; its sweep runs (and gives the loop back between batches) before we go on."""
    clock.advance(seconds)
    for _ in range(5):
        await asyncio.sleep(0)


def _gone(controller: Controller) -> list[str]:
    return [c.name for c in controller.cells.values() if c.role == "gone"]


async def _heard_since(controller: Controller, names: list[str]) -> None:
    """Until every one of ``names`` was heard again (its beat's seq moved on)."""
    seqs = {name: controller.cells[name].seq for name in names}
    await _until(
        lambda: all(controller.cells[n].seq > seqs[n] for n in names), "a beating cell was not heard"
    )


async def _stalled_loop_then_one_silent() -> None:
    clock = ManualClock()
    async with Controller(CONFIG, EnginePool(), clock=clock) as controller:
        with Beating(controller.address) as cells:
            await _until(lambda: len(controller.cells) == len(CELLS), "the hellos never arrived")
            clock.advance(2.5 * TIMEOUT_S)  # the loop stands still for 2.5 cell timeouts; the cells beat on
            time.sleep(0.3)  # noqa: ASYNC251 -- (really: their beats wait in the socket)
            await _tick(clock, CONFIG.heartbeat_s)
            assert not _gone(controller), "a stall of the driver's loop was taken for silence"

            cells.mute.add(
                "c7"
            )  # one cell goes quiet; the others are heard before each second of its silence
            others = [name for name in CELLS if name != "c7"]
            for _ in range(int(TIMEOUT_S) + 2):
                await _heard_since(controller, others)
                await _tick(clock, 1.0)
            assert _gone(controller) == ["c7"]
            assert "silent for" in controller.cells["c7"].gone_reason


def test_a_stalled_loop_does_not_make_live_cells_gone_but_one_cells_silence_does() -> None:
    uvloop.run(_stalled_loop_then_one_silent())  # the driver's loop


async def _machine_stands_still_then_all_quiet() -> None:
    clock = ManualClock()
    async with Controller(CONFIG, EnginePool(), clock=clock) as controller:
        with Beating(controller.address) as cells:
            await _until(lambda: len(controller.cells) == len(CELLS), "the hellos never arrived")
            cells.frozen.set()  # the cells stand still with the driver: no beat is waiting when the driver is back
            clock.advance(2.5 * TIMEOUT_S)
            await _tick(clock, CONFIG.heartbeat_s)
            assert not _gone(controller), "a machine that stood still was taken for silence"

            # every cell quiet at once while the driver sweeps on time: the network or machine they share stood still
            for _ in range(int(2 * TIMEOUT_S)):
                await _tick(clock, 1.0)
            assert not _gone(controller), "every cell going quiet at once was taken for the silence of each"
            for _ in range(int((ALL_QUIET - 2) * TIMEOUT_S) + 2):
                await _tick(clock, 1.0)
            assert len(_gone(controller)) == len(CELLS), "cells silent for ALL_QUIET timeouts were not gone"


def test_a_machine_that_stood_still_or_went_quiet_does_not_make_live_cells_gone() -> None:
    uvloop.run(_machine_stands_still_then_all_quiet())
