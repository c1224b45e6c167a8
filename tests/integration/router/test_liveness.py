"""The pool's liveness probe: an engine that accepts connections but never answers is judged hung and its call
continues elsewhere; a slow generation on an engine that answers its probe is never cut."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.engine.client import EngineClient
from gyre.engine.launch import ServerProcess, launch_embedded
from gyre.protocol import SamplingParams
from gyre.router.pool import EnginePool, EngineState

pytestmark = pytest.mark.slow
PROMPT = [5, 17, 42, 99, 3, 64]


@pytest.fixture
def engine(tiny_model: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = launch_embedded(tiny_model, overrides=["engine.kv_cache_mem_gib=0.1"], log_path=tmp_path / "e.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def silent() -> Iterator[str]:
    """A TCP server that accepts every connection (the kernel's backlog) and never reads or answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_an_engine_that_never_answers_is_judged_hung_and_the_call_goes_on(
    engine: ServerProcess, silent: str
) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=0.0)

    async def main() -> tuple[list[int], list[int], list[str], float, EnginePool]:
        async with EngineClient(engine.url) as direct:
            want = (await direct.generate(PROMPT, params)).output_ids
        pool = EnginePool(wait_for_engine_s=5, probe_timeout_s=0.5, hung_after_s=1.0)
        dead, live = pool.add(silent, "silent"), pool.add(engine.url, "live")
        dead.outstanding_tokens = -1  # least loaded: the call goes there first
        start = time.monotonic()
        gen = await pool.generate(PROMPT, params)
        took = time.monotonic() - start
        assert (dead.state, live.state) == (EngineState.HUNG, EngineState.SERVING)
        await pool.aclose()
        return want, gen.output_ids, gen.engines, took, pool

    want, got, engines, took, pool = asyncio.run(main())
    assert got == want and engines == [
        "live"
    ]  # the caller got the whole answer, from the engine that answers
    assert took < 10  # not the request timeout (3600 s)
    stats = pool.statistics()
    assert (stats.hung_engines, stats.moved_calls) == (1, 1)


def test_a_long_generation_on_an_engine_that_answers_its_probe_is_not_cut(engine: ServerProcess) -> None:
    params = SamplingParams(max_new_tokens=400, ignore_eos=True, temperature=1.0)

    async def main() -> tuple[list[str], float, int, EnginePool]:
        pool = EnginePool(probe_timeout_s=2.0, hung_after_s=0.5)  # far shorter than the generation
        busy = pool.add(engine.url, "busy")
        start = time.monotonic()
        gen = await pool.generate(PROMPT, params)
        took = time.monotonic() - start
        await pool.aclose()
        return gen.engines, took, busy.probes, pool

    engines, took, probes, pool = asyncio.run(main())
    assert took > 1.0 and probes >= 1  # it was probed while generating
    assert engines == ["busy"] and pool.statistics().hung_engines == 0
