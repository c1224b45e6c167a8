"""Weight pushes in buckets: an engine serves what its model directory serves, the sender's extra memory is one
bucket, and an engine left with part of a push never claims its version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gyre.config import EngineConfig
from gyre.engine import weight_sync
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, free_port
from gyre.errors import EngineRequestError, EngineUnavailable
from gyre.protocol import (
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
BUCKET_BYTES = 256 * 1024  # the tiny model: 6.4 MiB in 46 tensors, the largest 384 KiB


def _as_one_buffer(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """The same weights as views of one flat buffer, the way a trainer holds its parameters."""
    flat = torch.cat([t.reshape(-1) for _, t in tensors])
    out, at = [], 0
    for name, t in tensors:
        out.append((name, flat[at : at + t.numel()].view(t.shape)))
        at += t.numel()
    return out


@pytest.mark.parametrize("source", ["tensors", "one-buffer", "per-tensor"])
def test_a_push_in_buckets_serves_the_logprobs_of_the_model_directory(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path, source: str
) -> None:
    """Several buckets, the largest tensors each alone in one: afterwards the engine answers exactly as when it
    loaded the directory, under the pushed version; the send buffers never exceed max(bucket, largest tensor)."""
    tensors = sorted(load_file(str(tiny_model_b / "model.safetensors")).items())
    if source == "one-buffer":
        tensors = _as_one_buffer(tensors)
    largest = max(t.numel() * t.element_size() for _, t in tensors)
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    assert largest > BUCKET_BYTES  # one tensor at least goes alone
    port, group_name = free_port(), f"buckets-{source}"

    async def go() -> tuple[list[float], list[float], list[float], str, weight_sync.PushStatistics, int]:
        async with EngineClient(server.url) as client:
            await client.update_weights_from_disk(str(tiny_model_b), weight_version=11)
            loaded = (await client.generate(PROMPT, GREEDY)).output_logprobs
            await client.update_weights_from_disk(str(tiny_model), weight_version=12)
            before = (await client.generate(PROMPT, GREEDY)).output_logprobs
            group = asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, group_name)
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name=group_name)
            pg, _ = await asyncio.gather(group, init)
            stats = await weight_sync.push_weights(
                client,
                pg,
                tensors,
                13,
                group_name,
                flattened=source != "per-tensor",
                bucket_bytes=BUCKET_BYTES,
            )
            pushed = await client.generate(PROMPT, GREEDY)
            received = (await client.statistics())["receive_buffer_bytes_max"]
            await client.update_weights_from_disk(str(tiny_model), weight_version=7)  # back, for other tests
            return loaded, before, pushed.output_logprobs, pushed.meta_info.weight_version, stats, received

    loaded, before, pushed, version, stats, received = asyncio.run(go())
    assert before != loaded  # the push has something to change
    assert pushed == loaded and version == "13"
    assert stats.sent_bytes == total and stats.buckets >= total // max(BUCKET_BYTES, largest) > 1
    assert stats.largest_bucket_bytes <= max(BUCKET_BYTES, largest)
    assert stats.copied_bytes_max <= max(BUCKET_BYTES, largest)  # a bucket, not the model
    assert received <= max(BUCKET_BYTES, largest)  # the engine's receive buffers: a bucket too
    if source == "tensors":
        assert stats.copied_bytes_max > 0  # separate tensors: each bucket is copied into one buffer
    else:
        assert stats.copied_bytes_max == 0  # views of the weights' own memory: nothing copied


def test_a_push_broken_off_after_some_buckets_never_claims_its_version(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    """Two buckets of three arrive, then the trainer goes away mid-bucket: the engine keeps reporting the old
    version, refuses to sample from the mix (503), and serves again after a whole update."""
    tensors = sorted(load_file(str(tiny_model_b / "model.safetensors")).items())
    thirds = [tensors[: len(tensors) // 3], tensors[len(tensors) // 3 : 2 * len(tensors) // 3]]
    thirds.append(tensors[2 * len(tensors) // 3 :])
    port = free_port()

    async def go() -> tuple[int, int, str, str]:
        async with EngineClient(server.url) as client:
            old = await client.get_weight_version()
            group = asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, "cut", "gloo", 5.0)
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name="cut")
            held = list(await asyncio.gather(group, init))[:1]  # our end of the group, and only here

            async def call(chunk: list[tuple[str, torch.Tensor]], left: int) -> str:
                return await client.update_weights_from_distributed(
                    names=[n for n, _ in chunk], dtypes=[weight_sync.dtype_name(t.dtype) for _, t in chunk],
                    shapes=[list(t.shape) for _, t in chunk], group_name="cut",
                    weight_version=None if left else 45, buckets_left=left,
                )  # fmt: skip

            async def send(chunk: list[tuple[str, torch.Tensor]]) -> None:
                for _, t in chunk:
                    await asyncio.to_thread(held[0].broadcast, t.contiguous())

            for n, chunk in enumerate(thirds[:2]):
                await asyncio.gather(call(chunk, 2 - n), send(chunk))
            between = await client.get_weight_version()

            async def last() -> str:
                try:
                    return await call(thirds[2], 0)
                except EngineUnavailable as exc:
                    return str(exc)

            async def break_off() -> None:
                await asyncio.to_thread(held[0].broadcast, thirds[2][0][1].contiguous())  # one tensor of many
                held.clear()  # its sockets close: the engine's next receive fails

            broke, _ = await asyncio.gather(last(), break_off())
            after = await client.get_weight_version()
            with pytest.raises(EngineUnavailable) as refused:
                await client.generate(PROMPT, GREEDY)
            await client.update_weights_from_disk(str(tiny_model), weight_version=old)  # a whole update
            await client.generate(PROMPT, GREEDY)  # serves again
            return between - old, after - old, broke, str(refused.value)

    between, after, broke, refused = asyncio.run(go())
    assert between == 0 and after == 0  # neither between buckets nor after the break is 45 claimed
    assert "Succeeded" not in broke
    assert "503" in refused and "broke off" in refused, refused


def test_a_generation_arriving_between_buckets_waits_and_a_push_that_stops_there_is_refused(
    tiny_model: Path, tiny_model_b: Path
) -> None:
    """In-process engine: a generation that arrives between two buckets waits for the last and is answered under
    the new version with the directory's logprobs. A push whose next bucket never comes (the trainer died between
    calls) is given up after the group's timeout: the waiting generation is refused (503), the version unchanged."""
    tensors = sorted(load_file(str(tiny_model_b / "model.safetensors")).items())
    halves = [tensors[: len(tensors) // 2], tensors[len(tensors) // 2 :]]
    engine = EmbeddedEngine(EngineConfig(model_path=str(tiny_model), kv_cache_mem_gib=0.05, weight_version=3))

    def request(
        chunk: list[tuple[str, torch.Tensor]], group: str, left: int
    ) -> UpdateWeightsFromDistributedRequest:
        return UpdateWeightsFromDistributedRequest(
            names=[n for n, _ in chunk], dtypes=[weight_sync.dtype_name(t.dtype) for _, t in chunk],
            shapes=[list(t.shape) for _, t in chunk], group_name=group,
            weight_version=None if left else "4", load_format="flattened_bucket", buckets_left=left,
        )  # fmt: skip

    async def bucket(
        pg: weight_sync.WeightGroup, chunk: list[tuple[str, torch.Tensor]], group: str, left: int
    ) -> None:
        flat = weight_sync.flat_bytes([t for _, t in chunk])
        await asyncio.gather(engine.update_weights_from_distributed(request(chunk, group, left)),
                             asyncio.to_thread(pg.broadcast, flat))  # fmt: skip

    async def join(group: str) -> weight_sync.WeightGroup:
        port = free_port()
        body = InitWeightsUpdateGroupRequest(
            master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2, group_name=group
        )
        pg, _ = await asyncio.gather(
            asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, group),
            engine.init_weights_update_group(body),
        )
        return pg

    def generation() -> GenerateRequest:
        return GenerateRequest(input_ids=PROMPT, sampling_params=GREEDY, return_logprob=True)

    async def go() -> tuple[list[float], list[float], str, str, int]:
        pg = await join("whole")
        await bucket(pg, halves[0], "whole", 1)
        waiting = asyncio.create_task(
            engine.generate(generation())
        )  # runs to its wait before the bucket's tasks
        await bucket(pg, halves[1], "whole", 0)
        answered = await waiting
        await engine.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path=str(tiny_model_b)))
        loaded = (await engine.generate(generation())).output_logprobs

        pg = await join("stops")
        engine._groups["stops"].timeout_s = 2.0  # the engine's end of the group: give up on the push soon
        await bucket(pg, halves[0], "stops", 1)
        stranded = asyncio.create_task(engine.generate(generation()))
        with pytest.raises(EngineRequestError) as refused:
            await stranded  # no second bucket: refused once the group's timeout passes
        return (
            answered.output_logprobs,
            loaded,
            answered.meta_info.weight_version,
            str(refused.value),
            engine.weight_version,
        )

    try:
        answered, loaded, version, refused, after = asyncio.run(go())
    finally:
        engine.close()
    assert version == "4" and answered == loaded
    assert "broke off" in refused and after == 4, refused
