"""Weight updates (disk, torch.distributed over gloo) and memory release/resume leave the engine serving."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gyre.engine import weight_sync
from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, free_port
from gyre.errors import EngineUnavailable
from gyre.protocol import SamplingParams
from reference import hf_greedy
from waits import wait_generating

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)


def _hf(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()


def test_update_weights_from_disk_serves_new_weights_and_version(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    async def go() -> tuple[list[int], list[int], str]:
        async with EngineClient(server.url) as client:
            before = (await client.generate(PROMPT, GREEDY)).output_ids
            await client.update_weights_from_disk(str(tiny_model_b), weight_version=5)
            after = await client.generate(PROMPT, GREEDY)
            await client.update_weights_from_disk(str(tiny_model), weight_version=6)  # back, for other tests
            return before, after.output_ids, after.meta_info.weight_version

    before, after, version = asyncio.run(go())
    assert before == hf_greedy(_hf(tiny_model), PROMPT, 20)
    assert after == hf_greedy(_hf(tiny_model_b), PROMPT, 20) != before
    assert version == "5"


def test_weight_update_through_distributed_group(server: ServerProcess, tiny_model_b: Path) -> None:
    weights = load_file(str(tiny_model_b / "model.safetensors"))
    port = free_port()

    async def go() -> tuple[list[int], int]:
        async with EngineClient(server.url) as client:
            group = asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, "wug")
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name="wug", backend="gloo")
            pg, _ = await asyncio.gather(group, init)
            await weight_sync.push_weights(client, pg, sorted(weights.items()), 42, group_name="wug")
            out = await client.generate(PROMPT, GREEDY)
            return out.output_ids, await client.get_weight_version()

    ids, version = asyncio.run(go())
    assert version == 42
    assert ids == hf_greedy(_hf(tiny_model_b), PROMPT, 20)


def test_release_then_resume_keeps_serving(server: ServerProcess, tiny_model: Path) -> None:
    async def go() -> tuple[dict[str, Any], list[int], str]:
        async with EngineClient(server.url) as client:
            await client.update_weights_from_disk(str(tiny_model), weight_version=7)
            await client.release_memory_occupation()
            released = await client.statistics()
            pending = asyncio.create_task(client.generate(PROMPT, GREEDY))  # waits while memory is released
            await asyncio.sleep(0.3)
            assert not pending.done()
            await client.resume_memory_occupation()
            out = await pending
            return released, out.output_ids, out.meta_info.weight_version

    released, ids, version = asyncio.run(go())
    assert released["released"] == ["kv_cache", "weights"] and released["kv_slots_free"] == 0
    assert ids == hf_greedy(_hf(tiny_model), PROMPT, 20)
    assert version == "7"  # weights came back from the checkpoint version 7 was loaded from


def test_release_refuses_while_requests_run(server: ServerProcess) -> None:
    async def go() -> str:
        async with EngineClient(server.url) as client:
            task = asyncio.create_task(
                client.generate(PROMPT, SamplingParams(max_new_tokens=3000, ignore_eos=True))
            )
            await wait_generating(client)
            try:
                await client.release_memory_occupation()
                return "released"
            except Exception as exc:
                return str(exc)
            finally:
                await client.abort(abort_all=True)
                await task

    assert "pause_generation" in asyncio.run(go())


def test_a_weight_update_waits_for_the_requests_in_flight_so_no_response_spans_two_versions(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    long = SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[list[int], str, str, list[int], str]:
        async with EngineClient(server.url) as client:
            old = await client.get_weight_version()
            stream = client.generate_stream(PROMPT, long)
            first = await anext(stream)  # generating under the old weights now
            assert first.finish_type is None
            update = asyncio.create_task(client.update_weights_from_disk(str(tiny_model_b), old + 1))
            last = first
            async for chunk in stream:
                last = chunk
                assert chunk.meta_info.weight_version == str(old)  # the update waits for this request
            await update
            after = await client.generate(PROMPT, GREEDY)
            await client.update_weights_from_disk(
                str(tiny_model), weight_version=old + 2
            )  # back, for other tests
            return (
                last.output_ids,
                last.meta_info.weight_version,
                str(old),
                after.output_ids,
                after.meta_info.weight_version,
            )

    ids, version, old, after, new = asyncio.run(go())
    assert len(ids) == 400 and version == old
    assert ids[:20] == hf_greedy(_hf(tiny_model), PROMPT, 20)  # all of it sampled with the old weights
    assert new == str(int(old) + 1) and after == hf_greedy(_hf(tiny_model_b), PROMPT, 20)


def test_an_update_broken_off_mid_transfer_leaves_no_weights_to_sample_with(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    """The trainer side of an update sends one tensor, then goes away: the engine's weights are part one version,
    part another, so it answers 503 to every generation until a whole update arrives."""
    tensors = sorted(load_file(str(tiny_model_b / "model.safetensors")).items())
    port = free_port()

    async def go() -> tuple[str, str, list[int]]:
        async with EngineClient(server.url) as client:
            group = asyncio.to_thread(
                weight_sync.create_group, "127.0.0.1", port, 0, 2, "broken", "gloo", 5.0
            )
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name="broken")
            held = list(await asyncio.gather(group, init))[:1]  # our end of the group, and only here

            async def update() -> str:
                try:
                    await client.update_weights_from_distributed(
                        names=[n for n, _ in tensors], dtypes=[weight_sync.dtype_name(t.dtype) for _, t in tensors],
                        shapes=[list(t.shape) for _, t in tensors], group_name="broken", weight_version=43,
                    )  # fmt: skip
                except EngineUnavailable as exc:
                    return str(exc)
                return "the update completed"

            async def break_off() -> None:
                await asyncio.to_thread(held[0].broadcast, tensors[0][1].contiguous())  # one tensor of many
                held.clear()  # its sockets close: the engine's next receive fails

            broke, _ = await asyncio.gather(update(), break_off())
            with pytest.raises(EngineUnavailable) as refused:
                await client.generate(PROMPT, GREEDY)
            await client.update_weights_from_disk(str(tiny_model), weight_version=7)  # a whole update
            return broke, str(refused.value), (await client.generate(PROMPT, GREEDY)).output_ids

    broke, refused, ids = asyncio.run(go())
    assert broke != "the update completed"
    assert "503" in refused and "broke off mid-transfer" in refused and "43" in refused, (broke, refused)
    assert ids == hf_greedy(_hf(tiny_model), PROMPT, 20)


def test_a_generation_arriving_mid_update_waits_for_it_and_samples_the_new_version(
    server: ServerProcess, tiny_model: Path, tiny_model_b: Path
) -> None:
    """Half an update is in (the weights are a mix for now): a generation that arrives then waits for the rest, and is
    answered under the new version, not refused."""
    tensors = sorted(load_file(str(tiny_model_b / "model.safetensors")).items())
    port = free_port()

    async def go() -> tuple[list[int], str]:
        async with EngineClient(server.url) as client:
            group = asyncio.to_thread(
                weight_sync.create_group, "127.0.0.1", port, 0, 2, "halves", "gloo", 30.0
            )
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name="halves")
            pg, _ = await asyncio.gather(group, init)
            half = len(tensors) // 2
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(client.update_weights_from_distributed(
                    names=[n for n, _ in tensors], dtypes=[weight_sync.dtype_name(t.dtype) for _, t in tensors],
                    shapes=[list(t.shape) for _, t in tensors], group_name="halves", weight_version=44,
                ))  # fmt: skip
                for _, t in tensors[:half]:
                    await asyncio.to_thread(pg.broadcast, t.contiguous())
                generation = tasks.create_task(client.generate(PROMPT, GREEDY))
                await asyncio.sleep(0.5)
                assert not generation.done()  # it waits: neither answered from the mix nor refused
                for _, t in tensors[half:]:
                    await asyncio.to_thread(pg.broadcast, t.contiguous())
            out = generation.result()
            await client.update_weights_from_disk(str(tiny_model), weight_version=8)  # back, for other tests
            return out.output_ids, out.meta_info.weight_version

    ids, version = asyncio.run(go())
    assert version == "44" and ids == hf_greedy(_hf(tiny_model_b), PROMPT, 20)
