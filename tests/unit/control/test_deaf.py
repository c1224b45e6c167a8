"""A driver loop that stood still (a long garbage collection, thousands of executions starting at once) must not
make the controller declare live cells gone: their beats wait in the socket and are read before any judgement. Nor
must a whole machine that stood still (the cells frozen with the driver, so no beat waits): the stall is nobody's
silence."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import uvloop
import zmq

from gyre.config import ControllerConfig
from gyre.control.controller import Controller
from gyre.protocol import CellBeat, CellHello
from gyre.router.pool import EnginePool

CELLS = [f"c{i}" for i in range(100)]


def _beating(address: str, stop: threading.Event, frozen: threading.Event | None = None) -> None:
    """The heartbeat threads of 100 cell processes: a Hello each, then a beat each every 0.1 s until ``stop``
    (none while ``frozen`` is set)."""
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in CELLS]
    encode = msgspec.msgpack.Encoder().encode
    for order, (name, sock) in enumerate(zip(CELLS, socks, strict=True), 1):
        sock.connect(address)
        sock.send(encode(CellHello(cell=name, kind="standalone", order=order, engine_url=f"http://127.0.0.1:{order}",
                                   capacity=4, role="resuming", seq=1)))  # fmt: skip
    seq = 1
    while not stop.wait(0.1):
        if frozen is not None and frozen.is_set():
            continue
        seq += 1
        for name, sock in zip(CELLS, socks, strict=True):
            sock.send(encode(CellBeat(cell=name, seq=seq)))
    for sock in socks:
        sock.close(0)
    ctx.term()


async def _until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


async def _stall_then_silence() -> None:
    cfg = ControllerConfig(heartbeat_s=0.1, cell_timeout_s=1.0)
    stop = threading.Event()
    async with Controller(cfg, EnginePool()) as controller:
        beats = threading.Thread(target=_beating, args=(controller.address, stop), daemon=True)
        beats.start()
        try:
            assert await _until(lambda: len(controller.cells) == len(CELLS), 5.0), "hellos never arrived"
            time.sleep(2.5)  # noqa: ASYNC251 -- the loop stands still for 2.5 cell timeouts; the cells beat on
            await asyncio.sleep(0.5)
            gone = [c.name for c in controller.cells.values() if c.role == "gone"]
            assert not gone, f"a stall of the driver's loop was taken for silence of {len(gone)} cells"
        finally:
            stop.set()
            beats.join()
        # the cell really goes quiet: still detected within about a timeout
        assert await _until(lambda: all(c.role == "gone" for c in controller.cells.values()), 3.0)


def test_a_stalled_loop_does_not_make_live_cells_gone_but_real_silence_does() -> None:
    uvloop.run(_stall_then_silence())  # the driver's loop


async def _machine_stands_still() -> None:
    cfg = ControllerConfig(heartbeat_s=0.1, cell_timeout_s=1.0)
    stop, frozen = threading.Event(), threading.Event()
    async with Controller(cfg, EnginePool()) as controller:
        beats = threading.Thread(target=_beating, args=(controller.address, stop, frozen), daemon=True)
        beats.start()
        try:
            assert await _until(lambda: len(controller.cells) == len(CELLS), 5.0), "hellos never arrived"
            frozen.set()  # the cells stand still with the driver: no beat is waiting when the driver is back
            time.sleep(2.5)  # noqa: ASYNC251 -- the loop stands still for 2.5 cell timeouts
            frozen.clear()
            await asyncio.sleep(0.5)
            gone = [c.name for c in controller.cells.values() if c.role == "gone"]
            assert not gone, f"a machine that stood still was taken for silence of {len(gone)} cells"
        finally:
            stop.set()
            beats.join()
        assert await _until(lambda: all(c.role == "gone" for c in controller.cells.values()), 3.0)


def test_a_machine_that_stood_still_does_not_make_live_cells_gone() -> None:
    uvloop.run(_machine_stands_still())
