"""The driver's event loop: uvloop where it is installed, and a garbage collector that keeps its pauses short.

Every driver entry point (`gyre train`, `gyre eval`, `gyre router`, `Trainer.run`, `run_eval`) runs its main
coroutine through `run`. A full collection walks every tracked object: torch, transformers and the tokenizer leave a
few hundred thousand, and 10,000 waiting executions a few million more, so at that scale one full collection stood
the loop still for up to 1.9 s (``benchmarks/runtime.py`` reports collections per burst). `run` therefore

- freezes the heap built before the loop (`freeze_heap`): the imports and set-up, alive for the whole run;
- installs `Governor`: after each full collection the survivors are frozen too, so the next one walks only what
  became old since; every ``thaw_every``-th full collection, and no more often than every ``thaw_interval_s``, first
  thaws everything, so cyclic garbage among old objects (finished executions' tasks and frames) is reclaimed then,
  not kept for the life of the driver. The interval bounds how often a whole-heap walk (0.19 s in a bare router)
  can stand the loop still, however fast something allocates (issue 31: a client sending 300,000 empty objects a
  request made full collections, and so thaws, frequent).

Objects freed by reference counting (most of them) are freed at once whether frozen or not.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
THAW_EVERY = 8  # full collections between two that walk the whole heap
THAW_INTERVAL_S = 60.0  # and seconds, at least


def freeze_heap() -> None:
    """Collect once, then keep everything alive now out of later collections (the imports, a loaded tokenizer):
    call again after a large, permanent set-up."""
    gc.collect()
    gc.freeze()


class Governor:
    """A `gc.callbacks` entry: freeze the survivors of each full collection, thaw all before one when ``thaw_every``
    full collections and ``thaw_interval_s`` have passed since the last thaw (`install` / `remove`)."""

    def __init__(self, thaw_every: int = THAW_EVERY, thaw_interval_s: float = THAW_INTERVAL_S) -> None:
        if thaw_every < 1:
            raise ValueError(f"thaw_every must be at least 1, not {thaw_every}")
        self.thaw_every, self.thaw_interval_s = thaw_every, thaw_interval_s
        self.full = 0  # full collections seen
        self.thawed = 0  # of them, how many walked the whole heap
        self.since = 0  # full collections since the last thaw (or the start)
        self._thawed_at = time.monotonic()

    def due(self) -> bool:
        """Whether the next full collection walks the whole heap."""
        return (
            self.since + 1 >= self.thaw_every and time.monotonic() - self._thawed_at >= self.thaw_interval_s
        )

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            if self.due():
                gc.unfreeze()  # this collection walks everything: old cycles are reclaimed
                self.thawed += 1
                self.since = -1
                self._thawed_at = time.monotonic()
            return
        self.full += 1
        self.since += 1
        gc.freeze()  # survivors are old: later collections skip them until the next thaw

    def install(self) -> Governor:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop (uvloop if installed) under a `Governor`; return its result."""

    async def governed() -> T:
        freeze_heap()
        governor = Governor().install()
        try:
            return await main
        finally:
            governor.remove()
            gc.unfreeze()  # a caller's process (Trainer.run from a notebook) collects as before

    try:
        import uvloop
    except ImportError:
        return asyncio.run(governed())
    return uvloop.run(governed())
