"""The pool at a cluster's size: 1,000 cells joining at once must not stall the driver's loop."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gyre.router.pool import EnginePool


def test_a_thousand_engines_join_the_pool_at_once_in_well_under_a_heartbeat_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each add built an httpx client (TLS certificates loaded: ~80 ms), 80 s of loop for 1,000 cells, long past
    # controller.cell_timeout_s: the controller declared the cells whose beats queued behind it gone. The clients
    # built are counted, not the seconds (a loaded machine stretches those): an engine's is made at its first use
    built: list[object] = []
    init = httpx.AsyncClient.__init__

    def counted(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", counted)

    async def main() -> None:
        pool = EnginePool()
        for i in range(1000):
            pool.add(f"http://10.{i // 250}.{i % 250}.1:30000", f"cell-{i}", managed=True)
        assert len(pool.serving()) == 1000
        assert built == []
        await pool.aclose()

    asyncio.run(main())
