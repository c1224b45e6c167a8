"""The same client against a real SGLang server (needs an NVIDIA GPU and ``pip install 'gyre[gpu]'``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gyre.engine import weight_sync
from gyre.engine.engineclient import EngineClient
from gyre.engine.launcher import ServerProcess, free_port, launch_sglang
from gyre.protocol import SamplingParams

pytestmark = pytest.mark.gpu
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def sglang_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device")
    log = tmp_path_factory.mktemp("logs") / "sglang.log"
    with launch_sglang(tiny_model, mem_fraction_static=0.3, log_path=log) as proc:
        yield proc


def test_generate_release_resume_and_distributed_update(
    sglang_server: ServerProcess, tiny_model_b: Path
) -> None:
    from safetensors.torch import load_file

    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    weights = load_file(str(tiny_model_b / "model.safetensors"), device="cuda")
    port = free_port()

    async def go() -> None:
        async with EngineClient(sglang_server.url) as client:
            out = await client.generate(PROMPT, params)
            assert len(out.output_ids) == 16 and len(out.output_logprobs) == 16
            assert out.meta_info.weight_version == "0"  # launched with --weight-version 0, not "default"
            await client.release_memory_occupation()
            await client.resume_memory_occupation()
            group = asyncio.to_thread(weight_sync.create_group, "127.0.0.1", port, 0, 2, "wug", "nccl")
            init = client.init_weights_update_group("127.0.0.1", port, 1, 2, group_name="wug", backend="nccl")
            pg, _ = await asyncio.gather(group, init)
            await weight_sync.push_weights(client, pg, sorted(weights.items()), 3, group_name="wug")
            after = await client.generate(PROMPT, params)
            assert after.meta_info.weight_version == "3" and await client.get_weight_version() == 3

    asyncio.run(go())
