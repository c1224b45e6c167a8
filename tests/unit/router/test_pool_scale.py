"""The pool at a cluster's size: 1,000 cells joining at once must not stall the driver's loop."""

from __future__ import annotations

import asyncio
import time

from gyre.router.pool import EnginePool


def test_a_thousand_engines_join_the_pool_at_once_in_well_under_a_heartbeat_each() -> None:
    async def main() -> float:
        pool = EnginePool()
        start = time.perf_counter()
        for i in range(1000):
            pool.add(f"http://10.{i // 250}.{i % 250}.1:30000", f"cell-{i}", managed=True)
        elapsed = time.perf_counter() - start
        assert len(pool.serving()) == 1000
        await pool.aclose()
        return elapsed

    # each add built an httpx client (TLS certificates loaded: ~80 ms), 80 s of loop for 1,000 cells, long past
    # controller.cell_timeout_s: the controller declared the cells whose beats queued behind it gone
    assert asyncio.run(main()) < 5.0
