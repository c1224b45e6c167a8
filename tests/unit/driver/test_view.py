"""The live view shows what a person watching a run looks for: each cell's role, the water level, the step."""

from __future__ import annotations

import time

from rich.console import Console

from gyre.config import ControllerConfig
from gyre.control.books import Books
from gyre.control.controller import Controller, _Cell
from gyre.driver.view import render
from gyre.router.pool import EnginePool


def test_a_frame_shows_cells_water_level_and_step() -> None:
    controller = Controller(ControllerConfig(), EnginePool())
    controller.cells["cell-0"] = _Cell("cell-0", "core", 0, "http://x", 4, b"a", role="training", version=2)
    controller.cells["cell-1"] = _Cell(
        "cell-1", "satellite", 1, "http://y", 4, b"b", role="serving", version=2
    )
    books = Books(batch_executions=4, burst_steps=1, steps=3)
    books.dispatch(6)
    books.finish(0)
    console = Console(record=True, width=120)
    console.print(render(controller, books, [], time.monotonic()))
    text = console.export_text()
    assert "cell-0" in text and "training" in text and "serving" in text
    assert "5 executions in flight" in text and "6 dispatched, 1 finished of 12" in text
    assert "0 of 3 (weights v0)" in text


def test_a_frame_shows_the_shards_when_they_run_the_executions() -> None:
    from gyre.runtime.dispatch import RuntimeStatistics
    from gyre.runtime.shards import ShardStatistics

    totals = RuntimeStatistics(dispatched=9, started=8, finished=3, water_level=6, running=5, by_status={})
    stats = ShardStatistics(shards=3, live=2, totals=totals, lost=["shard-1"], reruns=2)
    console = Console(record=True, width=160)
    console.print(render(Controller(ControllerConfig(), EnginePool()), Books(4, 1, 3), [], time.monotonic(),
                         lambda: stats))  # fmt: skip
    text = console.export_text()
    assert "2 of 3 live, 5 running (as last reported), 2 reruns, lost: shard-1" in text
