"""The pool's liveness probe: an engine that accepts connections but never answers is judged hung and its call
continues elsewhere; a slow generation on an engine that answers its probe is never cut."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.protocol import SamplingParams
from gyre.router.pool import EnginePool, EngineState

pytestmark = [
    pytest.mark.slow(reason="waits out probes of engines that hang or never answer"),
    pytest.mark.timing,
]
# The pool's probe settings are every engine's, the healthy one's too: 10 s without an answer to /health before an
# engine is hung, not 1 s (a loaded machine can hold a busy engine's answer that long); the victim never answers.
PROBE = {"probe_timeout_s": 5.0, "hung_after_s": 10.0}
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

    async def main() -> tuple[list[int], list[int], list[str], EnginePool]:
        async with EngineClient(engine.url) as direct:
            want = (await direct.generate(PROMPT, params)).output_ids
        pool = EnginePool(wait_for_engine_s=60, **PROBE)
        dead, live = pool.add(silent, "silent"), pool.add(engine.url, "live")
        dead.outstanding_tokens = -1  # least loaded: the call goes there first
        async with asyncio.timeout(120):  # not the request timeout (3600 s)
            gen = await pool.generate(PROMPT, params)
        assert (dead.state, live.state) == (EngineState.HUNG, EngineState.SERVING)
        await pool.aclose()
        return want, gen.output_ids, gen.engines, pool

    want, got, engines, pool = asyncio.run(main())
    assert got == want and engines == [
        "live"
    ]  # the caller got the whole answer, from the engine that answers
    stats = pool.statistics()
    assert (stats.hung_engines, stats.moved_calls) == (1, 1)


def test_a_long_generation_on_an_engine_that_answers_its_probe_is_not_cut(engine: ServerProcess) -> None:
    # 1500 tokens take seconds on this model (400 took 0.8 s on a quiet machine): many times hung_after_s
    params = SamplingParams(max_new_tokens=1500, ignore_eos=True, temperature=1.0)

    async def main() -> tuple[list[str], float, int, EnginePool]:
        # hung after 0.2 s without an answer (far shorter than the generation): the engine must answer its probes
        pool = EnginePool(probe_timeout_s=20.0, hung_after_s=0.2)
        busy = pool.add(engine.url, "busy")
        start = time.monotonic()
        gen = await pool.generate(PROMPT, params)
        took = time.monotonic() - start
        await pool.aclose()
        return gen.engines, took, busy.probes, pool

    engines, took, probes, pool = asyncio.run(main())
    assert took > 0.2 and probes >= 1  # it was probed while generating
    assert engines == ["busy"] and pool.statistics().hung_engines == 0


def test_a_call_moved_to_an_engine_that_never_answers_is_not_held_by_its_kv_hand_over(
    engine: ServerProcess, silent: str
) -> None:
    """A drained engine's call is sent on to a destination that accepts connections but never answers: the KV
    hand-over waiting on it is probed like a call, judged hung, given up, and the call finishes on another engine."""
    params = SamplingParams(max_new_tokens=1500, ignore_eos=True, temperature=1.0)

    async def main() -> tuple[list[int], list[str], EnginePool]:
        pool = EnginePool(wait_for_engine_s=60, **PROBE)
        first = pool.add(engine.url, "first")
        pool.add(silent, "silent").outstanding_tokens = 10**9  # gets no call of its own: only the moved one
        call = asyncio.ensure_future(pool.generate(PROMPT, params))
        async with asyncio.timeout(60):  # until it generates on the first engine, then a moment more
            while not first.inflight:  # noqa: ASYNC110 -- the pool's counter, read as a test reads it
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        pool.add(engine.url, "second").outstanding_tokens = 10**8  # the same server, under another name
        await pool.drain("first", destination="silent")
        async with asyncio.timeout(120):  # the client's own timeout is 600 s
            gen = await call
        await pool.aclose()
        return gen.output_ids, gen.engines, pool

    ids, engines, pool = asyncio.run(main())
    assert len(ids) == 1500 and engines[0] == "first" and engines[-1] == "second", engines
    assert "silent" not in engines
    assert pool.statistics().hung_engines == 1
