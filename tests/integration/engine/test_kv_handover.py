"""A request moved between engines continues from the exported KV instead of recomputing its prefix."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.errors import EngineRequestError
from gyre.protocol import GenerateResponse, SamplingParams
from waits import wait_generating

PROMPT = list(range(30, 130))
PARAMS = SamplingParams(max_new_tokens=600, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def second(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A second engine serving the same weights."""
    log = tmp_path_factory.mktemp("logs") / "engine-b.log"
    with launch_embedded(tiny_model, overrides=["engine.kv_cache_mem_gib=0.25"], log_path=log) as proc:
        yield proc


def test_moved_request_continues_from_imported_kv(server: ServerProcess, second: ServerProcess) -> None:
    async def go() -> tuple[GenerateResponse, GenerateResponse, GenerateResponse, int]:
        async with EngineClient(server.url) as a, EngineClient(second.url) as b:
            ref = await b.generate(PROMPT, PARAMS)
            await b.flush_cache()
            task = asyncio.create_task(a.generate(PROMPT, PARAMS, rid="moving"))
            await wait_generating(a, tokens=8)
            await a.abort("moving")
            partial = await task
            sofar = PROMPT + partial.output_ids
            covered = await b.import_kv(await a.export_kv(sofar))
            rest = SamplingParams(
                max_new_tokens=600 - len(partial.output_ids), temperature=0.0, ignore_eos=True
            )
            cont = await b.generate(sofar, rest)
            return ref, partial, cont, covered

    ref, partial, cont, covered = asyncio.run(go())
    n = len(partial.output_ids)
    assert partial.finish_type == "abort" and 0 < n < 600
    assert covered == len(PROMPT) + n - 1  # every token with KV: all but the last sampled one
    assert cont.meta_info.cached_tokens == covered  # nothing of the prefix was recomputed
    assert partial.output_ids + cont.output_ids == ref.output_ids
    joined = partial.output_logprobs + cont.output_logprobs
    assert joined == pytest.approx(ref.output_logprobs, abs=1e-4)


def test_import_refuses_foreign_or_stale_kv(
    server: ServerProcess, second: ServerProcess, tiny_model: Path
) -> None:
    async def go() -> None:
        async with EngineClient(server.url) as a, EngineClient(second.url) as b:
            await a.generate(PROMPT, SamplingParams(max_new_tokens=4))
            blob = await a.export_kv(PROMPT)
            with pytest.raises(EngineRequestError, match="not a KV export"):
                await b.import_kv(b"garbage")
            await b.update_weights_from_disk(str(tiny_model), weight_version=9)
            with pytest.raises(EngineRequestError, match="weight version"):
                await b.import_kv(blob)

    asyncio.run(go())
    assert httpx.get(second.url + "/health").status_code == 200
