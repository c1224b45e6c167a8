"""The live terminal view of `gyre train` (rich): cells and their roles, water level, executions, step, reward,
switch times, staleness; redrawn every second from what the controller, the books and the metrics already hold."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.live import Live
from rich.table import Table

from gyre.control.books import Books
from gyre.control.controller import Controller

if TYPE_CHECKING:
    from gyre.runtime.shards import ShardStatistics

Shards = Callable[[], "ShardStatistics"]

ROLE_STYLE = {
    "serving": "blue",
    "training": "dark_orange",
    "draining": "grey50",
    "resuming": "grey50",
    "gone": "red",
}


def render(
    controller: Controller, books: Books, records: list[Any], started: float, shards: Shards | None = None
) -> Group:
    """One frame: the cells table and the run's figures (``shards``: the runtime shards' statistics, when they run
    the executions)."""
    cells = Table(title="cells", expand=False)
    for col in ("cell", "kind", "role", "version", "switches", "last switch s"):
        cells.add_column(col, justify="right")
    last: dict[str, float] = {r.cell: r.total_s for r in controller.records}
    for c in controller.statistics().cells:
        style = ROLE_STYLE.get(c.role, "")
        cells.add_row(c.name, c.kind, f"[{style}]{c.role}[/]", str(c.version), str(c.switches),
                      f"{last[c.name]:.2f}" if c.name in last else "-")  # fmt: skip
    run = Table(title="run", show_header=False)
    run.add_column(justify="right")
    run.add_column(justify="left")
    step = records[-1] if records else None
    rows = [
        ("elapsed", f"{time.monotonic() - started:.0f} s"),
        ("step", f"{books.train_step} of {books.steps} (weights v{books.version})"),
        ("water level", f"{books.dispatched - books.finished} executions in flight"),
        ("executions", f"{books.dispatched} dispatched, {books.finished} finished of {books.total}"),
        ("reward", f"{step.reward_mean:.3f} ± {step.reward_std:.3f}, pass {step.pass_rate:.0%}" if step else "-"),
        ("dropped", str(sum(r.dropped for r in records))),
        ("tokens/s trained", f"{step.trainer.computed_tokens / max(step.trainer.seconds, 1e-9):,.0f}" if step else "-"),
        ("staleness", f"{step.trainer.staleness_mean:.2f} (max {step.trainer.staleness_max})" if step else "-"),
    ]  # fmt: skip
    if shards is not None:
        s = shards()
        lost = f", lost: {', '.join(s.lost)}" if s.lost else ""
        rows.append(("shards", f"{s.live} of {s.shards} live, {s.totals.running} running (as last reported), "
                               f"{s.reruns} reruns{lost}"))  # fmt: skip
    for key, value in rows:
        run.add_row(key, value)
    return Group(cells, run)


async def show(
    controller: Controller, books: Books, records: list[Any], started: float, shards: Shards | None = None
) -> None:
    """Redraw every second until cancelled."""
    with Live(
        render(controller, books, records, started, shards), refresh_per_second=2, transient=False
    ) as live:
        while True:
            await asyncio.sleep(1.0)
            live.update(render(controller, books, records, started, shards))
