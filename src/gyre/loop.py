"""The driver's event loop: uvloop where it is installed, with the heap built before the loop frozen out of the
garbage collector.

Every driver entry point (`gyre train`, `gyre eval`, `gyre router`, `Trainer.run`, `run_eval`) runs its main
coroutine through `run`. Freezing matters at scale: torch, transformers and the tokenizer leave a few hundred
thousand long-lived objects that every full collection would otherwise walk again (about 0.3 s each on this
project's 2-core machine, measured by ``benchmarks/runtime.py``, which reports collections per burst).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def freeze_heap() -> None:
    """Collect once, then keep everything alive now out of later collections (the imports, a loaded tokenizer):
    call again after a large, permanent set-up."""
    gc.collect()
    gc.freeze()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop (uvloop if installed) and return its result."""

    async def frozen() -> T:
        freeze_heap()
        return await main

    try:
        import uvloop
    except ImportError:
        return asyncio.run(frozen())
    return uvloop.run(frozen())
