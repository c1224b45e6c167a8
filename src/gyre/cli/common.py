"""What the command modules share: dotted overrides from options, and running a driver's coroutine."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any


def override(key: str, value: object) -> str:
    """A dotted override whose value is a TOML literal (strings quoted and escaped, so any path survives)."""
    if isinstance(value, Path):
        value = str(value)
    return f"{key}={json.dumps(value)}"


def run_loop(coro: Coroutine[Any, Any, object]) -> None:
    """Run a driver's coroutine (`gyre.driver.eventloop`: uvloop where installed, the start-up heap frozen)."""
    from gyre.driver import eventloop

    eventloop.run(coro)
