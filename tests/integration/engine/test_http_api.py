"""SGLang's HTTP API served by ``gyre serve-engine``, driven through ``EngineClient`` and raw HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess
from gyre.errors import EngineCapacityError, EngineRequestError
from gyre.protocol import GenerateResponse, SamplingParams
from waits import wait_generating

PROMPT = [10, 20, 30, 40, 50, 60]
LONG = SamplingParams(max_new_tokens=4000, temperature=0.0, ignore_eos=True)


def test_generate_and_stream_agree(server: ServerProcess) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResponse, list[GenerateResponse]]:
        async with EngineClient(server.url) as client:
            whole = await client.generate(PROMPT, params)
            chunks = [c async for c in client.generate_stream(PROMPT, params)]
            return whole, chunks

    whole, chunks = asyncio.run(go())
    assert len(whole.output_ids) == 16 and whole.finish_type == "length"
    assert len(whole.output_logprobs) == 16
    assert chunks[-1].output_ids == whole.output_ids  # streamed chunks are cumulative, the last is final
    assert chunks[-1].output_logprobs == pytest.approx(whole.output_logprobs, abs=1e-6)
    assert all(c.finish_type is None for c in chunks[:-1]) and len(chunks) > 1
    lengths = [len(c.output_ids) for c in chunks]
    assert lengths == sorted(lengths)


def test_abort_returns_partial_output_and_other_requests_finish(server: ServerProcess) -> None:
    async def go() -> tuple[GenerateResponse, GenerateResponse]:
        async with EngineClient(server.url) as client:
            long = asyncio.create_task(client.generate(PROMPT, LONG, rid="long-1"))
            short = asyncio.create_task(
                client.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=0))
            )
            await wait_generating(
                client, tokens=32
            )  # past the short request's 8: the long one has tokens too
            await client.abort("long-1")
            return await long, await short

    long, short = asyncio.run(go())
    assert long.finish_type == "abort"
    assert 0 < len(long.output_ids) < 4000
    assert len(long.output_logprobs) == len(long.output_ids)
    assert short.finish_type == "length" and len(short.output_ids) == 8


@pytest.mark.slow(
    reason="a long generation paused in place and continued (13 s); the fast tier pauses in a switch"
)
def test_pause_in_place_then_continue_finishes_identically(server: ServerProcess) -> None:
    params = SamplingParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResponse, GenerateResponse, int]:
        async with EngineClient(server.url) as client:
            ref = await client.generate(PROMPT, params)
            task = asyncio.create_task(client.generate(PROMPT, params))
            await wait_generating(client)
            await client.pause_generation("in_place")
            stats = await client.statistics()
            await asyncio.sleep(0.3)
            assert not task.done()
            await client.continue_generation()
            return ref, await task, stats["running_requests"]

    ref, resumed, running = asyncio.run(go())
    assert running == 1
    assert resumed.output_ids == ref.output_ids


def test_pause_abort_mode_ends_requests_and_new_ones_wait(server: ServerProcess) -> None:
    async def go() -> tuple[GenerateResponse, GenerateResponse]:
        async with EngineClient(server.url) as client:
            task = asyncio.create_task(client.generate(PROMPT, LONG))
            await wait_generating(client)
            await client.pause_generation("abort")
            aborted = await task
            waiting = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=4)))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await client.continue_generation()
            return aborted, await waiting

    aborted, later = asyncio.run(go())
    assert aborted.finish_type == "abort" and later.finish_type == "length"


def test_admin_endpoints(server: ServerProcess) -> None:
    async def go() -> None:
        async with EngineClient(server.url) as client:
            assert await client.health()
            info = await client.get_model_info()
            assert info["architecture"] == "Qwen3ForCausalLM" and info["weight_version"] == "0"
            await client.flush_cache()
            assert await client.get_weight_version() == 0

    asyncio.run(go())
    assert httpx.get(server.url + "/get_weight_version").json() == {"weight_version": "0"}


@pytest.mark.parametrize("version", ["default", "v2", "-1", "3.0", ""])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/update_weights_from_disk", {"model_path": "/nowhere"}),
        ("/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": [], "group_name": "none"}),
    ],
)
def test_weight_update_with_a_non_integer_version_is_a_400_naming_the_field(
    server: ServerProcess, path: str, body: dict[str, Any], version: str
) -> None:
    resp = httpx.post(server.url + path, json={**body, "weight_version": version}, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["success"] is False
    assert "weight_version" in resp.json()["message"] and repr(version) in resp.json()["message"]
    assert httpx.get(server.url + "/get_weight_version").json() == {"weight_version": "0"}  # unchanged


BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"input_ids": "abc"}', 400, "input_ids"),
    (b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}', 400, "max_new_tokens"),
    (b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "ten"}}', 400, "max_new_tokens"),
    (b'{"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}}', 400, "temperature"),
    (b'{"input_ids": [1, 2], "sampling_params": {"tempreature": 0.5}}', 400, "tempreature"),
    (b'{"input_ids": []}', 400, "empty"),
    (b'{"text": ""}', 400, "empty"),
    (b"{}", 400, "exactly one"),
    (b'{"input_ids": [1, 99999]}', 400, "vocabulary"),
    (json.dumps({"input_ids": [1] * 40000}).encode(), 413, "context length"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_BODIES)
def test_bad_generate_input_gets_a_clear_4xx(
    server: ServerProcess, body: bytes, status: int, words: str
) -> None:
    resp = httpx.post(server.url + "/generate", content=body, timeout=30)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert words in error["message"] and error["code"] == status


def test_bad_input_does_not_disturb_running_requests(server: ServerProcess) -> None:
    params = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[GenerateResponse, GenerateResponse]:
        async with EngineClient(server.url) as client:
            ref = await client.generate(PROMPT, params)
            task = asyncio.create_task(client.generate(PROMPT, params))
            async with httpx.AsyncClient(base_url=server.url) as raw:
                for body, _, _ in BAD_BODIES:
                    await raw.post("/generate", content=body)
                unknown = await raw.post("/abort_request", json={"rid": "nobody"})
                assert unknown.status_code == 404 and "nobody" in unknown.json()["error"]["message"]
                assert (await raw.get("/no/such/path")).status_code == 404
            with pytest.raises(EngineCapacityError):
                await client.generate([1] * 40000)
            with pytest.raises(EngineRequestError, match="exceed"):
                await client.generate(PROMPT, SamplingParams(max_new_tokens=2, min_new_tokens=5))
            return ref, await task

    ref, during = asyncio.run(go())
    assert during.output_ids == ref.output_ids
    assert server.proc.poll() is None
